#!/bin/bash
# `mammoth bench gemm --quick`: re-executes itself with OpenBLAS's settings (the kernels that
# match this CPU: SkylakeX with AVX-512, Haswell with AVX2 + FMA; and worker threads that sleep
# after a call instead of spinning on the core our next timed run needs), says so, and writes a
# JSON row with a positive figure, anchor and ratio for the shape --filter selects, and none for
# the others. A setting the user gave is kept. An ISA this CPU lacks is a clear refusal (not
# SIGILL), and the settings line says which Mammoth ISA runs and who chose it.
set -uo pipefail
mammoth="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }
out="$TEST_TMPDIR/out.txt"
json="$TEST_TMPDIR/rows.json"
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
if has avx512f avx512bw avx512vl avx512dq avx512cd fma; then
  core=SkylakeX
elif has avx2 fma; then
  core=Haswell
else
  core=""
fi
env -u OPENBLAS_CORETYPE -u OPENBLAS_THREAD_TIMEOUT -u MAMMOTH_ISA "$mammoth" bench gemm --quick \
  --reps 1 --threads 1 --filter qkv_dx --json "$json" >"$out" 2>&1 ||
  { cat "$out"; fail "bench gemm exited non-zero"; }
if [[ -n "$core" ]]; then
  grep -q "^OPENBLAS_CORETYPE=$core .* OPENBLAS_THREAD_TIMEOUT=4$" "$out" ||
    { cat "$out"; fail "no OpenBLAS settings line with the re-exec's defaults ($core)"; }
  grep -q "^OpenBLAS core choice: $core for this CPU (the CPU has .*)$" "$out" ||
    { cat "$out"; fail "the settings do not say $core was chosen for this CPU"; }
  grep -q "^OpenBLAS core: $core" "$out" || { cat "$out"; fail "OpenBLAS did not run $core"; }
else
  grep -q "^OPENBLAS_CORETYPE=(unset) .* OPENBLAS_THREAD_TIMEOUT=4$" "$out" ||
    { cat "$out"; fail "a CPU without AVX2 + FMA got an OpenBLAS core forced"; }
fi
grep -q "^Mammoth gemm ISA: [a-z0-9]* (best on this CPU)$" "$out" ||
  { cat "$out"; fail "no line saying which Mammoth gemm ISA runs"; }
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
# Forcing an ISA: MAMMOTH_ISA=portable runs anywhere and is named; --isa wins over it. (A
# filter that matches no shape: only the settings lines.)
MAMMOTH_ISA=portable "$mammoth" bench gemm --quick --filter no_such_shape >"$out" 2>&1 ||
  { cat "$out"; fail "bench gemm with MAMMOTH_ISA=portable failed"; }
grep -q "^Mammoth gemm ISA: portable (MAMMOTH_ISA=portable)$" "$out" ||
  { cat "$out"; fail "MAMMOTH_ISA=portable not reported"; }
MAMMOTH_ISA=avx2 "$mammoth" bench gemm --quick --filter no_such_shape --isa portable \
  >"$out" 2>&1 || { cat "$out"; fail "bench gemm --isa portable failed"; }
grep -q "^Mammoth gemm ISA: portable (--isa portable)$" "$out" ||
  { cat "$out"; fail "--isa portable not reported"; }
# An ISA this CPU lacks, by flag or by MAMMOTH_ISA: a message and exit 1 or 2, not a signal.
if ! has avx512f avx512bw avx512vl avx512dq fma; then
  "$mammoth" bench gemm --quick --filter no_such_shape --isa avx512 >"$out" 2>&1
  rc=$?
  [[ $rc -eq 2 ]] || { cat "$out"; fail "--isa avx512 on a CPU without it: exit $rc, not 2"; }
  grep -q "\-\-isa avx512: this CPU cannot run the avx512 GEMM kernels" "$out" ||
    { cat "$out"; fail "--isa avx512: no clear message"; }
  MAMMOTH_ISA=avx512 "$mammoth" bench gemm --quick --filter no_such_shape >"$out" 2>&1
  rc=$?
  [[ $rc -eq 1 ]] || { cat "$out"; fail "MAMMOTH_ISA=avx512 on a CPU without it: exit $rc, not 1"; }
  grep -q "MAMMOTH_ISA=avx512, but this CPU cannot run the avx512 GEMM kernels" "$out" ||
    { cat "$out"; fail "MAMMOTH_ISA=avx512: no clear message"; }
fi
"$mammoth" bench gemm --quick --isa sse9 >"$out" 2>&1
[[ $? -eq 2 ]] && grep -q "unknown --isa 'sse9'" "$out" || { cat "$out"; fail "--isa sse9 accepted"; }
echo ok
