#!/bin/bash
# `mammoth bench offload` on gpt2-tiny: states on host (no device budget) and everything on NVMe
# under a device budget of 1/8 of the model state, each against the in-memory run in the same
# process; losses identical (the exit code), NVMe traffic and rate reported beside `bench io`'s
# fio figures on the same directory.
set -euo pipefail
mammoth="$1"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/bench_offload.XXXXXX")"
trap 'rm -rf "$work"' EXIT
"$mammoth" bench offload --model gpt2-tiny --steps 3 --rounds 1 --threads 1 \
  --modes host@0,all_nvme@0.125 --io-size 16M --nvme-dir "$work" --json "$work/rows.json" \
  >"$work/out.txt" 2>"$work/err.txt" || { cat "$work/out.txt" "$work/err.txt"; exit 1; }
cat "$work/out.txt"
grep -q "fio on the same directory, this run: sequential read" "$work/out.txt"
"${MAMMOTH_PYTHON:-/usr/bin/python3}" - "$work/rows.json" <<'PY'
import json, sys
rows = {r["name"]: r for r in json.load(open(sys.argv[1]))}
assert sorted(rows) == ["offload_all_nvme@0.125", "offload_host@0"], sorted(rows)
host, nvme = rows["offload_host@0"], rows["offload_all_nvme@0.125"]
assert host["identical"] and nvme["identical"], rows
assert host["device_mem"] == 0 and host["nvme_bytes_per_step"] == 0, host
# 1/8 of parameters + gradients + AdamW states; everything moves through NVMe each step.
assert nvme["device_mem"] == int(nvme["model_state"] * 0.125), nvme
assert nvme["nvme_bytes_per_step"] > nvme["model_state"], nvme
assert nvme["nvme_gb_per_s"] > 0 and 0 <= nvme["stall_percent"] <= 100, nvme
# Per timed step: the optimizer reads and writes back every state chunk, so both directions
# move at least the AdamW states (half the model state); the fio comparison is present.
assert nvme["nvme_read_bytes_per_step"] >= nvme["model_state"] / 2, nvme
assert nvme["nvme_write_bytes_per_step"] >= nvme["model_state"] / 2, nvme
assert nvme["nvme_of_fio"] is not None and nvme["nvme_of_fio"] > 0, nvme
print("ok")
PY

# Without the in-memory run (what a model beyond the machine's RAM gets): the row checks that
# the loss falls instead, and reports no ratio (here with 2 micro-batches of 4 per step).
"$mammoth" bench offload --model gpt2-tiny --steps 4 --rounds 1 --threads 1 --no-anchor \
  --micro-batch 4 --grad-accum 2 \
  --modes all_nvme@0.125 --host-mem 2M --io-size 16M --nvme-dir "$work" --json "$work/alone.json" \
  >"$work/alone.txt" 2>"$work/alone_err.txt" || { cat "$work/alone.txt" "$work/alone_err.txt"; exit 1; }
cat "$work/alone.txt"
"${MAMMOTH_PYTHON:-/usr/bin/python3}" - "$work/alone.json" <<'PY'
import json, sys
(row,) = json.load(open(sys.argv[1]))
assert row["anchor"] is None and row["ratio"] is None and "identical" not in row, row
assert row["loss_falls"] and row["loss_last"] < row["loss_first"], row
assert row["host_mem"] == 2 * 1048576, row
assert row["shape"] == "gpt2-tiny 4x2x64", row
print("ok")
PY
