#!/bin/bash
# `mammoth train --model bert-tiny` with tensor and sequence parallelism (BERT's sharding
# policy: bidirectional attention, padded keys hidden): tp=2, tp=2 + split_gather and sp=2 ring
# give the single-process masked-LM loss curve and gradient norms (every rank masks the batch
# alike, engine/data/masking.h; the pooler and classifier, unused by the loss, keep no gradient
# either way). The embedded corpus's BPE vocabulary gains [MASK] as its last id.
set -euo pipefail
mammoth="$1"
mpirun="$2"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_tp_bert.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"
common=(--model bert-tiny --steps 6 --seq-len 30 --micro-batch 4 --log-every 100
  --eval-every 0 --lr 3e-3 --warmup 2 --threads 1)

"$mammoth" train "${common[@]}" --metrics "$work/single.jsonl"
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --tp 2 --metrics "$work/tp2.jsonl"
bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --tp 4 --sp-mode split_gather \
  --metrics "$work/tp4_split_gather.jsonl"
bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --sp 4 --sp-mode ring \
  --metrics "$work/sp4_ring.jsonl"

PYTHONPATH="$(dirname "$0")/../testing" "${MAMMOTH_PYTHON:-/usr/bin/python3}" - "$work" <<'PY'
import sys, curves
runs = curves.Runs(sys.argv[1])
runs.learns("single", steps=6)
# f32; 30 positions divide by neither 4 (split_gather) nor 8 (ring's zigzag chunks): padding.
for name in ["tp2", "tp4_split_gather", "sp4_ring"]:
    runs.matches(name, "single", tol=1e-4)
    runs.matches(name, "single", tol=1e-3, key="grad_norm")
print("ok")
PY
