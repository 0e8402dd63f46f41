#!/bin/bash
# LoRA under tensor parallelism: `mammoth train --lora-* --tp 2` on transformers-written GPT-2
# (fused c_attn, Conv1D) and LLaMA (GQA: 4 query, 2 KV heads) directories gives one process's
# loss curve and adapter (column-parallel targets with B split like W's rows, row-parallel ones
# with A split like W's columns); its PEFT directory (written whole from the sharded checkpoint)
# loads in HF peft with the logits of `mammoth eval --adapter` (lora_peft_check.py); a tp 2
# LoRA checkpoint resumes on one process and continues the curve; --lora-dropout under --tp is
# refused by name; split_gather, Ulysses, ring (sp 2), pp 2, pp 2 x tp 2 and dp 2 x tp 2 give
# the same curve (and the pipeline runs the same adapter directory).
#   train_lora_tp_test.sh PYTHON_SH CHECK_PY MAMMOTH LORA_LOGITS MPIRUN
set -euo pipefail
python_sh="$1"
check="$2"
mammoth="$3"
logits="$4"
mpirun="$5"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_lora_tp.XXXXXX")"
trap 'rm -rf "$work"' EXIT
for family in gpt2 llama; do
  d="$work/$family"
  mkdir -p "$d"
  case "$family" in
    gpt2) targets=c_attn,c_proj,c_fc ;;
    llama) targets=q_proj,k_proj,v_proj,o_proj,up_proj,down_proj ;;
  esac
  "$python_sh" "$check" make "$family" "$d"
  common=(--model "$d/base" --data "$d/data.bin" --lora-rank 4 --lora-alpha 8
    --lora-targets "$targets" --steps 6 --lr 1e-2 --warmup 1 --seq-len 16 --micro-batch 4
    --eval-every 0 --log-every 100 --threads 1)
  "$mammoth" train "${common[@]}" --save-dir "$d/single" --metrics "$d/single.jsonl"
  bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --tp 2 --save-dir "$d/run" \
    --metrics "$d/tp2.jsonl" --save-every 3 2>&1 | tee "$d/tp2.log"
  grep -q "the frozen base's tp shards" "$d/tp2.log"
  # Sequence parallelism: Megatron SP on the tp group, Ulysses and ring attention on sp.
  bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --tp 2 --sp-mode split_gather \
    --metrics "$d/tp2_split_gather.jsonl"
  for mode in ulysses ring; do
    bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --sp 2 --sp-mode $mode \
      --metrics "$d/sp2_$mode.jsonl"
  done
  # Pipeline: each stage trains (and checkpoints) its layers' adapters; also pp 2 x tp 2.
  bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --pp 2 --save-dir "$d/pp2" \
    --metrics "$d/pp2.jsonl"
  bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --pp 2 --tp 2 --save-dir "$d/pp2_tp2" \
    --metrics "$d/pp2_tp2.jsonl"
  # dp 2 x tp 2, ZeRO-1: the adapters' tp sums run in dp's gradient buckets.
  bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --micro-batch 2 --dp 2 --tp 2 --zero 1 \
    --bucket-mb 0.001 --metrics "$d/dp2_tp2.jsonl"
  # The tp 2 checkpoint of step 3, continued by one process.
  cp -r "$d/run" "$d/resume"
  echo step_00000003 >"$d/resume/latest"
  "$mammoth" train "${common[@]}" --save-dir "$d/resume" --resume --metrics "$d/resumed.jsonl"
  "$mammoth" eval --model "$d/base" --adapter "$d/run/adapter" --tokens "$d/data.bin" \
    --seq-len 16 --batch 4 --max-sequences 4 --threads 1 >"$d/eval.json"
  "$logits" "$d/base" "$d/run/adapter" "$d/ids.safetensors" "$d/ours.safetensors"
  "$mammoth" ckpt export "$d/run" --merge-lora --out "$d/merged"
  "$python_sh" "$check" check "$family" "$d"
  "$python_sh" - "$d" "$(dirname "$0")/../testing" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
import curves
from safetensors.torch import load_file
d = sys.argv[1]
runs = curves.Runs(d)
runs.learns("single", steps=6, drop=0.004)  # 6 steps; LLaMA falls ~0.5%
runs.matches("tp2", "single", tol=1e-6)
runs.matches("resumed", "single", tol=1e-6, steps=[4, 5, 6])
for run in ["tp2_split_gather", "sp2_ulysses", "sp2_ring", "pp2", "pp2_tp2"]:
    runs.matches(run, "single", tol=1e-6)
runs.matches("dp2_tp2", "single", tol=1e-6)  # dp averages two half-batches: not bitwise
ref = load_file(f"{d}/single/adapter/adapter_model.safetensors")
for run in ["run", "resume", "pp2", "pp2_tp2"]:
    got = load_file(f"{d}/{run}/adapter/adapter_model.safetensors")
    assert sorted(got) == sorted(ref), (run, sorted(got), sorted(ref))
    for k, t in ref.items():
        assert got[k].shape == t.shape, (k, got[k].shape, t.shape)
    worst = max(((got[k] - t).abs().max() / t.abs().max().clamp_min(1e-30)).item()
                for k, t in ref.items())
    print(f"{run}: adapter vs one process {worst:.2e}")
    assert worst < 1e-5, (run, worst)  # measured 1.6e-6 .. 3.5e-6 (avx512, avx2)
PY
done
d="$work/gpt2"
if bash "$mpirun" -np 2 "$mammoth" train --model "$d/base" --data "$d/data.bin" --lora-rank 4 \
  --lora-dropout 0.1 --tp 2 --steps 1 --seq-len 16 --threads 1 2>"$work/err"; then
  echo "--lora-dropout with --tp was accepted"
  exit 1
fi
grep -qF -- "--lora-dropout 0.1 with --tp / --sp is not supported" "$work/err" || { cat "$work/err"; exit 1; }
echo "train_lora_tp_test passed"
