#!/bin/bash
# `mammoth bench gemm --quick`: re-executes itself with OpenBLAS's settings (its AVX-512 kernels,
# and worker threads that sleep after a call instead of spinning on the core our next timed run
# needs), says so, and writes a JSON row with a positive figure, anchor and ratio for the shape
# --filter selects, and none for the others. A setting the user gave is kept.
set -uo pipefail
mammoth="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }
out="$TEST_TMPDIR/out.txt"
json="$TEST_TMPDIR/rows.json"
env -u OPENBLAS_CORETYPE -u OPENBLAS_THREAD_TIMEOUT "$mammoth" bench gemm --quick --reps 1 \
  --threads 1 --filter qkv_dx --json "$json" >"$out" 2>&1 ||
  { cat "$out"; fail "bench gemm exited non-zero"; }
grep -q "^OPENBLAS_CORETYPE=SkylakeX .* OPENBLAS_THREAD_TIMEOUT=4$" "$out" ||
  { cat "$out"; fail "no OpenBLAS settings line with the re-exec's defaults"; }
grep -q "^OpenBLAS core: SkylakeX" "$out" || { cat "$out"; fail "OpenBLAS did not run SkylakeX"; }
line=$(grep '"name": "qkv_dx_NT"' "$json") || { cat "$json"; fail "no JSON row for qkv_dx"; }
for field in ours anchor ratio; do
  v=$(echo "$line" | sed -n "s/.*\"$field\": *\([-0-9.e+]*\)[,}].*/\1/p")
  [ -n "$v" ] && awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }' ||
    fail "qkv_dx: no positive $field: $line"
done
if grep -q '"name": "qkv_fwd' "$json"; then fail "--filter qkv_dx ran qkv_fwd"; fi
# A timeout the user set is kept (and so is the re-exec's other default).
OPENBLAS_THREAD_TIMEOUT=6 "$mammoth" bench gemm --quick --reps 1 --threads 1 \
  --filter qkv_dx >"$out" 2>&1 || { cat "$out"; fail "bench gemm with a timeout set failed"; }
grep -q "OPENBLAS_THREAD_TIMEOUT=6$" "$out" || { cat "$out"; fail "the user's timeout was replaced"; }
echo ok
