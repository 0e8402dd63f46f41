#!/bin/bash
# `mammoth train --pp`: the step's gradient-accumulation micro-batches stream through the
# pipeline, so pp=2 with every schedule, pp=4, and pp=2 x dp=2 (ZeRO 0, 1, 2; half the
# accumulation per replica) give the single-process loss curve of the same global batch;
# pp=2 x dp=2 under ZeRO 0-3, pp=2 with tp=2 (also split_gather), with sp=2 ring, and dp=2 x pp=2 x tp=2 (ZeRO-1, 8 ranks)
# too; a checkpoint written by pp=2 resumes at pp=1, pp=4, pp=2 x dp=2 (ZeRO-1) and tp=2, one
# written by pp=2 x tp=2 at tp=2 and on one process, continuing the curve; unsupported
# combinations are clear errors.
set -euo pipefail
mammoth="$1"
mpirun="$2"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_pp.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"
common=(--steps 8 --seq-len 32 --log-every 100 --eval-every 0 --lr 3e-3 --warmup 2 --threads 1
  --micro-batch 2 --grad-accum 4)

"$mammoth" train "${common[@]}" --metrics "$work/single.jsonl"
for schedule in gpipe 1f1b interleaved zb; do
  extra=()
  [[ $schedule == interleaved ]] && extra=(--virtual-stages 2)
  bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --pp 2 --pp-schedule "$schedule" \
    "${extra[@]}" --metrics "$work/pp2_$schedule.jsonl"
done
bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --pp 4 --pp-schedule 1f1b \
  --metrics "$work/pp4_1f1b.jsonl"

# pp x dp: 4 ranks = 2 replicas of a 2-stage pipeline, each streaming 2 micro-batches.
for zero in 0 1 2 3; do
  bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --grad-accum 2 --pp 2 --pp-schedule 1f1b \
    --zero $zero --bucket-mb 0.05 --metrics "$work/pp2_dp2_zero$zero.jsonl"
done
# Checkpoints: pp=2 saves at step 4 (each stage its shard); resume at other layouts.
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --pp 2 --save-every 4 \
  --save-dir "$work/ckpt" --metrics "$work/pp2_saving.jsonl"
echo step_00000004 >"$work/ckpt/latest"
for layout in pp1 pp4 pp2_dp2; do cp -r "$work/ckpt" "$work/ckpt_$layout"; done
"$mammoth" train "${common[@]}" --save-dir "$work/ckpt_pp1" --resume \
  --metrics "$work/resumed_pp1.jsonl"
bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --pp 4 --save-dir "$work/ckpt_pp4" --resume \
  --metrics "$work/resumed_pp4.jsonl"
bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --grad-accum 2 --pp 2 --zero 1 \
  --save-dir "$work/ckpt_pp2_dp2" --resume --metrics "$work/resumed_pp2_dp2.jsonl"

# pp with tensor/sequence parallelism inside each stage, and the full dp x pp x tp hybrid.
bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --pp 2 --tp 2 --metrics "$work/pp2_tp2.jsonl"
bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --pp 2 --tp 2 --sp-mode split_gather \
  --metrics "$work/pp2_tp2_split_gather.jsonl"
bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --pp 2 --sp 2 --sp-mode ring \
  --metrics "$work/pp2_sp2_ring.jsonl"
bash "$mpirun" -np 8 "$mammoth" train "${common[@]}" --grad-accum 2 --pp 2 --tp 2 --zero 1 \
  --metrics "$work/dp2_pp2_tp2_zero1.jsonl"
# fp16 loss scaling through the pipeline: the same curve, and with an overflowing initial scale
# the same skipped steps and halvings as one process (the global norm is the found-inf flag).
for scale in 65536 1e30; do
  "$mammoth" train "${common[@]}" --amp fp16 --loss-scale $scale \
    --metrics "$work/fp16_single_$scale.jsonl"
  bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --amp fp16 --loss-scale $scale --pp 2 \
    --metrics "$work/fp16_pp2_$scale.jsonl"
done
# LLaMA's stages (untied head): pp=2, pp=2 x dp=2 under ZeRO-1, pp=2 x tp=2 (split_gather).
"$mammoth" train "${common[@]}" --model llama-tiny --metrics "$work/llama_single.jsonl"
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --model llama-tiny --pp 2 \
  --metrics "$work/llama_pp2.jsonl"
bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --model llama-tiny --grad-accum 2 --pp 2 \
  --zero 1 --metrics "$work/llama_pp2_dp2_zero1.jsonl"
bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --model llama-tiny --pp 2 --tp 2 \
  --sp-mode split_gather --metrics "$work/llama_pp2_tp2.jsonl"
# A pp=2 x tp=2 checkpoint resumes at tp=2 alone and on one process; the pp=2 one at tp=2.
bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" --pp 2 --tp 2 --save-every 4 \
  --save-dir "$work/ckpt_pptp" --metrics "$work/pp2_tp2_saving.jsonl"
echo step_00000004 >"$work/ckpt_pptp/latest"
cp -r "$work/ckpt_pptp" "$work/ckpt_pptp_np1"
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --tp 2 --save-dir "$work/ckpt_pptp" \
  --resume --metrics "$work/resumed_pptp_tp2.jsonl"
"$mammoth" train "${common[@]}" --save-dir "$work/ckpt_pptp_np1" --resume \
  --metrics "$work/resumed_pptp_np1.jsonl"
cp -r "$work/ckpt" "$work/ckpt_pp2_to_tp2"
echo step_00000004 >"$work/ckpt_pp2_to_tp2/latest"
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --tp 2 --save-dir "$work/ckpt_pp2_to_tp2" \
  --resume --metrics "$work/resumed_pp2_tp2.jsonl"

if "$mammoth" train "${common[@]}" --pp 2 2>"$work/err"; then
  echo "expected an error for --pp 2 on one process"; exit 1
fi
grep -q "\-\-pp 2" "$work/err"

PYTHONPATH="$(dirname "$0")/../testing" "${MAMMOTH_PYTHON:-/usr/bin/python3}" - "$work" <<'PY'
import sys, curves
runs = curves.Runs(sys.argv[1])
runs.learns("single", steps=8)
for name in ["pp2_gpipe", "pp2_1f1b", "pp2_interleaved", "pp2_zb", "pp4_1f1b",
             "pp2_dp2_zero0", "pp2_dp2_zero1", "pp2_dp2_zero2", "pp2_dp2_zero3", "pp2_tp2",
             "pp2_tp2_split_gather", "pp2_sp2_ring", "dp2_pp2_tp2_zero1"]:
    runs.matches(name, "single", tol=1e-5)
for scale in ["65536", "1e30"]:
    one, pp2 = runs.rows(f"fp16_single_{scale}"), runs.rows(f"fp16_pp2_{scale}")
    assert len(one) == len(pp2) == 8
    assert [(r["skipped_steps"], r["loss_scale"]) for r in one] == \
        [(r["skipped_steps"], r["loss_scale"]) for r in pp2], (scale, one, pp2)
    print(f"fp16 pp2, initial scale {scale}: skipped {pp2[-1]['skipped_steps']} steps as one "
          f"process did")
    runs.matches(f"fp16_pp2_{scale}", f"fp16_single_{scale}", tol=1e-4)
assert runs.rows("fp16_pp2_1e30")[-1]["skipped_steps"] > 0  # the overflow really happened
for name in ["llama_pp2", "llama_pp2_dp2_zero1", "llama_pp2_tp2"]:
    runs.matches(name, "llama_single", tol=1e-5)
for name in ["resumed_pp1", "resumed_pp4", "resumed_pp2_dp2", "resumed_pptp_tp2",
             "resumed_pptp_np1", "resumed_pp2_tp2"]:
    runs.matches(name, "single", tol=1e-5, steps=[5, 6, 7, 8])
print("ok")
PY
