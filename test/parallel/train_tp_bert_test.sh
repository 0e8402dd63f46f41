#!/bin/bash
# `mammoth train --model bert-tiny` with tensor and sequence parallelism (BERT's sharding
# policy: bidirectional attention, padded keys hidden): tp=2, tp=2 + split_gather and sp=2 ring
# give the single-process loss curve and gradient norms (the pooler and classifier, unused by
# the loss, keep no gradient either way).
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

"${MAMMOTH_PYTHON:-/usr/bin/python3}" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def column(name, key):
    return [r[key] for r in map(json.loads, open(f"{work}/{name}.jsonl"))]
ref, ref_norm = column("single", "loss"), column("single", "grad_norm")
assert len(ref) == 6 and ref[-1] < ref[0] - 0.3, ref
# f32; 30 positions divide by neither 4 (split_gather) nor 8 (ring's zigzag chunks): padding.
for name in ["tp2", "tp4_split_gather", "sp4_ring"]:
    got, norm = column(name, "loss"), column(name, "grad_norm")
    worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    worst_norm = max(abs(a - b) / abs(b) for a, b in zip(norm, ref_norm))
    print(f"{name}: largest relative loss difference {worst:.2e}, grad norm {worst_norm:.2e}")
    assert len(got) == 6 and worst < 1e-4, (name, worst)
    assert len(norm) == 6 and worst_norm < 1e-3, (name, worst_norm)
print("ok")
PY
