#!/bin/bash
# `train --detect-anomaly` and `--log-grad-norms`:
#   1. a NaN put into one parameter (the MAMMOTH_TEST_NAN_* hook) stops the run at the first op
#      that reads it, named with its module, shapes and rank; exit 1, no further step;
#   2. under dp 2 with the NaN on rank 1 only, rank 1 is named and mpirun fails;
#   3. fp16 with an absurd loss scale overflows in the backward: the backward op is named;
#   4. on a healthy run detection changes nothing (same losses as without it);
#   5. --log-grad-norms writes every module's norm on each --log-every step, whose root sum of
#      squares is the step's grad_norm; dp 2's equal one process's; sharded layouts are refused.
set -euo pipefail
mammoth="$1"
mpirun="$2"
py="${MAMMOTH_PYTHON:-/usr/bin/python3}"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/anomaly.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache
fail() { echo "FAIL: $*" >&2; exit 1; }
common=(--steps 4 --log-every 1 --eval-every 0 --warmup 1 --threads 1 --seq-len 32)

expect_fail() {  # expect_fail LOG PATTERN... -- the last command's exit code is in $rc
  local log="$1"
  shift
  cat "$log"
  [[ $rc -ne 0 ]] || fail "$log: the run succeeded"
  for p in "$@"; do grep -qF -- "$p" "$log" || fail "$log: no '$p'"; done
}

# 1. One process: NaN in h.1.mlp.c_fc.weight before step 2 (0-based).
rc=0
MAMMOTH_TEST_NAN_PARAM=h.1.mlp.c_fc.weight MAMMOTH_TEST_NAN_STEP=2 "$mammoth" train \
  "${common[@]}" --micro-batch 4 --detect-anomaly >"$work/np1.log" 2>&1 || rc=$?
expect_fail "$work/np1.log" "[detect-anomaly] rank 0 of 1: forward op 'linear' in module 'h.1.mlp.c_fc'" \
  "output 0 (4, 32, 512) f32" "(512, 128) f32 'h.1.mlp.c_fc.weight'"
[[ $rc -eq 1 ]] || fail "exit $rc, expected 1"
grep -q "^step     2/4" "$work/np1.log" || fail "the two healthy steps did not run"
if grep -q "^step     3/4" "$work/np1.log"; then fail "trained on after the NaN"; fi

# 2. dp 2, the NaN on rank 1 only.
rc=0
# (local ranks inherit mpirun's environment)
MAMMOTH_TEST_NAN_PARAM=h.0.attn.c_proj.weight MAMMOTH_TEST_NAN_RANK=1 bash "$mpirun" -np 2 \
  "$mammoth" train "${common[@]}" --micro-batch 2 --detect-anomaly >"$work/dp2.log" 2>&1 || rc=$?
expect_fail "$work/dp2.log" "[detect-anomaly] rank 1 of 2: forward op 'linear' in module 'h.0.attn.c_proj'"
if grep -q "rank 0 of 2" "$work/dp2.log"; then fail "rank 0 reported a NaN it did not have"; fi
# The failing rank aborts the job (rank 0 would otherwise wait in its next all-reduce).
[[ $rc -eq 1 ]] || fail "dp 2: exit $rc, expected 1"

# 3. fp16: the loss scale overflows float16 in the first backward matmul (the tied LM head).
rc=0
"$mammoth" train "${common[@]}" --micro-batch 4 --amp fp16 --loss-scale 1e30 --detect-anomaly \
  >"$work/fp16.log" 2>&1 || rc=$?
expect_fail "$work/fp16.log" "[detect-anomaly] rank 0 of 1: backward of op 'linear' in module 'wte'" \
  "from output gradients (4, 32, " "(all finite)"

# 4 and 5. Healthy runs: with and without detection, norms per module.
"$mammoth" train "${common[@]}" --micro-batch 4 --metrics "$work/plain.jsonl" >/dev/null 2>&1
"$mammoth" train "${common[@]}" --micro-batch 4 --detect-anomaly --log-grad-norms --log-every 2 \
  --metrics "$work/np1.jsonl" >"$work/healthy.log" 2>&1 || { cat "$work/healthy.log"; fail "healthy"; }
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --micro-batch 2 --log-grad-norms \
  --log-every 2 --metrics "$work/dp2.jsonl" >"$work/dp2_norms.log" 2>&1 ||
  { cat "$work/dp2_norms.log"; fail "dp 2 --log-grad-norms"; }
"$py" - "$work/plain.jsonl" "$work/np1.jsonl" "$work/dp2.jsonl" <<'PY'
import json, math, sys
plain, np1, dp2 = ([json.loads(l) for l in open(p)] for p in sys.argv[1:4])
assert [r["loss"] for r in plain] == [r["loss"] for r in np1], "detection changed the losses"
for run in (np1, dp2):
    logged = [r["step"] for r in run if "grad_norms" in r]
    assert logged == [2, 4], logged
for r in np1 + dp2:
    if "grad_norms" not in r:
        continue
    g = r["grad_norms"]
    assert "h.0.attn.c_attn" in g and "wte" in g and "ln_f" in g, sorted(g)
    total = math.sqrt(sum(v * v for v in g.values()))
    assert abs(total - r["grad_norm"]) <= 1e-6 * r["grad_norm"], (total, r["grad_norm"])
for a, b in zip(np1, dp2):
    if "grad_norms" in a:
        for k, v in a["grad_norms"].items():
            assert abs(v - b["grad_norms"][k]) <= 1e-4 * max(v, 1e-3), (a["step"], k, v, b["grad_norms"][k])
print("grad norms: per module, summing to grad_norm, dp 2 == one process")
PY
rc=0
bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" --micro-batch 2 --zero 1 --log-grad-norms \
  >"$work/zero.log" 2>&1 || rc=$?
expect_fail "$work/zero.log" "--log-grad-norms supports one process and plain dp"
echo "PASS"
