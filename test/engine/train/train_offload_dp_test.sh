#!/bin/bash
# `mammoth train --dp 2 --offload ...` (engine/offload's own data parallelism over chunks,
# ZeRO-Offload style): the loss curve and the final parameters and AdamW states are bitwise
# those of dp 2 without offload (the same averaged gradients; host tier, and NVMe tier under a
# device budget that pages), fp16 skips the same steps, each rank holds about half the AdamW
# state bytes, a dp2+offload checkpoint (each chunk's owner writes it) resumes at dp 2 with
# offload, at dp 4 with offload, at dp 2 without offload (ZeRO-1), on 1 process without offload
# and on 1 process with offload, dp 2's plain checkpoint resumes under dp 2 + NVMe offload, all
# continuing the curve;
# --device-mem auto:SIZE matches too, and combinations it does not support are clear errors.
set -euo pipefail
mammoth="$1"
mpirun="$2"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_offload_dp.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache
mkdir -p "$work/nvme"
common=(--steps 10 --seq-len 32 --micro-batch 4 --log-every 100 --eval-every 0 --lr 3e-3
  --warmup 2 --threads 1)
chunks=(--chunk-mb 0.25)  # gpt2-tiny in 14 chunks: 7 per rank

bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --metrics "$work/dp2.jsonl" \
  --save-every 5 --save-dir "$work/ck_dp2"
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" "${chunks[@]}" --offload host \
  --metrics "$work/dp2_host.jsonl" --save-every 5 --save-dir "$work/ck_host" 2>"$work/host.log"
cat "$work/host.log"
# Parameters and gradients paged under a device budget (~1/4 of the parameters + gradients),
# AdamW states on NVMe.
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" "${chunks[@]}" --offload nvme \
  --nvme-dir "$work/nvme" --device-mem 2M --metrics "$work/dp2_nvme.jsonl"
# Gradient accumulation: chunks accumulate locally, the last micro-batch reduces them.
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --micro-batch 2 --grad-accum 2 \
  --metrics "$work/dp2_accum.jsonl"
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" "${chunks[@]}" --micro-batch 2 \
  --grad-accum 2 --offload host --metrics "$work/dp2_accum_host.jsonl"
# fp16: an overflow on any rank skips the step on every rank.
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --amp fp16 --loss-scale 1.6e7 \
  --metrics "$work/dp2_fp16.jsonl"
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" "${chunks[@]}" --amp fp16 \
  --loss-scale 1.6e7 --offload host --metrics "$work/dp2_fp16_host.jsonl"
# --device-mem auto:SIZE: the first step's traced peak sets the chunks' budget (one process and
# dp 2, which must still match bitwise).
"$mammoth" train "${common[@]}" --micro-batch 8 --metrics "$work/np1.jsonl"
"$mammoth" train "${common[@]}" "${chunks[@]}" --micro-batch 8 --device-mem auto:20M \
  --metrics "$work/np1_auto.jsonl" 2>"$work/auto.log"
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" "${chunks[@]}" --offload host \
  --device-mem auto:16M --metrics "$work/dp2_auto.jsonl"
# One process with offload: the full AdamW state on its rank.
"$mammoth" train "${common[@]}" "${chunks[@]}" --micro-batch 8 --offload host \
  --metrics "$work/np1_host.jsonl"

# Resume the dp2+offload checkpoint of step 5: at dp 2 with offload, on one process without
# offload and on one process with offload.
echo step_00000005 >"$work/ck_host/latest"
cp -r "$work/ck_host" "$work/ck_host_np1"
cp -r "$work/ck_host" "$work/ck_host_np1_off"
cp -r "$work/ck_host" "$work/ck_host_zero1"
cp -r "$work/ck_host" "$work/ck_host_dp4"
cp -r "$work/ck_host/step_00000010" "$work/host_step10"
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" "${chunks[@]}" --offload host \
  --save-dir "$work/ck_host" --resume --metrics "$work/resumed_dp2_host.jsonl"
"$mammoth" train "${common[@]}" --micro-batch 8 --save-dir "$work/ck_host_np1" --resume \
  --metrics "$work/resumed_np1.jsonl"
"$mammoth" train "${common[@]}" "${chunks[@]}" --micro-batch 8 --offload host \
  --save-dir "$work/ck_host_np1_off" --resume --metrics "$work/resumed_np1_host.jsonl"

# The same dp2+offload checkpoint at dp 2 without offload (ZeRO-1), and dp 2's plain checkpoint
# (ZeRO-0: rank 0 wrote it) into dp 2 + offload with the states on NVMe.
cp -r "$work/ck_dp2" "$work/ck_dp2_to_nvme"
echo step_00000005 >"$work/ck_dp2_to_nvme/latest"
# dp 4 with offload: the chunks' owners change (chunk k on rank k % 4).
bash "$mpirun" -np 4 "$mammoth" train "${common[@]}" "${chunks[@]}" --micro-batch 2 \
  --offload host --save-dir "$work/ck_host_dp4" --resume --metrics "$work/resumed_dp4_host.jsonl"
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --zero 1 --save-dir "$work/ck_host_zero1" \
  --resume --metrics "$work/resumed_dp2_zero1.jsonl"
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" "${chunks[@]}" --offload nvme \
  --nvme-dir "$work/nvme" --save-dir "$work/ck_dp2_to_nvme" --resume \
  --metrics "$work/resumed_dp2_nvme.jsonl"

# Unsupported combinations name the flags.
source "$(dirname "$0")/../../testing/expect_error.sh"
expect_error "not with --sp 2" bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --sp 2 \
  --sp-mode ulysses --offload host
expect_error "auto needs the emulated device's size" "$mammoth" train "${common[@]}" \
  --device-mem auto
expect_error "--zero 1 does not apply" bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" \
  --zero 1 --offload host

PYTHONPATH="$(dirname "$0")/../../testing" "${MAMMOTH_PYTHON:-/usr/bin/python3}" - "$work" <<'PY'
import json, os, struct, sys, curves
work = sys.argv[1]
runs = curves.Runs(work)
def rows(name):
    return {r["step"]: r for r in runs.rows(name)}
def losses(name):
    return runs.column(name)
runs.learns("dp2", steps=10)
def bitwise(name, reference, steps):
    got, want = losses(name), losses(reference)
    assert sorted(got) == steps, (name, sorted(got))
    bad = [(s, got[s], want[s]) for s in steps if got[s] != want[s]]
    assert not bad, (name, reference, bad)
    print(f"{name}: steps {steps[0]}..{steps[-1]} bitwise equal to {reference}")
def close(name, steps, tol):
    runs.matches(name, "dp2", tol=tol, steps=steps)
all_steps = list(range(1, 11))
bitwise("dp2_host", "dp2", all_steps)
bitwise("dp2_nvme", "dp2", all_steps)
bitwise("dp2_accum_host", "dp2_accum", all_steps)
bitwise("resumed_dp2_host", "dp2", list(range(6, 11)))
bitwise("resumed_dp2_nvme", "dp2", list(range(6, 11)))
bitwise("resumed_dp2_zero1", "dp2", list(range(6, 11)))
bitwise("np1_auto", "np1", all_steps)
bitwise("dp2_auto", "dp2", all_steps)
for name in ["np1_auto", "dp2_auto"]:
    for s, r in rows(name).items():
        a, d = r["offload"]["auto"], r["offload"]["device"]
        assert a["traced_peak"] > 0 and a["chunk_budget"] > 0, (name, s, a)
        assert a["chunk_budget"] == a["device_size"] - a["traced_peak"] - a["margin"], a
        assert d["budget"] == a["chunk_budget"] and d["peak_bytes"] <= a["chunk_budget"], (a, d)
    print(f"{name}: traced peak {a['traced_peak']}, chunks get {a['chunk_budget']}, "
          f"device peak {d['peak_bytes']}")
auto_log = open(f"{work}/auto.log").read()
assert "traced peak of non-chunk memory (first step)" in auto_log, auto_log
# One process sums the batch's gradients in another order than two ranks' average: equal to
# float rounding (as train_dp_test).
close("np1_host", all_steps, 2e-5)
close("resumed_np1", list(range(6, 11)), 2e-5)
close("resumed_np1_host", list(range(6, 11)), 2e-5)
close("resumed_dp4_host", list(range(6, 11)), 2e-5)

# fp16 with a large initial scale overflows at first: every rank skipped the same steps.
a, b = rows("dp2_fp16"), rows("dp2_fp16_host")
skipped = [s for s in a if a[s].get("skipped")]
assert skipped, "the 1.6e7 loss scale should overflow at least once"
assert skipped == [s for s in b if b[s].get("skipped")], (skipped, b)
assert [a[s]["loss_scale"] for s in a] == [b[s]["loss_scale"] for s in b]
bitwise("dp2_fp16_host", "dp2_fp16", all_steps)
print("fp16: both skipped steps", skipped)

# AdamW state bytes per rank: about half of one process's (chunk k on rank k % 2).
dp2_bytes = rows("dp2_host")[10]["offload"]["optimizer_state_bytes"]
np1_bytes = rows("np1_host")[10]["offload"]["optimizer_state_bytes"]
ratio = dp2_bytes / np1_bytes
print(f"optimizer state bytes: dp2 rank 0 {dp2_bytes}, one process {np1_bytes}, ratio {ratio:.3f}")
assert 0.4 < ratio < 0.6, ratio
log = open(f"{work}/host.log").read()
assert "dp rank 0 of 2: owns 7 of 14 chunks" in log, log

# The final parameters and AdamW states, assembled from each checkpoint's shards, are bitwise
# equal (dp 2 writes them from rank 0; dp 2 + offload from each chunk's owner, both ranks).
def assemble(d):
    index = json.load(open(f"{d}/index.json"))
    out, writers = {}, {}
    for shard in index["shards"]:
        blob = open(f"{d}/{shard}", "rb").read()
        n = struct.unpack("<Q", blob[:8])[0]
        header = json.loads(blob[8:8 + n])
        for key, meta in header.items():
            if key == "__metadata__":
                continue
            name, offset = key.rsplit("@", 1)
            size = 4 * 1
            for dim in index["tensors"][name]["shape"]:
                size *= dim
            buf = out.setdefault(name, bytearray(size))
            lo, hi = meta["data_offsets"]
            at = int(offset) * 4
            buf[at:at + hi - lo] = blob[8 + n + lo:8 + n + hi]
            writers.setdefault(name, set()).add(shard)
    return out, writers
plain, _ = assemble(f"{work}/ck_dp2/step_00000010")
offl, writers = assemble(f"{work}/host_step10")
assert sorted(plain) == sorted(offl), (sorted(plain), sorted(offl))
diff = [n for n in plain if plain[n] != offl[n]]
assert not diff, diff
both = set().union(*writers.values())
assert len(both) == 2, both  # the owners of the chunks are on both ranks
print(f"final checkpoint: {len(plain)} tensors bitwise equal; written by {sorted(both)}")
print("ok")
PY
