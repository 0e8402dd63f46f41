#!/bin/bash
# Offload under every layout through `mammoth train` (each rank pages only what it holds):
# tp 2 with the AdamW states on NVMe (and on host), pp 2 with the parameters and gradients homed
# on the host (and the states on NVMe too), dp 2 x ZeRO 3 with the parameter shards on NVMe. Each loss curve is bitwise that of the same layout
# without offload, the step-8 checkpoints are byte for byte the same files, an offloaded run
# resumed from its step-4 checkpoint continues the plain curve bitwise, rank 0's per-tier peaks
# (the chunk manager's accounting, in the metrics) stay within --host-mem, and the layouts not
# built yet are refused by name.
set -euo pipefail
mammoth="$1"
mpirun="$2"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_offload_layouts.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache
mkdir -p "$work/nvme"
common=(--steps 8 --seq-len 32 --micro-batch 4 --grad-accum 2 --log-every 100 --eval-every 0
  --lr 3e-3 --warmup 2 --threads 1 --save-every 4)
run() {  # run NAME flags...: two ranks, metrics and checkpoints named NAME
  local name="$1"
  shift
  bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --metrics "$work/$name.jsonl" \
    --save-dir "$work/ck_$name" "$@" 2>"$work/$name.log" || { cat "$work/$name.log"; exit 1; }
}
run tp2 --tp 2
run tp2_nvme --tp 2 --chunk-mb 0.25 --offload-optimizer nvme --nvme-dir "$work/nvme" --host-mem 3M
run tp2_host --tp 2 --chunk-mb 0.25 --offload-optimizer host
run pp2 --pp 2
run pp2_host --pp 2 --chunk-mb 0.25 --offload-params host --host-mem 5M
run pp2_host_nvme --pp 2 --chunk-mb 0.25 --offload-params host --offload-optimizer nvme \
  --nvme-dir "$work/nvme" --host-mem 7M
# dp 2 x ZeRO 3, each rank's parameter shards (13 of ~200 KiB) homed on NVMe under a device
# cache of a quarter of them.
run z3 --zero 3
run z3_nvme --zero 3 --offload-params nvme --nvme-dir "$work/nvme" --device-mem 640K \
  --host-mem 1M
cat "$work/tp2_nvme.log" "$work/pp2_host.log" "$work/z3_nvme.log"

# Resume each offloaded run from its step-4 checkpoint.
for name in tp2_nvme pp2_host z3_nvme; do
  cp -r "$work/ck_$name" "$work/ck_${name}_resumed"
  echo step_00000004 >"$work/ck_${name}_resumed/latest"
done
run tp2_nvme_resumed --tp 2 --chunk-mb 0.25 --offload-optimizer nvme --nvme-dir "$work/nvme" \
  --resume
run pp2_host_resumed --pp 2 --chunk-mb 0.25 --offload-params host --resume
run z3_nvme_resumed --zero 3 --offload-params nvme --nvme-dir "$work/nvme" --device-mem 640K \
  --resume

# The same step-8 checkpoint, file for file.
for pair in "tp2 tp2_nvme" "tp2 tp2_host" "pp2 pp2_host" "pp2 pp2_host_nvme" "z3 z3_nvme"; do
  set -- $pair
  if ! diff <(cd "$work/ck_$1/step_00000008" && sha256sum ./*) \
    <(cd "$work/ck_$2/step_00000008" && sha256sum ./*); then
    echo "checkpoints of $1 and $2 differ" >&2
    exit 1
  fi
  echo "step-8 checkpoint of $2: the same files as $1's"
done

source "$(dirname "$0")/../../testing/expect_error.sh"
expect_error "--offload-params host with --tp is not built yet" bash "$mpirun" -np 2 \
  "$mammoth" train --steps 1 --tp 2 --offload-params host
expect_error "--offload-params nvme with --pp is not built yet" bash "$mpirun" -np 2 \
  "$mammoth" train --steps 1 --pp 2 --offload-params nvme --nvme-dir "$work/nvme"
expect_error "leave --device-mem at 0" bash "$mpirun" -np 2 "$mammoth" train --steps 1 --tp 2 \
  --offload-optimizer host --device-mem 1M
expect_error "with --offload-optimizer host is not built yet" bash "$mpirun" -np 2 "$mammoth" \
  train --steps 1 --zero 3 --offload-params nvme --offload-optimizer host --nvme-dir "$work/nvme"
expect_error "runs as --zero 3 --offload-params nvme only" bash "$mpirun" -np 2 "$mammoth" \
  train --steps 1 --zero 2 --offload-params nvme --nvme-dir "$work/nvme"

PYTHONPATH="$(dirname "$0")/../../testing" "${MAMMOTH_PYTHON:-/usr/bin/python3}" - "$work" <<'PY'
import re, sys, curves
work = sys.argv[1]
runs = curves.Runs(work)
for ref, names in {"tp2": ["tp2_nvme", "tp2_host"], "pp2": ["pp2_host", "pp2_host_nvme"],
                   "z3": ["z3_nvme"]}.items():
    runs.learns(ref, steps=8)
    want = runs.column(ref)
    for name in names:
        assert runs.column(name) == want, (name, runs.column(name), want)
        print(f"{name}: steps 1..8 bitwise equal to {ref}")
    resumed = f"{names[0]}_resumed"
    got = runs.column(resumed)
    assert sorted(got) == list(range(5, 9)), (resumed, sorted(got))
    assert all(got[s] == want[s] for s in got), (resumed, got, want)
    print(f"{resumed}: steps 5..8 bitwise equal to {ref}")

MiB = 1 << 20
homes = {"tp2_nvme": ("device", "nvme"), "tp2_host": ("device", "host"),
         "pp2_host": ("host", "device"), "pp2_host_nvme": ("host", "nvme")}
budget = {"tp2_nvme": 3 * MiB, "tp2_host": 0, "pp2_host": 5 * MiB, "pp2_host_nvme": 7 * MiB}
for name, (params_home, states_home) in homes.items():
    for r in runs.rows(name):
        o = r["offload"]
        h = o["host"]
        assert h["budget"] == budget[name], (name, h)
        if budget[name]:  # measured by the chunk manager at every change
            assert 0 < h["peak_bytes"] <= budget[name] and h["reserved_bytes"] <= budget[name], h
        for tier in {params_home, states_home}:
            assert o[tier]["home_bytes"] > 0, (name, tier, o)
        for tier in {"device", "host", "nvme"} - {params_home, states_home}:
            assert o[tier]["home_bytes"] == 0, (name, tier, o)
    print(f"{name}: rank 0 homes params on {params_home}, states on {states_home}; host peak "
          f"{h['peak_bytes']} (budget {budget[name] or 'unlimited'})")

# ZeRO-3's shards: homed on NVMe, paged through a device cache that held its budget.
for r in runs.rows("z3_nvme"):
    z = r["zero3_shards"]
    d, n = z["device"], z["nvme"]
    assert d["budget"] == 640 << 10 and z["host"]["budget"] == MiB, z
    assert 0 < d["peak_bytes"] <= d["budget"] and d["reserved_bytes"] <= d["budget"], z
    assert d["home_bytes"] == 0 and n["home_bytes"] >= 4 * d["budget"], z
assert n["bytes_out"] > 4 * n["home_bytes"], z  # read back several times per run
assert n["moves_in"] > 0, z  # updated shards written back
print(f"z3_nvme: shards {n['home_bytes']} on NVMe, device peak {d['peak_bytes']} <= "
      f"{d['budget']}, NVMe read {n['bytes_out']}, written {n['bytes_in']}")

# Rank 0's placement table: its shard (tp) or its stage (pp), where the engine put it.
def table(name):
    rows = {}
    for m in re.finditer(r"^  (device|host|nvme) +params +([\d.]+) MiB +grads +([\d.]+) MiB +"
                         r"optimizer +([\d.]+) MiB", open(f"{work}/{name}.log").read(), re.M):
        rows[m[1]] = [float(m[i]) for i in range(2, 5)]
    assert sorted(rows) == ["device", "host", "nvme"], (name, rows)
    return rows
plain, t = table("tp2"), table("tp2_nvme")
assert t["device"][:2] == plain["device"][:2] and t["device"][2] == 0, (plain, t)
assert t["nvme"][2] == plain["device"][2] and t["nvme"][0] == 0, (plain, t)
plain, t = table("pp2"), table("pp2_host")
assert t["host"][:2] == plain["device"][:2] and t["device"][2] == plain["device"][2], (plain, t)
plain, t = table("z3"), table("z3_nvme")
assert t["nvme"] == [plain["device"][0], 0, 0] and t["device"][1:] == plain["device"][1:], (plain, t)
print("ok")
PY
