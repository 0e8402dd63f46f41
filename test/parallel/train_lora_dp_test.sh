#!/bin/bash
# LoRA under data parallelism: `mammoth train --lora-*` on 2 ranks (ZeRO 0-3) gives the loss
# curve and the adapter of one process; a LoRA checkpoint written by 2 ranks (sharded) resumes
# on 1 and continues the curve; a ZeRO-3 run (no rank holds the adapters whole) writes its
# adapter directory from its checkpoint; offload with LoRA is refused by name.
set -euo pipefail
mammoth="$1"
mpirun="$2"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_lora_dp.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache
common=(--steps 6 --seq-len 32 --log-every 100 --eval-every 0 --lr 5e-3 --warmup 1 --threads 1
  --lora-rank 4 --lora-alpha 16 --lora-targets c_attn,c_proj,c_fc)

"$mammoth" train "${common[@]}" --micro-batch 4 --metrics "$work/single.jsonl" \
  --save-dir "$work/single"
for zero in 0 1 2 3; do
  bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --micro-batch 2 --zero $zero \
    --bucket-mb 0.01 --metrics "$work/dp2_zero$zero.jsonl" --save-dir "$work/dp2_zero$zero"
done
# A sharded LoRA checkpoint at step 3 (2 ranks, ZeRO-2), continued by one process.
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --micro-batch 2 --zero 2 --bucket-mb 0.01 \
  --save-every 3 --save-dir "$work/ckpt" --metrics "$work/first.jsonl"
echo step_00000003 >"$work/ckpt/latest"
"$mammoth" train "${common[@]}" --micro-batch 4 --save-dir "$work/ckpt" --resume \
  --metrics "$work/resumed.jsonl"

for refused in "--offload host"; do
  # shellcheck disable=SC2086
  if bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --steps 1 --micro-batch 2 $refused \
    2>"$work/err"; then
    echo "LoRA with $refused was accepted"
    exit 1
  fi
  grep -q "\[plan\] LoRA .* is not supported" "$work/err" || { cat "$work/err"; exit 1; }
done

PYTHONPATH="$(dirname "$0")/../testing" "${MAMMOTH_PYTHON:-/usr/bin/python3}" - "$work" <<'PY'
import json, sys, curves
import torch
from safetensors.torch import load_file
work = sys.argv[1]
runs = curves.Runs(work)
runs.learns("single", steps=6, drop=0.2)
for name in ["dp2_zero0", "dp2_zero1", "dp2_zero2", "dp2_zero3", "first"]:
    runs.matches(name, "single", tol=2e-5, steps=range(1, 7))
runs.matches("resumed", "single", tol=2e-5, steps=[4, 5, 6])
# The adapters the runs wrote (PEFT files, rank 0's) agree with one process's.
ref = load_file(f"{work}/single/adapter/adapter_model.safetensors")
assert len(ref) == 4 * 4 * 2, sorted(ref)  # 4 layers x (c_attn, attn c_proj, c_fc, mlp c_proj) x (A, B)
for name in ["dp2_zero0", "dp2_zero1", "dp2_zero2", "dp2_zero3", "ckpt"]:
    got = load_file(f"{work}/{name}/adapter/adapter_model.safetensors")
    assert sorted(got) == sorted(ref), (name, sorted(got))
    worst = max(((got[k] - t).abs().max() / t.abs().max().clamp_min(1e-30)).item()
                for k, t in ref.items())
    print(f"{name}: adapter vs one process {worst:.2e}")
    assert worst < 1e-4, (name, worst)
# The sharded checkpoint's index holds the adapters and their AdamW states only.
index = json.load(open(f"{work}/ckpt/step_00000003/index.json"))
names = sorted(index["tensors"])
assert names and all(".lora_A." in n or ".lora_B." in n for n in names), names[:5]
assert "h.0.attn.c_attn.lora_A.weight.exp_avg" in names, names[:5]
print("train_lora_dp_test passed")
PY
