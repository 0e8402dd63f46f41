#!/bin/bash
# plan/memory_model against the allocator: every cell runs `mammoth train` for 2 steps, every
# rank prints "[train] rank R memory: predicted peak P bytes, measured peak M bytes (error E%)"
# (tools/cmd_train.cc; the measured peak is the CPU allocator's over the first step, which
# already holds the eagerly made AdamW states and dp buckets), and every rank's prediction must
# be within 10% of its measurement. One line per cell: the worst rank's numbers.
#
# Usage: memory_train_test.sh MAMMOTH MPIRUN_SH [CELL_FILTER_REGEX]
set -euo pipefail
mammoth="$1"
mpirun="$2"
filter="${3:-${MEMORY_CELLS:-.}}"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/memory_train.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache once
mkdir -p "$work/nvme"
common=(--steps 2 --seq-len 32 --log-every 100 --eval-every 0 --warmup 1 --threads 1)
tolerance=10

failed=0
cells=0
worst=0
summary="$work/summary"
: >"$summary"
# cell NAME NP ARGS...: runs one configuration and checks every rank's line.
cell() {
  local name="$1" np="$2"
  shift 2
  [[ "$name" =~ $filter ]] || return 0
  local log="$work/$name.log"
  local rc=0
  if [[ "$np" == 1 ]]; then
    "$mammoth" train "${common[@]}" "$@" >"$log" 2>&1 || rc=$?
  else
    bash "$mpirun" -np "$np" "$mammoth" train "${common[@]}" "$@" >"$log" 2>&1 || rc=$?
  fi
  cells=$((cells + 1))
  if [[ $rc != 0 ]]; then
    echo "cell $name: train failed (rc $rc)"
    tail -20 "$log"
    failed=$((failed + 1))
    return 0
  fi
  local lines
  # Other ranks' output may share the line (mpirun forwards each rank's stderr as it comes).
  lines="$(grep -aoE '\[train\] rank [0-9]+ memory: predicted peak [0-9]+ bytes, measured peak [0-9]+ bytes' "$log" || true)"
  local got
  got="$(printf '%s\n' "$lines" | grep -c . || true)"
  if [[ "$got" != "$np" ]]; then
    echo "cell $name: expected $np memory lines, got $got"
    failed=$((failed + 1))
    return 0
  fi
  # The rank with the largest |error|.
  local row
  row="$(printf '%s\n' "$lines" | awk '{
      r = $3; p = $7; m = $11; e = (p - m) * 100.0 / m; a = e < 0 ? -e : e;
      if (NR == 1 || a > best) { best = a; out = sprintf("%s %s %s %.2f %.2f", r, p, m, e, a) }
    } END { print out }')"
  read -r rank predicted measured error abs <<<"$row"
  local verdict=ok
  if awk -v a="$abs" -v t="$tolerance" 'BEGIN { exit !(a > t) }'; then
    verdict=FAIL
    failed=$((failed + 1))
  fi
  printf '%-34s np %d  rank %s  predicted %10d  measured %10d  error %+6.2f%%  %s\n' \
    "$name" "$np" "$rank" "$predicted" "$measured" "$error" "$verdict" | tee -a "$summary"
  if awk -v a="$abs" -v w="$worst" 'BEGIN { exit !(a > w) }'; then worst="$abs"; fi
}

g=(--model gpt2-tiny)
l=(--model llama-tiny)
b=(--model bert-tiny)
ac=(--activation-checkpointing)

# One process: micro-batch, recompute, accumulation, offload.
cell gpt2_mb1 1 "${g[@]}" --micro-batch 1
cell gpt2_mb4 1 "${g[@]}" --micro-batch 4
cell gpt2_mb2_recompute 1 "${g[@]}" --micro-batch 2 "${ac[@]}"
cell gpt2_mb4_recompute 1 "${g[@]}" --micro-batch 4 "${ac[@]}"
cell gpt2_mb2_accum2 1 "${g[@]}" --micro-batch 2 --grad-accum 2
cell gpt2_mb4_bf16 1 "${g[@]}" --micro-batch 4 --amp bf16
cell llama_mb2 1 "${l[@]}" --micro-batch 2
cell llama_mb4_recompute 1 "${l[@]}" --micro-batch 4 "${ac[@]}"
cell bert_mb2 1 "${b[@]}" --micro-batch 2
cell bert_mb4 1 "${b[@]}" --micro-batch 4
cell bert_mb4_recompute 1 "${b[@]}" --micro-batch 4 "${ac[@]}"
cell gpt2_mb4_recompute_first2 1 "${g[@]}" --micro-batch 4 --recompute-blocks 2
cell gpt2_mb2_offload_host 1 "${g[@]}" --micro-batch 2 --offload host
cell gpt2_mb3_offload_nvme 1 "${g[@]}" --micro-batch 3 --offload nvme --nvme-dir "$work/nvme"
cell llama_mb4_offload_host_recompute 1 "${l[@]}" --micro-batch 4 --offload host "${ac[@]}"
cell bert_mb2_offload_host 1 "${b[@]}" --micro-batch 2 --offload host
# Paged: parameters, gradients (and states) through a device budget smaller than the model.
cell gpt2_mb2_offload_host_paged 1 "${g[@]}" --micro-batch 2 --offload host --device-mem 4M \
  --chunk-mb 1
cell llama_mb2_offload_none_paged 1 "${l[@]}" --micro-batch 2 --device-mem 2M --chunk-mb 0.25

# Two processes: data parallelism under every ZeRO stage, offload over dp, tp, sp, pp.
cell gpt2_dp2_zero0 2 "${g[@]}" --micro-batch 2 --zero 0
cell gpt2_dp2_zero1 2 "${g[@]}" --micro-batch 2 --zero 1
cell gpt2_dp2_zero2 2 "${g[@]}" --micro-batch 2 --zero 2
cell gpt2_dp2_zero2_fp16 2 "${g[@]}" --micro-batch 2 --zero 2 --amp fp16
cell gpt2_dp2_zero3 2 "${g[@]}" --micro-batch 2 --zero 3
cell gpt2_dp2_zero2_recompute 2 "${g[@]}" --micro-batch 4 --zero 2 "${ac[@]}"
cell gpt2_dp2_zero1_bucket 2 "${g[@]}" --micro-batch 2 --zero 1 --bucket-mb 0.5
cell llama_dp2_zero1_recompute 2 "${l[@]}" --micro-batch 4 --zero 1 "${ac[@]}"
cell llama_dp2_zero3 2 "${l[@]}" --micro-batch 2 --zero 3
cell bert_dp2_zero2 2 "${b[@]}" --micro-batch 2 --zero 2
cell bert_dp2_zero0_mb3 2 "${b[@]}" --micro-batch 3 --zero 0
cell gpt2_dp2_offload_host 2 "${g[@]}" --micro-batch 2 --offload host --chunk-mb 1
cell gpt2_dp2_offload_nvme 2 "${g[@]}" --micro-batch 2 --offload nvme --nvme-dir "$work/nvme" \
  --chunk-mb 1
cell llama_dp2_offload_host 2 "${l[@]}" --micro-batch 2 --offload host --chunk-mb 1
cell gpt2_tp2 2 "${g[@]}" --micro-batch 2 --tp 2
cell gpt2_tp2_split_gather 2 "${g[@]}" --micro-batch 4 --tp 2 --sp-mode split_gather
cell gpt2_tp2_recompute 2 "${g[@]}" --micro-batch 2 --tp 2 "${ac[@]}"
cell llama_tp2 2 "${l[@]}" --micro-batch 2 --tp 2
cell bert_tp2 2 "${b[@]}" --micro-batch 2 --tp 2
cell gpt2_sp2_ulysses 2 "${g[@]}" --micro-batch 2 --sp 2 --sp-mode ulysses
cell gpt2_sp2_ring 2 "${g[@]}" --micro-batch 2 --sp 2 --sp-mode ring
cell llama_sp2_ulysses 2 "${l[@]}" --micro-batch 2 --sp 2 --sp-mode ulysses
# Longer sequences, so that the activations (not the gradients) set the peak.
cell gpt2_sp2_ulysses_seq64 2 "${g[@]}" --micro-batch 4 --seq-len 64 --sp 2 --sp-mode ulysses
cell gpt2_sp2_ring_seq64 2 "${g[@]}" --micro-batch 4 --seq-len 64 --sp 2 --sp-mode ring
cell bert_sp2_ring_seq64 2 "${b[@]}" --micro-batch 4 --seq-len 64 --sp 2 --sp-mode ring
cell llama_sp2_ring_seq64 2 "${l[@]}" --micro-batch 4 --seq-len 64 --sp 2 --sp-mode ring
cell gpt2_pp2_1f1b 2 "${g[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --pp-schedule 1f1b
cell gpt2_pp2_gpipe 2 "${g[@]}" --micro-batch 2 --grad-accum 4 --pp 2 --pp-schedule gpipe
cell llama_pp2_1f1b_recompute 2 "${l[@]}" --micro-batch 1 --grad-accum 4 --pp 2 "${ac[@]}"
cell bert_pp2_1f1b 2 "${b[@]}" --micro-batch 2 --grad-accum 4 --pp 2
# Mixture of experts: the attention splits over tp, the experts stay whole on every rank.
cell mixtral_mb2 1 --model mixtral-tiny --micro-batch 2
cell mixtral_tp2 2 --model mixtral-tiny --micro-batch 2 --tp 2

# Four processes: wider dp, dp x tp, dp x pp, pp 4, tp 4, pp x tp.
cell gpt2_dp4_zero1 4 "${g[@]}" --micro-batch 2 --zero 1
cell gpt2_dp4_zero3 4 "${g[@]}" --micro-batch 2 --zero 3
cell gpt2_dp2_tp2_zero1 4 "${g[@]}" --micro-batch 2 --tp 2 --zero 1
cell gpt2_dp2_pp2_zero1 4 "${g[@]}" --micro-batch 2 --grad-accum 2 --pp 2 --zero 1
cell gpt2_pp4_1f1b 4 "${g[@]}" --micro-batch 1 --grad-accum 4 --pp 4
cell gpt2_pp4_1f1b_recompute_first1 4 "${g[@]}" --micro-batch 2 --grad-accum 4 --pp 4 \
  --recompute-blocks 1
cell gpt2_tp4 4 "${g[@]}" --micro-batch 2 --tp 4
cell gpt2_pp2_tp2 4 "${g[@]}" --micro-batch 2 --grad-accum 2 --pp 2 --tp 2
cell llama_dp2_tp2_zero2 4 "${l[@]}" --micro-batch 2 --tp 2 --zero 2
cell bert_dp4_zero0_mb1 4 "${b[@]}" --micro-batch 1 --zero 0
cell gpt2_dp4_offload_host 4 "${g[@]}" --micro-batch 1 --offload host --chunk-mb 1
# Experts under ZeRO, with and without --ep: a rank holds 1/ep of them and reduces them over
# dp / ep; ZeRO-3 keeps every local expert's bucket gathered.
cell mixtral_dp2_zero3 2 --model mixtral-tiny --micro-batch 2 --zero 3
cell mixtral_dp4_ep2_zero1 4 --model mixtral-tiny --micro-batch 2 --ep 2 --zero 1
cell mixtral_dp4_ep2_zero2 4 --model mixtral-tiny --micro-batch 2 --ep 2 --zero 2
cell mixtral_dp4_ep2_zero3 4 --model mixtral-tiny --micro-batch 2 --ep 2 --zero 3
cell mixtral_dp4_ep4_zero2 4 --model mixtral-tiny --micro-batch 2 --ep 4 --zero 2

if [[ -n "$(cat "$summary")" ]]; then
  echo "memory model: $cells cells, $failed failed, worst |error| ${worst}% (tolerance ${tolerance}%)"
fi
[[ $failed == 0 ]]
