#!/bin/bash
# `mammoth bench kernels` and `mammoth bench gemm` complete with MAMMOTH_ISA=avx2, as on an
# AVX2-only CPU: every row kernel, attention and GEMM row runs and has a positive figure, and the
# bf16 rows, whose torch anchor needs oneDNN's AVX-512 bf16 (capped at AVX2 to match ours on a
# CPU that has it), either have an anchor or say why not; neither bench stops.
set -uo pipefail
mammoth="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }
field() { echo "$2" | sed -n "s/.*\"$1\": *\([-0-9.e+]*\)[,}].*/\1/p"; }
positive() { local v; v=$(field "$1" "$2"); [ -n "$v" ] && awk -v v="$v" 'BEGIN { exit !(v > 0) }'; }
out="$TEST_TMPDIR/kernels.txt"
json="$TEST_TMPDIR/kernels.json"
# MAMMOTH_PYTHON (when the test runs with it) gives the bf16 rows their torch anchor attempt.
MAMMOTH_ISA=avx2 "$mammoth" bench kernels --quick --reps 1 --threads 1 --row-shape 256x768 \
  --json "$json" >"$out" 2>&1 || { cat "$out"; fail "bench kernels exited non-zero under avx2"; }
grep -q "^mammoth bench kernels: fused kernels avx2, sgemm avx2 (MAMMOTH_ISA=avx2)" "$out" ||
  { cat "$out"; fail "the header does not say avx2 ran"; }
for row in adamw softmax softmax_backward log_softmax layer_norm layer_norm_backward rms_norm \
  cross_entropy cross_entropy_backward gelu_tanh gelu_tanh_backward gelu silu attention_fwd \
  attention_fwd_bwd_causal; do
  line=$(grep "\"name\":\"$row\"," "$json" | head -1) || { cat "$out"; fail "no row $row"; }
  positive ours "$line" || fail "$row: no positive figure: $line"
  positive anchor "$line" || fail "$row: no positive anchor: $line"
done
bf16=$(grep '"name":"gemm_bf16_' "$json") || { cat "$out"; fail "no bf16 GEMM row"; }
while read -r line; do
  positive ours "$line" || fail "bf16 row without a figure: $line"
  positive anchor "$line" || echo "$line" | grep -q '"anchor_error":"[^"]' ||
    fail "bf16 row with neither an anchor nor a reason: $line"
done <<<"$bf16"
if grep -q '^flags.* avx512f ' /proc/cpuinfo; then
  grep -q "^bf16 anchor capped at AVX2 to match ours: ONEDNN_MAX_CPU_ISA=AVX2" "$out" ||
    { cat "$out"; fail "the anchor was not capped at AVX2 on an AVX-512 CPU"; }
fi
out="$TEST_TMPDIR/gemm.txt"
json="$TEST_TMPDIR/gemm.json"
MAMMOTH_ISA=avx2 "$mammoth" bench gemm --quick --reps 1 --threads 1 --json "$json" >"$out" 2>&1 ||
  { cat "$out"; fail "bench gemm exited non-zero under avx2"; }
grep -q "^Mammoth gemm ISA: avx2 (MAMMOTH_ISA=avx2)$" "$out" || { cat "$out"; fail "not avx2"; }
grep -q "%peak against ymm$" "$out" || { cat "$out"; fail "avx2 %peak not against the ymm peak"; }
for row in qkv_fwd_NN qkv_dx_NT qkv_dw_TN; do
  line=$(grep "\"name\": \"$row\"" "$json") || { cat "$out"; fail "no gemm row $row"; }
  for f in ours anchor ratio; do positive "$f" "$line" || fail "$row: no positive $f: $line"; done
done
echo ok
