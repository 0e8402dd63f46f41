// The 8-lane AVX2 float vector the fused CPU kernels are written against (see fast_impl.h).
// Only for translation units compiled with -mavx2 -mfma -mf16c.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/simd_exp_poly.h"

namespace mammoth::kernels::cpu::avx2 {

struct Vec {
  static constexpr int kWidth = 8;
  __m256 v;

  static Vec load(const float* p) { return {_mm256_loadu_ps(p)}; }
  // Data arriving from memory (see simd_avx512.h); the same as load here.
  static Vec load_mem(const float* p) { return load(p); }
  // The first n (< kWidth) lanes from p, `fill` in the others; never reads past p + n.
  static Vec load_n(const float* p, int n, float fill = 0.0f) {
    const __m256i m = mask(n);
    return {
        _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, m), _mm256_castsi256_ps(m))};
  }
  static Vec load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(w, 16))};
  }
  static Vec load_f16(const uint16_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
  }
  void store(float* p) const { _mm256_storeu_ps(p, v); }
  void store_n(float* p, int n) const { _mm256_maskstore_ps(p, mask(n), v); }
  // Non-temporal store to a 32-byte aligned p; fence() before other threads read the data.
  void stream(float* p) const { _mm256_stream_ps(p, v); }
  static void fence() { _mm_sfence(); }
  // Rounded to nearest even, NaN kept quiet: the same bits as base's float_to_bf16.
  void store_bf16(uint16_t* p) const {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    // |u| > inf as signed compare is safe: both sides are below 2^31 after the mask.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  void store_f16(uint16_t* p) const {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static Vec set1(float x) { return {_mm256_set1_ps(x)}; }
  static Vec zero() { return {_mm256_setzero_ps()}; }

  static __m256i mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
};

inline Vec operator+(Vec a, Vec b) { return {_mm256_add_ps(a.v, b.v)}; }
inline Vec operator-(Vec a, Vec b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline Vec operator*(Vec a, Vec b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline Vec operator/(Vec a, Vec b) { return {_mm256_div_ps(a.v, b.v)}; }
inline Vec fma(Vec a, Vec b, Vec c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
// max/min return the second operand when either is NaN; callers put the data there.
inline Vec max(Vec a, Vec b) { return {_mm256_max_ps(a.v, b.v)}; }
inline Vec min(Vec a, Vec b) { return {_mm256_min_ps(a.v, b.v)}; }
inline Vec sqrt(Vec a) { return {_mm256_sqrt_ps(a.v)}; }
inline Vec abs(Vec a) { return {_mm256_andnot_ps(_mm256_set1_ps(-0.0f), a.v)}; }
// Lanes whose sign bit is set (x < 0, or -0) take a, the others b.
inline Vec select_neg(Vec x, Vec a, Vec b) { return {_mm256_blendv_ps(b.v, a.v, x.v)}; }
// Fixed-order horizontal reductions (so a row's result never depends on anything but the row).
inline float hsum(Vec a) {
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
inline float hmax(Vec a) {
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}

// p(x) by Horner's rule over the coefficients c, highest degree first (simd_exp_poly.h); the
// fold writes out the same straight-line fmas a hand-written chain would.
template <int N, int... I>
inline __m256 horner(__m256 x, const float (&c)[N], std::integer_sequence<int, I...>) {
  __m256 p = _mm256_set1_ps(c[0]);
  ((p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(c[I + 1]))), ...);
  return p;
}
template <int N>
inline __m256 horner(__m256 x, const float (&c)[N]) {
  return horner(x, c, std::make_integer_sequence<int, N - 1>{});
}

// e^x = 2^n e^r as in simd_avx512.h (Cody-Waite reduction, degree-6 minimax polynomial on
// |r| <= ln2/2, within 1.5 * 2^-24 relative). 2^n is built in the exponent bits, valid for
// normal results only, so underflow (incl. -inf) is set to 0 and overflow to inf afterwards;
// NaN stays NaN. kNonPos: the caller guarantees x <= 88 or -inf or NaN (see avx512's), which
// drops the overflow handling; only +inf would come out wrong.
template <bool kNonPos>
inline __m256 exp_impl(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f), hi = _mm256_set1_ps(88.72283f);
  __m256 xc = _mm256_max_ps(lo, x);
  if constexpr (!kNonPos) xc = _mm256_min_ps(hi, xc);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  const __m256 p = horner(r, kExpPoly);
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i bias = _mm256_set1_epi32(127);
  __m256 y;
  if constexpr (kNonPos) {
    // n <= 127: 2^n is a normal float.
    y = _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, bias), 23)));
  } else {
    // n is in [-126, 128] and 2^128 is not a float, so 2^n is applied in two normal halves.
    const __m256i n1 = _mm256_srai_epi32(ni, 1);
    const __m256i n2 = _mm256_sub_epi32(ni, n1);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  }
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, lo, _CMP_LT_OQ));
  if constexpr (!kNonPos) {
    y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  }
  return y;
}
inline Vec exp(Vec x) { return {exp_impl<false>(x.v)}; }
inline Vec exp_nonpos(Vec x) { return {exp_impl<true>(x.v)}; }
// e^d for d <= 88 near 0 (d = x - m, a softmax numerator: exp_diff), cheaper than
// exp_nonpos(d), as simd_avx512.h's exp_near: t = d log2 e, f = t - floor(t) in [0, 1), 2^f by
// the same degree-5 polynomial (p in [1, 2)), then floor(t) added to p's exponent bits: an
// integer add, which any vector pipe issues, where a multiply by 2^floor(t) would take one of the
// two FMA pipes the polynomial keeps busy (9% faster in a loop of exp_near alone, Zen 4). t is
// held at -127 or above: -inf (and d below -88.03) gives f = 0, p = 1 and exactly +0; for t in
// (-127, -126) the exponent field becomes 0 and the result a denormal within 2^-127 of e^d. NaN
// stays NaN (max returns its second operand, t; NaN's bits plus 0). Twelve operations against
// exp_nonpos's seventeen; within (6 + 2|d|) * 2^-24 relative above 2^-126, as avx512's.
inline Vec exp_near(Vec d) {
  const __m256 t =
      _mm256_max_ps(_mm256_set1_ps(-127.0f), _mm256_mul_ps(d.v, _mm256_set1_ps(kLog2e)));
  const __m256 fl = _mm256_floor_ps(t);
  const __m256 f = _mm256_sub_ps(t, fl);
  const __m256 p = horner(f, kExp2FracPoly);
  const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(fl), 23);
  return {_mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e))};
}
inline Vec exp_diff(Vec x, Vec m) { return exp_near(x - m); }
// max of a and b as int32 bit patterns (see simd_avx512.h).
inline Vec max_bits(Vec a, Vec b) {
  return {
      _mm256_castsi256_ps(_mm256_max_epi32(_mm256_castps_si256(a.v), _mm256_castps_si256(b.v)))};
}
inline float hmax_bits(Vec a) {
  int32_t v[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(v), _mm256_castps_si256(a.v));
  int32_t m = v[0];
  for (int i = 1; i < 8; ++i) m = v[i] > m ? v[i] : m;
  float f;
  std::memcpy(&f, &m, sizeof f);
  return f;
}

}  // namespace mammoth::kernels::cpu::avx2
