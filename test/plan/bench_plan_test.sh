#!/bin/bash
# `mammoth bench plan --quick`: calibrates (quick), runs a few plans of gpt2-tiny through
# `mammoth train` and prints each plan's predicted and measured step time and error, the
# summary (median / worst error, Spearman) and the first choice's gap. Checks the format and
# that the errors are computed, not the accuracy (BENCHMARKS.md records that).
set -euo pipefail
mammoth="$1"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/bench_plan.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"
export TMPDIR="$work"

"$mammoth" bench plan --quick --json "$work/out.json" >"$work/out.txt" 2>"$work/err.txt" || {
  cat "$work/out.txt" "$work/err.txt"
  exit 1
}
cat "$work/out.txt"
fail() {
  echo "FAIL: $*"
  exit 1
}
grep -q '^cluster calibrated_' "$work/out.txt" || fail "no calibrated cluster line"
grep -q '^measured: ' "$work/out.txt" || fail "no line saying what was measured"
rows=$(grep -cE '^ +[0-9]+ gpt2-tiny +1 .* [0-9]+\.[0-9]+ +[0-9]+\.[0-9]+ +[+-][0-9]+\.[0-9]% +[0-9]+\.[0-9]+ +[+-][0-9]+\.[0-9]%  \(wall min ' \
  "$work/out.txt" || true)
[[ $rows -ge 2 ]] || fail "expected >= 2 plan rows with predicted, measured and error, got $rows"
grep -q '^\s*0 gpt2-tiny  *1 \* ' "$work/out.txt" || fail "the search's first choice is not row 0"
grep -qE '^median \|error\| [0-9.]+% .*worst [0-9.]+% .*Spearman -?[0-9.]+' "$work/out.txt" ||
  fail "no summary line"
grep -qE '^first choice gpt2-tiny np 1: .* \((within|outside) 10%\)$' "$work/out.txt" ||
  fail "no first-choice line"
python3 - "$work/out.json" <<'PY'
import json, math, sys
d = json.load(open(sys.argv[1]))
plans = d["plans"]
assert len(plans) >= 2, plans
for p in plans:
    assert p["predicted_s"] > 0 and p["measured_s"] > 0, p
    assert 0.05 < p["core_speed"] < 20, p  # the probe ran, in CPU time: near 1 on a steady core
for k in ("median_abs_error", "worst_abs_error", "spearman", "speed_adjusted_median_abs_error",
          "speed_adjusted_worst_abs_error"):
    assert math.isfinite(d[k]), (k, d[k])
assert d["cluster"]["calibration"]["quick"] is True
assert d["cluster"]["op_overhead_us"] > 0
print("bench plan --quick: ok,", len(plans), "plans")
PY
