#!/bin/bash
# MAMMOTH_ISA across values: isa_env_test (which reads the variable and checks the kernels
# follow it or refuse it) under each, then the mammoth binary: a job's device line names the
# forced ISA, and a bad value stops the command at start-up with a message naming the variable
# (exit 1, not a signal or a silent fallback).
set -uo pipefail
test_bin="$1"
mammoth="$2"
fail() { echo "FAIL: $*" >&2; exit 1; }
log="${TEST_TMPDIR:-$(mktemp -d)}/isa.log"
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }

# Every value, including ones this CPU cannot run (the test then expects the refusal).
for value in "" auto avx512 avx2 portable AVX2 sse4 "avx2,avx512"; do
  MAMMOTH_ISA="$value" "$test_bin" >"$log" 2>&1 ||
    { cat "$log"; fail "isa_env_test with MAMMOTH_ISA='$value'"; }
  grep -q "All tests passed" "$log" || { cat "$log"; fail "MAMMOTH_ISA='$value': no tests ran"; }
done
env -u MAMMOTH_ISA "$test_bin" >"$log" 2>&1 || { cat "$log"; fail "isa_env_test, MAMMOTH_ISA unset"; }

gen=(generate --model gpt2-tiny --prompt-tokens 1,2,3 --max-new-tokens 1 --device cpu)
if has avx2 fma f16c; then
  MAMMOTH_ISA=avx2 "$mammoth" "${gen[@]}" >/dev/null 2>"$log" ||
    { cat "$log"; fail "generate under MAMMOTH_ISA=avx2"; }
  grep -q "^\[generate\] device: cpu (--device cpu; CPU kernels avx2 (MAMMOTH_ISA=avx2))$" "$log" ||
    { cat "$log"; fail "the device line does not say MAMMOTH_ISA=avx2 runs"; }
fi
env -u MAMMOTH_ISA "$mammoth" "${gen[@]}" >/dev/null 2>"$log" || { cat "$log"; fail "generate"; }
grep -q "^\[generate\] device: cpu (--device cpu; CPU kernels [a-z0-9]* (best on this CPU))$" \
  "$log" || { cat "$log"; fail "the device line does not name the CPU's best ISA"; }

MAMMOTH_ISA=avx3 "$mammoth" "${gen[@]}" >/dev/null 2>"$log"
rc=$?
[[ $rc -eq 1 ]] || { cat "$log"; fail "MAMMOTH_ISA=avx3: expected exit 1, got $rc"; }
grep -q "unknown instruction set MAMMOTH_ISA='avx3': use avx512, avx2, portable or auto" "$log" ||
  { cat "$log"; fail "MAMMOTH_ISA=avx3: no message naming the variable"; }
if ! has avx512f avx512bw avx512vl avx512dq fma; then
  MAMMOTH_ISA=avx512 "$mammoth" "${gen[@]}" >/dev/null 2>"$log"
  rc=$?
  [[ $rc -eq 1 ]] || { cat "$log"; fail "MAMMOTH_ISA=avx512 without AVX-512: exit $rc, not 1"; }
  grep -q "MAMMOTH_ISA=avx512, but this CPU cannot run the avx512 .* kernels" "$log" ||
    { cat "$log"; fail "MAMMOTH_ISA=avx512 without AVX-512: no clear message"; }
fi
echo PASS
