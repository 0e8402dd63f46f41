#!/bin/bash
# `mammoth bench serve --quick --no-hf`: the load generator runs the fixed mix at each
# concurrency and writes one JSON row per concurrency with positive tokens/s and time to first
# token; an unknown option is refused by name. (The transformers anchor is exercised by the
# benchmark itself, which BENCHMARKS.md records, not here: it needs minutes on gpt2.)
set -uo pipefail
mammoth="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }
json="$TEST_TMPDIR/rows.json"
out="$TEST_TMPDIR/out.txt"
"$mammoth" bench serve --quick --no-hf --concurrency 1,3 --json "$json" >"$out" 2>&1 ||
  { cat "$out"; fail "bench serve exited non-zero"; }
grep -q "^ *3 *6 " "$out" || { cat "$out"; fail "no table row for concurrency 3 (6 requests)"; }
py=$(command -v python3)
"$py" - "$json" <<'PY' || fail "bad JSON rows"
import json, sys
rows = json.load(open(sys.argv[1]))
assert [r["name"] for r in rows] == ["serve_gpt2-tiny_c1", "serve_gpt2-tiny_c3"], rows
for r in rows:
    assert r["unit"] == "tokens/s" and r["ours"] > 0, r
    assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"], r
    assert r["requests"] == max(4, 2 * r["concurrency"]) and "anchor" not in r, r
PY
if "$mammoth" bench serve --bogus 1 >"$out" 2>&1; then fail "--bogus was accepted"; fi
grep -q "unknown option '--bogus'" "$out" || { cat "$out"; fail "--bogus not refused by name"; }
echo PASS
