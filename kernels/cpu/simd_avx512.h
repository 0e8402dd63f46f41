// The 16-lane AVX-512 float vector the fused CPU kernels are written against (see fast_impl.h).
// Only for translation units compiled with -mavx512f -mfma.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/simd_exp_poly.h"

namespace mammoth::kernels::cpu::avx512 {

struct Vec {
  static constexpr int kWidth = 16;
  __m512 v;

  static Vec load(const float* p) { return {_mm512_loadu_ps(p)}; }
  // A load of data arriving from memory (a stream's first read), as two 256-bit halves: on Zen 4
  // a loop streaming from memory runs faster so, while loads that hit the cache pay for the
  // insert (BENCHMARKS.md, "Loads from memory in two 256-bit halves").
  static Vec load_mem(const float* p) {
    return {
        _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(p)), _mm256_loadu_ps(p + 8), 1)};
  }
  // The first n (< kWidth) lanes from p, `fill` in the others; never reads past p + n.
  static Vec load_n(const float* p, int n, float fill = 0.0f) {
    return {_mm512_mask_loadu_ps(_mm512_set1_ps(fill), mask(n), p)};
  }
  static Vec load_bf16(const uint16_t* p) {
    const __m512i w =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
  }
  static Vec load_f16(const uint16_t* p) {
    return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
  }
  void store(float* p) const { _mm512_storeu_ps(p, v); }
  void store_n(float* p, int n) const { _mm512_mask_storeu_ps(p, mask(n), v); }
  // Non-temporal store to a 64-byte aligned p; fence() before other threads read the data.
  void stream(float* p) const { _mm512_stream_ps(p, v); }
  static void fence() { _mm_sfence(); }
  // Rounded to nearest even, NaN kept quiet: the same bits as base's float_to_bf16.
  void store_bf16(uint16_t* p) const {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  void store_f16(uint16_t* p) const {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static Vec set1(float x) { return {_mm512_set1_ps(x)}; }
  static Vec zero() { return {_mm512_setzero_ps()}; }

  static __mmask16 mask(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
};

inline Vec operator+(Vec a, Vec b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Vec operator-(Vec a, Vec b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Vec operator*(Vec a, Vec b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vec operator/(Vec a, Vec b) { return {_mm512_div_ps(a.v, b.v)}; }
inline Vec fma(Vec a, Vec b, Vec c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
// max/min return the second operand when either is NaN; callers put the data there.
inline Vec max(Vec a, Vec b) { return {_mm512_max_ps(a.v, b.v)}; }
inline Vec min(Vec a, Vec b) { return {_mm512_min_ps(a.v, b.v)}; }
inline Vec sqrt(Vec a) { return {_mm512_sqrt_ps(a.v)}; }
inline Vec abs(Vec a) { return {_mm512_abs_ps(a.v)}; }
// Lanes whose sign bit is set (x < 0, or -0) take a, the others b.
inline Vec select_neg(Vec x, Vec a, Vec b) {
  const __mmask16 neg = _mm512_movepi32_mask(_mm512_castps_si512(x.v));
  return {_mm512_mask_blend_ps(neg, b.v, a.v)};
}
// Fixed-order horizontal reductions (so a row's result never depends on anything but the row).
inline float hsum(Vec a) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a.v), _mm512_extractf32x8_ps(a.v, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline float hmax(Vec a) { return _mm512_reduce_max_ps(a.v); }

// p(x) by Horner's rule over the coefficients c, highest degree first (simd_exp_poly.h); the
// fold writes out the same straight-line fmas a hand-written chain would.
template <int N, int... I>
inline __m512 horner(__m512 x, const float (&c)[N], std::integer_sequence<int, I...>) {
  __m512 p = _mm512_set1_ps(c[0]);
  ((p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(c[I + 1]))), ...);
  return p;
}
template <int N>
inline __m512 horner(__m512 x, const float (&c)[N]) {
  return horner(x, c, std::make_integer_sequence<int, N - 1>{});
}

// e^x = 2^n e^r: n = round(x log2 e), r = x - n ln 2 in two parts (Cody-Waite, so r is exact to
// ~2^-35 for every float x), e^r by a degree-6 minimax polynomial on |r| <= ln2/2 in Horner form
// (its own error ~2e-9). Within 1.5 * 2^-24 relative of e^x over the normal range (tested);
// e^-inf = 0, NaN stays NaN, overflow gives inf. scalef applies 2^n with correct underflow to
// denormals and zero. kNonPos: the caller guarantees x <= 88 or -inf or NaN (softmax's x - max,
// log-probabilities), which drops the upper clamp; only +inf would come out wrong (NaN).
template <bool kNonPos>
inline __m512 exp_impl(__m512 x) {
  __m512 xc = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);  // e^-104 underflows to 0 anyway
  if constexpr (!kNonPos) xc = _mm512_min_ps(_mm512_set1_ps(88.8f), xc);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), xc);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  const __m512 p = horner(r, kExpPoly);
  return _mm512_scalef_ps(p, n);
}
inline Vec exp(Vec x) { return {exp_impl<false>(x.v)}; }
inline Vec exp_nonpos(Vec x) { return {exp_impl<true>(x.v)}; }

// e^d for d <= 88 near 0 (d = x - m, a softmax numerator: exp_diff; OnlineExp keeps d <= 2),
// cheaper than exp_nonpos(d). t = d log2 e; f = t - floor(t) in [0, 1) by vreduceps; 2^f by a
// degree-5 near-minimax polynomial (2.4 * 2^-24 relative in f32, exactly 1 at f = 0); then
// scalef(p, t), which multiplies by 2^floor(t) itself, so t is never rounded separately. scalef
// underflows to denormals and 0 correctly and needs no clamp; f = 0 for t = -inf, so e^-inf = 0,
// and NaN stays NaN. Eight vector operations. vreduceps and vscalefps each take two issue slots
// of Zen 4's two non-FMA pipes, which set the pace here, so no vroundscaleps is spent on
// rounding t first (BENCHMARKS.md, "exp_diff (AVX-512) multiplies by 2^floor(t)"). The rounding of
// t adds |t| * 2^-24 relative, which only matters where e^(x - m) is already negligible beside the
// row's maximum; within (6 + 2|x - m|) * 2^-24 relative for x - m >= -87 (tested through softmax).
inline Vec exp_near(Vec d) {
  const __m512 t = _mm512_mul_ps(d.v, _mm512_set1_ps(kLog2e));
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 p = horner(f, kExp2FracPoly);
  return {_mm512_scalef_ps(p, t)};
}
inline Vec exp_diff(Vec x, Vec m) { return exp_near(x - m); }

// The larger of a and b compared as int32 bit patterns: for non-negative floats the same as max;
// every negative float is below every non-negative one; NaN with the sign clear is above all. On
// the integer units, which Zen 4 issues on all four vector pipes (max_ps: on the two non-FMA
// ones, which the exponential keeps busy).
inline Vec max_bits(Vec a, Vec b) {
  return {
      _mm512_castsi512_ps(_mm512_max_epi32(_mm512_castps_si512(a.v), _mm512_castps_si512(b.v)))};
}
inline float hmax_bits(Vec a) {
  const int32_t m = _mm512_reduce_max_epi32(_mm512_castps_si512(a.v));
  float f;
  std::memcpy(&f, &m, sizeof f);
  return f;
}

}  // namespace mammoth::kernels::cpu::avx512
