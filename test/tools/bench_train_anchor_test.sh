#!/bin/bash
# `mammoth bench train`'s PyTorch anchor: without the PyTorch 2.x venv of `tools/setup.sh
# --bench-anchor` it falls back to Debian's torch, eager only, and says so; rounds alternate
# (ours, eager, ours, ...) and the row is the medians; a MAMMOTH_ANCHOR_PYTHON that is not there
# is refused by name; the benched model has no dropout, as the anchor's. With
# MAMMOTH_ANCHOR_PYTHON set to that venv's python-anchor (opt-in:
# --test_env=MAMMOTH_ANCHOR_PYTHON=...; compiling takes a minute or two) the compiled anchor runs
# too and torch 2's capability is printed.
set -uo pipefail
mammoth="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }
py="${MAMMOTH_PYTHON:-/usr/bin/python3}"
out="$TEST_TMPDIR/out.txt"
json="$TEST_TMPDIR/rows.json"
tiny=(--models gpt2-tiny --amp fp32 --batch 2 --seq 16 --threads 1 --steps 1 --warmup 1)
# A HOME without the anchor venv: the fallback.
env -u MAMMOTH_ANCHOR_PYTHON HOME="$TEST_TMPDIR" MAMMOTH_PYTHON="$py" "$mammoth" bench train \
  "${tiny[@]}" --rounds 2 --json "$json" >"$out" 2>&1 || { cat "$out"; fail "fallback run failed"; }
grep -q "^anchor python: $py (FALLBACK: no PyTorch 2.x anchor at $TEST_TMPDIR/.cache/mammoth/venv-torch2/bin/python-anchor (bash tools/setup.sh --bench-anchor installs it)" "$out" ||
  { cat "$out"; fail "the fallback is not labelled"; }
if ! "$py" -c 'import torch, sys; sys.exit(not hasattr(torch, "compile"))'; then
  grep -q "this torch has no torch.compile: eager only" "$out" || { cat "$out"; fail "no eager-only note"; }
fi
grep -q "^anchor for gpt2-tiny fp32: torch [0-9.a-z+]*, ATen CPU capability .*, 1 threads" "$out" ||
  { cat "$out"; fail "no anchor line with torch's version, capability and threads"; }
for r in 1 2; do
  grep -q "^  gpt2-tiny fp32 round $r: ours [0-9.]* ms, eager [0-9.]* ms" "$out" ||
    { cat "$out"; fail "no round $r with ours then eager"; }
done
"$py" - "$json" <<'PY' || fail "bad JSON row"
import json, sys
rows = json.load(open(sys.argv[1]))
assert len(rows) == 1, rows
r = rows[0]
assert r["rounds"] == 2 and r["ours"] > 0 and r["anchor"] > 0 and r["ratio"] > 0, r
assert r["anchor_threads"] == 1 and r["anchor_torch"], r
assert r["anchor_python_source"].startswith("FALLBACK"), r
PY
# A named anchor python that does not exist: refused by name, never a silent fallback.
MAMMOTH_ANCHOR_PYTHON=/no/such/python "$mammoth" bench train "${tiny[@]}" --rounds 1 >"$out" 2>&1 &&
  { cat "$out"; fail "a missing MAMMOTH_ANCHOR_PYTHON was accepted"; }
grep -q "MAMMOTH_ANCHOR_PYTHON=/no/such/python is not an executable" "$out" ||
  { cat "$out"; fail "no message naming MAMMOTH_ANCHOR_PYTHON"; }
"$mammoth" bench train "${tiny[@]}" --rounds 0 >"$out" 2>&1 && fail "--rounds 0 accepted"
# The anchor's model has no dropout, so ours is built without it even where the model's config
# has some (gpt2: 0.1), or our step would do work the anchor's does not.
"$mammoth" bench train --models gpt2 --amp fp32 --batch 1 --seq 4 --threads 1 --steps 1 \
  --warmup 1 --rounds 1 --no-torch --json "$json" >"$out" 2>&1 || { cat "$out"; fail "gpt2 run failed"; }
grep -q "^train step, B1 T4, no dropout (as the anchor)," "$out" || { cat "$out"; fail "no dropout note"; }
"$py" - "$json" <<'PY' || fail "gpt2 benched with dropout"
import json, sys
r = json.load(open(sys.argv[1]))[0]
assert r["dropout"] == 0 and r["attn_dropout"] == 0, r
PY
# The PyTorch 2.x anchor, when the run was given one.
if [[ -n "${MAMMOTH_ANCHOR_PYTHON:-}" ]]; then
  "$mammoth" bench train "${tiny[@]}" --warmup 2 --rounds 2 --json "$json" >"$out" 2>&1 ||
    { cat "$out"; fail "the torch 2 anchor run failed"; }
  grep -q "^anchor python: $MAMMOTH_ANCHOR_PYTHON (MAMMOTH_ANCHOR_PYTHON)$" "$out" ||
    { cat "$out"; fail "MAMMOTH_ANCHOR_PYTHON not used"; }
  grep -q "^  gpt2-tiny fp32 round 2: ours [0-9.]* ms, eager [0-9.]* ms, compiled [0-9.]* ms$" \
    "$out" || { cat "$out"; fail "no compiled round"; }
  "$py" - "$json" <<'PY' || fail "bad torch 2 JSON row"
import json, sys
r = json.load(open(sys.argv[1]))[0]
assert r["anchor_torch"].startswith("2.") and r["ratio_compiled"] > 0, r
PY
fi
echo ok
