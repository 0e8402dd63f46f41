#!/bin/bash
# `mammoth train --offload-params nvme --offload-optimizer nvme` (everything on NVMe: parameter,
# gradient and AdamW state chunks homed in --nvme-dir, a device budget of under 1/4 of the model
# state): the loss curve is bitwise that of the same run without offload, and the per-tier peaks
# the chunk manager accounted (metrics' "offload") stay within --device-mem / --host-mem. The
# start-up placement table says where each part is homed; --offload is the short form of
# --offload-optimizer; combinations not built yet are refused by name. A --nvme-dir that
# cannot hold the swap file (RLIMIT_FSIZE on the process) or cannot be written, and paging that
# fails mid-run (the file's bytes changed under the job), stop the job with a message naming
# the path, the checkpoint it resumed from untouched. A checkpoint resumed into everything on
# NVMe continues bitwise and writes the same files.
set -euo pipefail
mammoth="$1"
mpirun="$2"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_offload_tiers.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache
mkdir -p "$work/nvme"
common=(--steps 10 --seq-len 32 --micro-batch 4 --grad-accum 2 --log-every 100 --eval-every 0
  --lr 3e-3 --warmup 2 --threads 1)
# gpt2-tiny: 13.6 MiB of parameters + gradients + AdamW states, in 14 chunks of 332 KiB.
nvme_flags() {  # nvme_flags OPTIMIZER_FLAG DIR
  nvme=(--chunk-mb 0.25 --offload-params nvme "$1" nvme --nvme-dir "$2" --device-mem 3400K
    --host-mem 1536K)
}
nvme_flags --offload-optimizer "$work/nvme"

"$mammoth" train "${common[@]}" --metrics "$work/plain.jsonl" --save-every 5 \
  --save-dir "$work/ck" 2>"$work/plain.log"
"$mammoth" train "${common[@]}" "${nvme[@]}" --metrics "$work/nvme.jsonl" 2>"$work/nvme.log"
cat "$work/nvme.log"
# The short form: --offload nvme is --offload-optimizer nvme.
nvme_flags --offload "$work/nvme"
"$mammoth" train "${common[@]}" "${nvme[@]}" --metrics "$work/short.jsonl"
# Parameters homed on the host, states on NVMe.
"$mammoth" train "${common[@]}" --chunk-mb 0.25 --offload-params host --offload nvme \
  --nvme-dir "$work/nvme" --device-mem 3400K --metrics "$work/params_host.jsonl" \
  2>"$work/params_host.log"

source "$(dirname "$0")/../../testing/expect_error.sh"
expect_error "disagree (--offload is its short form)" "$mammoth" train "${common[@]}" \
  --offload host --offload-optimizer nvme --nvme-dir "$work/nvme"
expect_error "offload-params nvme needs --nvme-dir" "$mammoth" train "${common[@]}" \
  --offload-params nvme
expect_error "offload-params must be none, host or nvme" "$mammoth" train "${common[@]}" \
  --offload-params disk
expect_error "offload-params host with --dp runs as --zero 3" bash "$mpirun" -np 2 "$mammoth" \
  train "${common[@]}" --offload-params host

# A full --nvme-dir: the swap file is reserved (fallocate) before the first step, so a directory
# that cannot hold it fails there, naming it. RLIMIT_FSIZE (1 MiB) stands in for a small file
# system (no mount here); SIGXFSZ is ignored so the failing call returns EFBIG. The resumed
# checkpoint must not change.
before="$(cd "$work/ck" && find . -type f | sort | xargs sha256sum)"
mkdir -p "$work/full"
nvme_flags --offload-optimizer "$work/full"
expect_error "swap file $work/full/" bash -c 'trap "" XFSZ; ulimit -f 1024; exec "$@"' _ \
  "$mammoth" train "${common[@]}" "${nvme[@]}" --save-dir "$work/ck" --resume --save-every 5
grep -q -- "--nvme-dir $work/full" "$work/err.log" || { cat "$work/err.log"; exit 1; }
# An unwritable --nvme-dir: a path under a regular file.
touch "$work/not_a_dir"
nvme_flags --offload-optimizer "$work/not_a_dir/sub"
expect_error "nvme-dir $work/not_a_dir/sub is not usable" "$mammoth" train "${common[@]}" \
  "${nvme[@]}" --save-dir "$work/ck" --resume --save-every 5
after="$(cd "$work/ck" && find . -type f | sort | xargs sha256sum)"
[ "$before" == "$after" ] || { echo "the checkpoint changed:"; diff <(echo "$before") <(echo "$after"); exit 1; }

# The plain run's step-5 checkpoint resumed with everything on NVMe (the loader writes paged
# parameters through staging): steps 6..10 continue the plain curve, and its step-10
# checkpoint is the plain run's, file for file.
cp -r "$work/ck" "$work/ck_nvme"
echo step_00000005 >"$work/ck_nvme/latest"
nvme_flags --offload-optimizer "$work/nvme"
"$mammoth" train "${common[@]}" "${nvme[@]}" --save-dir "$work/ck_nvme" --resume --save-every 5 \
  --metrics "$work/resumed_nvme.jsonl"
diff <(cd "$work/ck/step_00000010" && sha256sum ./*) \
  <(cd "$work/ck_nvme/step_00000010" && sha256sum ./*) ||
  { echo "the step-10 checkpoints differ" >&2; exit 1; }

# Paging that fails mid-run: the swap file's bytes are overwritten under the job (as a failing
# disk would return them) every 20 ms while it resumes with a checkpoint every step. The job
# stops with the file named (the checksum catches it), and the checkpoint it resumed from is
# unchanged with `latest` naming a complete one.
mkdir -p "$work/bad"
cp -r "$work/ck" "$work/ck_bad"
echo step_00000005 >"$work/ck_bad/latest"
before="$(cd "$work/ck_bad/step_00000005" && sha256sum ./*)"
(
  while [ ! -e "$work/stop" ]; do
    for f in "$work"/bad/mammoth-swap-*/chunks.bin; do
      [ -f "$f" ] && dd if=/dev/urandom of="$f" bs=4096 count=64 oflag=direct conv=notrunc \
        status=none 2>/dev/null || true
    done
    sleep 0.02
  done
) &
corrupter=$!
nvme_flags --offload-optimizer "$work/bad"
expect_error "from NVMe ($work/bad/mammoth-swap-" "$mammoth" train "${common[@]}" "${nvme[@]}" \
  --save-dir "$work/ck_bad" --resume --save-every 1
touch "$work/stop"
wait "$corrupter"
grep -q "checksum mismatch in $work/bad/" "$work/err.log" || { cat "$work/err.log"; exit 1; }
[ "$before" == "$(cd "$work/ck_bad/step_00000005" && sha256sum ./*)" ] ||
  { echo "the resumed checkpoint changed" >&2; exit 1; }
latest="$(cat "$work/ck_bad/latest")"
[ -f "$work/ck_bad/$latest/state.json" ] || { echo "latest names $latest, incomplete" >&2; exit 1; }
echo "paging failure: stopped naming the swap file; latest is $latest, complete"

PYTHONPATH="$(dirname "$0")/../../testing" "${MAMMOTH_PYTHON:-/usr/bin/python3}" - "$work" <<'PY'
import re, sys, curves
work = sys.argv[1]
runs = curves.Runs(work)
runs.learns("plain", steps=10)
want = runs.column("plain")
for name in ["nvme", "short", "params_host"]:
    got = runs.column(name)
    assert got == want, (name, got, want)
    print(f"{name}: steps 1..10 bitwise equal to the plain run")
got = runs.column("resumed_nvme")
assert sorted(got) == list(range(6, 11)) and all(got[s] == want[s] for s in got), got
print("resumed_nvme: steps 6..10 bitwise equal to the plain run")
MiB = 1 << 20
budgets = {"nvme": (3400 << 10, 1536 << 10), "short": (3400 << 10, 1536 << 10),
           "params_host": (3400 << 10, 0)}
for name, (device, host) in budgets.items():
    for r in runs.rows(name):
        o = r["offload"]
        d, h, n = o["device"], o["host"], o["nvme"]
        assert d["budget"] == device and h["budget"] == host, (name, d, h)
        # Measured by the chunk manager's accounting at every change, not computed.
        assert 0 < d["peak_bytes"] <= device and d["reserved_bytes"] <= device, (name, d)
        assert host == 0 or (0 < h["peak_bytes"] <= host and h["reserved_bytes"] <= host), (name, h)
        assert d["moves_in"] > 0 and n["moves_out"] > 0 and n["moves_in"] > 0, (name, d, n)
    print(f"{name}: device peak {d['peak_bytes']} <= {device}, host peak {h['peak_bytes']}"
          f" (budget {host or 'unlimited'}), nvme read {n['bytes_out']} written {n['bytes_in']}")
last = runs.rows("nvme")[-1]["offload"]
assert last["device"]["home_bytes"] == 0 and last["host"]["home_bytes"] == 0, last
ph = runs.rows("params_host")[-1]["offload"]
assert ph["device"]["home_bytes"] == 0 and ph["host"]["home_bytes"] > 0, ph

# The start-up placement table (plan/memory_model), the same numbers `mammoth analyze` prints.
def table(log):
    rows = {}
    for m in re.finditer(r"^  (device|host|nvme) +params +([\d.]+) MiB +grads +([\d.]+) MiB +"
                         r"optimizer +([\d.]+) MiB +total +([\d.]+) MiB +budget (.*)$",
                         open(log).read(), re.M):
        rows[m[1]] = ([float(m[i]) for i in range(2, 6)], m[6])
    assert sorted(rows) == ["device", "host", "nvme"], (log, rows)
    return rows
t = table(f"{work}/nvme.log")
assert t["device"][0] == [0, 0, 0, 0] and t["host"][0] == [0, 0, 0, 0], t
assert t["device"][1] == "3.3 MiB" and t["host"][1] == "1.5 MiB", t
state = t["nvme"][0][3] * MiB  # parameters + gradients + AdamW states, as planned
assert last["nvme"]["home_bytes"] >= state * 0.999, (last, state)  # the engine homed it all there
assert 4 * last["device"]["budget"] <= state, (last, state)  # the device gets under 1/4 of it
t = table(f"{work}/params_host.log")
assert t["host"][0][0] > 0 and t["host"][0][2] == 0 and t["nvme"][0][2] > 0, t
p = table(f"{work}/plain.log")
assert p["device"][0][3] == t["host"][0][3] + t["nvme"][0][3], (p, t)
print("ok")
PY
