#!/bin/bash
# plan/offload_traffic's dry run of the chunk manager against the real one: every cell runs
# `mammoth train` for 4 steps with --metrics; rank 0 prints "[train] rank 0 predicted chunk
# moves per step (dry run ...): ... total bytes device_in D device_out O nvme_read R
# nvme_write W" (tools/cmd_train.cc), and the metrics' offload counters (cumulative per step)
# give the bytes the last step really moved. Each of the four figures must be within 12% of
# its measurement (or of 5% of the step's total, for a figure much smaller than the rest).
#
# Usage: offload_traffic_test.sh MAMMOTH MPIRUN_SH
set -euo pipefail
mammoth="$1"
mpirun="$2"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/offload_traffic.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache once
mkdir -p "$work/nvme"
common=(--steps 4 --seq-len 32 --log-every 100 --eval-every 0 --warmup 1 --threads 1
  --chunk-mb 0.0625)

failed=0
cells=0
paged=0
cell() {
  local name="$1" np="$2"
  shift 2
  local log="$work/$name.log" metrics="$work/$name.jsonl" rc=0
  rm -f "$metrics"
  if [[ "$np" == 1 ]]; then
    "$mammoth" train "${common[@]}" --metrics "$metrics" "$@" >"$log" 2>&1 || rc=$?
  else
    bash "$mpirun" -np "$np" "$mammoth" train "${common[@]}" --metrics "$metrics" "$@" \
      >"$log" 2>&1 || rc=$?
  fi
  cells=$((cells + 1))
  if [[ $rc != 0 ]]; then
    echo "cell $name: train failed (rc $rc)"
    tail -20 "$log"
    failed=$((failed + 1))
    return 0
  fi
  local out verdict=ok
  if ! out="$(python3 - "$log" "$metrics" <<'PY'
import json, re, sys
log = open(sys.argv[1], errors="replace").read()
m = re.search(r"\[train\] rank 0 predicted chunk moves per step .*?total bytes device_in (\d+) "
              r"device_out (\d+) nvme_read (\d+) nvme_write (\d+)", log)
if not m:
    print("no prediction line for rank 0")
    sys.exit(1)
predicted = [int(x) for x in m.groups()]
steps = [json.loads(line)["offload"] for line in open(sys.argv[2])]
if len(steps) < 2:
    print("fewer than 2 metrics lines")
    sys.exit(1)
a, b = steps[-2], steps[-1]
def d(tier, key):
    return b[tier][key] - a[tier][key]
measured = [d("device", "bytes_in"), d("device", "bytes_out"), d("nvme", "bytes_out"),
            d("nvme", "bytes_in")]
total = sum(measured)
bad = [i for i in range(4)
       if abs(predicted[i] - measured[i]) > 0.12 * max(measured[i], 0.05 * total)]
names = ["device_in", "device_out", "nvme_read", "nvme_write"]
print("  ".join(f"{n} {p}/{q}" for n, p, q in zip(names, predicted, measured)),
      "(predicted/measured)")
print("PAGED" if total > 0 else "STILL")
sys.exit(1 if bad else 0)
PY
)"; then
    verdict=FAIL
    failed=$((failed + 1))
  fi
  if grep -q PAGED <<<"$out"; then paged=$((paged + 1)); fi
  printf '%-30s np %d  %s  %s\n' "$name" "$np" "$(head -1 <<<"$out")" "$verdict"
}

g=(--model gpt2-tiny)
l=(--model llama-tiny)
# Parameters and gradients paged through a device budget (gpt2-tiny's token table spans 6
# chunks at 64 KiB), with accumulation (8 micro-batches: the dry run extrapolates beyond 4),
# with the states on the host, on NVMe through 512 KiB of host staging, and everything homed on
# NVMe; over dp (chunk ownership, averages, broadcasts); and no moves at all where everything
# has a slot.
cell gpt2_paged 1 "${g[@]}" --device-mem 512K
cell llama_paged 1 "${l[@]}" --device-mem 512K
cell gpt2_paged_accum8 1 "${g[@]}" --device-mem 512K --micro-batch 1 --grad-accum 8
cell gpt2_paged_states_host 1 "${g[@]}" --device-mem 512K --offload host
cell gpt2_states_nvme 1 "${g[@]}" --offload nvme --nvme-dir "$work/nvme" --host-mem 512K
cell gpt2_params_nvme 1 "${g[@]}" --offload-params nvme --nvme-dir "$work/nvme" --device-mem 1M
cell gpt2_dp2_paged 2 "${g[@]}" --dp 2 --device-mem 1500K
cell gpt2_dp2_paged_states_host 2 "${g[@]}" --dp 2 --offload host --device-mem 900K
cell gpt2_pp2_params_host 2 "${g[@]}" --pp 2 --offload-params host --micro-batch 4 --grad-accum 2

echo "$cells cells, $paged with chunk moves, $failed failed"
[[ $failed == 0 && $cells == 9 && $paged -ge 7 ]]
