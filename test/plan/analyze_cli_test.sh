#!/bin/bash
# `mammoth analyze`: parameters and FLOPs, then the planner's models for the plan its flags
# describe: memory per stage and tier (plan/memory_model), what fits where under each offload
# setting (plan/fit), the step time with --cluster (plan/time_model); --json carries the same.
set -uo pipefail
mammoth="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }
py=/usr/bin/python3
t="$TEST_TMPDIR"

"$mammoth" analyze --model gpt2 >"$t/text.txt" 2>&1 || { cat "$t/text.txt"; fail "analyze failed"; }
cat "$t/text.txt"
for want in "parameters   124439808" "FLOPs/token" "plan         dp1 pp1" "memory       per rank" \
  "stage 0: device peak"; do
  grep -q -- "$want" "$t/text.txt" || fail "analyze output lacks '$want'"
done
grep -q "fit per rank" "$t/text.txt" && fail "a fit table without a budget"

# --json: one line; the memory is the plan's, by stage; nothing asked for is absent.
"$mammoth" analyze --model gpt2 --json --pp 2 --grad-accum 4 >"$t/pp.json" 2>&1 || fail "--json --pp 2"
"$py" - "$t/pp.json" <<'PY' || fail "--json --pp 2 keys"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
v = json.loads(lines[0])
assert v["params"] == 124439808 and v["flops_per_token_train"] > 0
assert v["plan"]["pp"] == 2 and v["plan"]["grad_accum"] == 4
stages = v["memory"]["stages"]
assert len(stages) == 2 and all(s["device_peak"] > 0 for s in stages), stages
assert v["memory"]["device_peak"] == max(s["device_peak"] for s in stages)
assert "time" not in v and "offload_fit" not in v and "plan_invalid" not in v
PY

# --cluster: the step time and its breakdown.
"$mammoth" analyze --model gpt2 --cluster h200_node --seq-len 1024 --amp bf16 >"$t/time.txt" 2>&1 ||
  { cat "$t/time.txt"; fail "--cluster failed"; }
grep -q "time         on h200_node" "$t/time.txt" || fail "no step time on h200_node"
grep -q "binds" "$t/time.txt" || fail "no binding limit"
tail -1 "$t/time.txt" | "$py" -c '
import json, sys
v = json.load(sys.stdin)
assert v["time"]["cluster"] == "h200_node" and v["time"]["step_time_s"] > 0, v["time"]
assert sum(v["time"]["parts_s"].values()) > 0' || fail "--cluster JSON"

# Budgets: the fit table, one row per offload setting, recomputed with the memory model.
"$mammoth" analyze --model gpt2 --device-mem 1280M --host-mem 4G --micro-batch 2 --seq-len 128 \
  >"$t/fit.txt" 2>&1 || { cat "$t/fit.txt"; fail "budgets failed"; }
cat "$t/fit.txt"
grep -q "fit per rank" "$t/fit.txt" || fail "no fit table"
tail -1 "$t/fit.txt" | "$py" -c '
import json, sys
v = json.load(sys.stdin)
f = v["offload_fit"]
rows = {r["setting"]: r for r in f["settings"]}
assert list(rows) == ["none", "host", "nvme", "host-paged", "nvme-paged"], list(rows)
assert f["device_mem"] == 1280 << 20 and f["host_mem"] == 4 << 30 and f["dp"] == 1
assert not rows["none"]["fits"] and rows["nvme-paged"]["fits"], rows
assert rows["nvme-paged"]["max_layers"] > rows["none"]["max_layers"] > 0
assert rows["host-paged"]["plan"]["device_mem"] == 0
assert rows["host-paged"]["plan"]["auto_device_mem"] == 1280 << 20
# The flags plan itself: --device-mem 1280M without --offload pages every chunk, as train would.
assert v["plan"]["device_mem"] == 1280 << 20 and v["memory"]["stages"][0]["chunks_device"] > 0' ||
  fail "fit JSON"

# A plan train would refuse is said so, and not predicted.
"$mammoth" analyze --model gpt2 --sp 2 >"$t/bad.txt" 2>&1 || fail "an invalid plan is not an error"
grep -q "not valid, so not predicted: --sp 2 needs --sp-mode" "$t/bad.txt" || fail "no refusal"
tail -1 "$t/bad.txt" | "$py" -c '
import json, sys
v = json.load(sys.stdin)
assert "plan_invalid" in v and "memory" not in v' || fail "invalid plan JSON"

# --ep: the expert exchanges' volume (plan::expert_exchange_bytes_per_step), only under --ep.
"$mammoth" analyze --model mixtral-tiny --dp 4 --ep 2 --json >"$t/ep.json" 2>&1 || fail "--ep 2"
"$mammoth" analyze --model mixtral-tiny --dp 4 --json >"$t/ep1.json" 2>&1 || fail "mixtral --dp 4"
"$py" -c '
import json, sys
v, w = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert v["plan"]["ep"] == 2 and v["expert_exchange_bytes_per_step"] > 0, v
assert "expert_exchange_bytes_per_step" not in w' "$t/ep.json" "$t/ep1.json" || fail "--ep JSON"

# --plan FILE describes the plan instead; a layout flag beside it is refused.
echo '{"dp": 2, "zero": 1, "micro_batch": 2}' >"$t/plan.json"
"$mammoth" analyze --model gpt2 --plan "$t/plan.json" --json >"$t/file.json" 2>&1 || fail "--plan FILE"
"$py" -c '
import json, sys
v = json.load(open(sys.argv[1]))
assert v["plan"]["dp"] == 2 and v["plan"]["zero"] == 1 and v["memory"]["device_peak"] > 0' \
  "$t/file.json" || fail "--plan FILE JSON"
"$mammoth" analyze --model gpt2 --plan "$t/plan.json" --tp 2 >"$t/both.txt" 2>&1 &&
  fail "--tp beside --plan was accepted"
grep -q -- "--tp is set by --plan" "$t/both.txt" || fail "the refusal does not name --tp"

# The placement table train prints at start-up (plan/memory_model placement_table): per tier the
# homes of parameters, gradients and optimizer states, and the budgets; JSON carries the homes.
"$mammoth" analyze --model gpt2 --offload-params nvme --offload-optimizer host --nvme-dir /nvme \
  --device-mem 1G >"$t/place.txt" 2>&1 || { cat "$t/place.txt"; fail "placement"; }
grep -q "^placement    stage 0, per rank:" "$t/place.txt" || fail "no placement table"
grep -q "^  device  params      0.00 MiB  grads      0.00 MiB  optimizer      0.00 MiB .* budget 1024.0 MiB" \
  "$t/place.txt" || fail "device row"
grep -q "^  host    params      0.00 MiB  grads      0.00 MiB  optimizer    949.40 MiB .* budget unlimited" \
  "$t/place.txt" || fail "host row"
grep -q "^  nvme    params    474.70 MiB  grads    474.70 MiB  optimizer      0.00 MiB .* budget /nvme" \
  "$t/place.txt" || fail "nvme row"
tail -1 "$t/place.txt" | "$py" -c '
import json, sys
h = json.load(sys.stdin)["memory"]["stages"][0]["homes"]
P = 124439808
assert h["nvme"] == {"params": 4 * P, "grads": 4 * P, "optimizer": 0}, h
assert h["host"]["optimizer"] == 8 * P and h["device"]["params"] == 0, h' || fail "homes JSON"
# The chunk manager's dry run: gpt2 paged through 1 GiB of device memory moves chunks every
# step (the forward's loads at least the parameters that did not stay); everything homed on the
# device moves nothing.
"$mammoth" analyze --model gpt2 --device-mem 1G --micro-batch 2 --seq-len 128 \
  >"$t/moves.txt" 2>&1 || { cat "$t/moves.txt"; fail "chunk moves"; }
grep -q "^chunk moves  stage 0, per rank per step (dry run of the chunk manager" "$t/moves.txt" ||
  fail "no chunk moves"
tail -1 "$t/moves.txt" | "$py" -c '
import json, sys
m = json.load(sys.stdin)["chunk_moves"][0]
assert m["device_in"] > 0 and m["device_out"] > 0 and m["nvme_read"] == 0, m' ||
  fail "chunk moves JSON (paged)"
"$mammoth" analyze --model gpt2 --offload host --micro-batch 2 --seq-len 128 >"$t/still.txt" 2>&1 ||
  { cat "$t/still.txt"; fail "chunk moves, nothing paged"; }
tail -1 "$t/still.txt" | "$py" -c '
import json, sys
m = json.load(sys.stdin)["chunk_moves"][0]
assert m["device_in"] == 0 and m["device_out"] == 0 and m["nvme_write"] == 0, m' ||
  fail "chunk moves JSON (nothing paged)"
echo ok
