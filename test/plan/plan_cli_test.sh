#!/bin/bash
# `mammoth plan`: the search prints ranked, explained plans for a shipped cluster, writes them as
# JSON (--out), predicts a plan file (--evaluate), refuses an unknown cluster by name, and the
# schedule and partition views still work.
set -uo pipefail
mammoth="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }
out="$TEST_TMPDIR/plan.txt"

"$mammoth" plan --model gpt2-medium --cluster h200_node --world 8 --global-batch 32 \
  --seq-len 1024 --amp bf16 --top 3 --out "$TEST_TMPDIR/plans.json" >"$out" 2>&1 ||
  { cat "$out"; fail "plan search exited non-zero"; }
cat "$out"
for want in "#1 " "#2 " "#3 " "tokens/s" "MFU" "binds: " "memory per rank" "vs #2" "search: "; do
  grep -q -- "$want" "$out" || fail "plan output lacks '$want'"
done
grep -q "#4 " "$out" && fail "--top 3 printed a fourth plan"

# A second run prints the same plans (the search time aside).
"$mammoth" plan --model gpt2-medium --cluster h200_node --world 8 --global-batch 32 \
  --seq-len 1024 --amp bf16 --top 3 >"$TEST_TMPDIR/again.txt" 2>&1 || fail "second run failed"
diff <(grep -v '^search: ' "$out" | grep -v '^wrote ') <(grep -v '^search: ' "$TEST_TMPDIR/again.txt") ||
  fail "two runs differ"

# --out: the plans as JSON; the first one, as a plan file, through --evaluate.
py=/usr/bin/python3
"$py" - "$TEST_TMPDIR/plans.json" "$TEST_TMPDIR/first.json" <<'PY' || fail "--out JSON"
import json, sys
v = json.load(open(sys.argv[1]))
assert v["cluster"] == "h200_node" and len(v["plans"]) == 3, v.keys()
first = v["plans"][0]
assert first["time"]["step_time_s"] > 0 and "memory" in first
json.dump({"plan": first["plan"]}, open(sys.argv[2], "w"))
PY
"$mammoth" plan --model gpt2-medium --cluster h200_node --evaluate "$TEST_TMPDIR/first.json" \
  >"$TEST_TMPDIR/eval.txt" 2>&1 || { cat "$TEST_TMPDIR/eval.txt"; fail "--evaluate failed"; }
cat "$TEST_TMPDIR/eval.txt"
step=$(grep -m1 -o 'step [0-9.]* [mu]*s' "$out")
grep -q -- "$step" "$TEST_TMPDIR/eval.txt" || fail "--evaluate predicts another step time than the search ($step)"

# A cluster given by path works like its name; an unknown one is refused naming the shipped ones.
cluster_file="${TEST_SRCDIR:-.}/mammoth/plan/clusters/h200_node.json"
if [ -f "$cluster_file" ]; then
  "$mammoth" plan --model gpt2-medium --cluster "$cluster_file" --world 8 --global-batch 32 \
    --seq-len 1024 --amp bf16 --top 1 >/dev/null 2>&1 || fail "--cluster by path failed"
fi
"$mammoth" plan --model gpt2 --cluster no_such --world 8 --global-batch 8 >"$TEST_TMPDIR/bad.txt" 2>&1 &&
  fail "an unknown cluster was accepted"
grep -q "dgx_a100_80gb" "$TEST_TMPDIR/bad.txt" || fail "the error does not list the shipped clusters"

# The older views.
"$mammoth" plan --show-schedule --pp 2 --micro-batches 4 >/dev/null 2>&1 || fail "--show-schedule"
"$mammoth" plan --show-partition --model gpt2 --pp 2 >/dev/null 2>&1 || fail "--show-partition"
echo ok
