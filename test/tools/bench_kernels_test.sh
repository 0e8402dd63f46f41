#!/bin/bash
# `mammoth bench kernels --quick`: runs with only the backward rows selected, says which memory
# and store paths it measured, and writes a JSON row with a positive figure and anchor for
# every backward row (the norms' at each of their widths), its in-place twin (dx over dy) where the engine
# uses one, and none for the forward rows --filter left out; an in-place row selected alone by
# its whole name runs.
set -uo pipefail
mammoth="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }
# positive FIELD LINE: LINE's JSON number FIELD is above 0 (a figure below 1 GB/s counts: under
# CI's parallel load one run can be that slow).
positive() {
  local v
  v=$(echo "$2" | sed -n "s/.*\"$1\":\([-0-9.e+]*\),.*/\1/p")
  [ -n "$v" ] && awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }'
}
out="$TEST_TMPDIR/out.txt"
json="$TEST_TMPDIR/rows.json"
"$mammoth" bench kernels --quick --reps 1 --no-torch --threads 1 --filter _backward \
  --json "$json" >"$out" 2>&1 || { cat "$out"; fail "bench kernels exited non-zero"; }
grep -q "^buffers: the engine's CPU allocator" "$out" || fail "no buffers line"
grep -q "^row kernels stream outputs over [0-9]* MiB" "$out" || fail "no streaming threshold line"
for row in softmax_backward log_softmax_backward layer_norm_backward rms_norm_backward \
  cross_entropy_backward gelu_backward silu_backward softmax_backward_inplace \
  log_softmax_backward_inplace layer_norm_backward_inplace rms_norm_backward_inplace \
  cross_entropy_backward_inplace; do
  line=$(grep "\"name\":\"$row\"" "$json") || fail "no JSON row for $row"
  positive ours "$line" || fail "$row: no positive figure: $line"
  positive anchor "$line" || fail "$row: no positive anchor: $line"
  echo "$line" | grep -q '"unit":"GB/s"' || fail "$row: not in GB/s: $line"
done
if grep -q '"name":"softmax",' "$json"; then fail "--filter _backward ran the forward row"; fi
# The norms run at the zoo's widths (768, 1024, 1600 and 4096 for long rows) unless --row-shape
# names one.
for shape in 4096x768 3072x1024 2048x1600 1024x4096; do
  grep -q "\"name\":\"layer_norm_backward\",\"shape\":\"$shape\"" "$json" ||
    fail "no layer_norm_backward row at $shape"
done
# An in-place row selected alone by its whole name (its group's guard must know the name).
one="$TEST_TMPDIR/one.json"
"$mammoth" bench kernels --quick --reps 1 --no-torch --threads 1 \
  --filter layer_norm_backward_inplace --row-shape 256x768 --json "$one" >"$out" 2>&1 ||
  { cat "$out"; fail "bench kernels --filter layer_norm_backward_inplace exited non-zero"; }
grep -q '"name":"layer_norm_backward_inplace","shape":"256x768"' "$one" ||
  { cat "$out"; fail "--filter layer_norm_backward_inplace ran no row"; }
echo ok
