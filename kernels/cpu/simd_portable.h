// The portable float "vector" the fused CPU kernels are written against (see fast_impl.h):
// 8 lanes as a plain array, loops the compiler may vectorise with the baseline ISA, libm's
// exp. The fallback for CPUs without AVX2, and a second reference in tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/dtype.h"

namespace mammoth::kernels::cpu::portable {

struct Vec {
  static constexpr int kWidth = 8;
  float v[kWidth];

  static Vec load(const float* p) {
    Vec r;
    for (int i = 0; i < kWidth; ++i) r.v[i] = p[i];
    return r;
  }
  // Data arriving from memory (see simd_avx512.h); the same as load here.
  static Vec load_mem(const float* p) { return load(p); }
  static Vec load_n(const float* p, int n, float fill = 0.0f) {
    Vec r;
    for (int i = 0; i < kWidth; ++i) r.v[i] = i < n ? p[i] : fill;
    return r;
  }
  static Vec load_bf16(const uint16_t* p) {
    Vec r;
    for (int i = 0; i < kWidth; ++i) r.v[i] = bf16_to_float(bf16{p[i]});
    return r;
  }
  static Vec load_f16(const uint16_t* p) {
    Vec r;
    for (int i = 0; i < kWidth; ++i) r.v[i] = f16_to_float(f16{p[i]});
    return r;
  }
  void store(float* p) const {
    for (int i = 0; i < kWidth; ++i) p[i] = v[i];
  }
  void store_n(float* p, int n) const {
    for (int i = 0; i < n; ++i) p[i] = v[i];
  }
  // No non-temporal stores here: a plain store.
  void stream(float* p) const { store(p); }
  static void fence() {}
  void store_bf16(uint16_t* p) const {
    for (int i = 0; i < kWidth; ++i) p[i] = float_to_bf16(v[i]).bits;
  }
  void store_f16(uint16_t* p) const {
    for (int i = 0; i < kWidth; ++i) p[i] = float_to_f16(v[i]).bits;
  }
  static Vec set1(float x) {
    Vec r;
    for (int i = 0; i < kWidth; ++i) r.v[i] = x;
    return r;
  }
  static Vec zero() { return set1(0.0f); }
};

template <typename F>
inline Vec map2(Vec a, Vec b, F f) {
  Vec r;
  for (int i = 0; i < Vec::kWidth; ++i) r.v[i] = f(a.v[i], b.v[i]);
  return r;
}
inline Vec operator+(Vec a, Vec b) {
  return map2(a, b, [](float x, float y) { return x + y; });
}
inline Vec operator-(Vec a, Vec b) {
  return map2(a, b, [](float x, float y) { return x - y; });
}
inline Vec operator*(Vec a, Vec b) {
  return map2(a, b, [](float x, float y) { return x * y; });
}
inline Vec operator/(Vec a, Vec b) {
  return map2(a, b, [](float x, float y) { return x / y; });
}
inline Vec fma(Vec a, Vec b, Vec c) { return a * b + c; }
// Same NaN convention as the x86 instructions: the second operand wins when either is NaN.
inline Vec max(Vec a, Vec b) {
  return map2(a, b, [](float x, float y) { return x > y ? x : y; });
}
inline Vec min(Vec a, Vec b) {
  return map2(a, b, [](float x, float y) { return x < y ? x : y; });
}
inline Vec sqrt(Vec a) {
  for (float& x : a.v) x = std::sqrt(x);
  return a;
}
inline Vec abs(Vec a) {
  for (float& x : a.v) x = std::fabs(x);
  return a;
}
// Lanes whose sign bit is set (x < 0, or -0) take a, the others b.
inline Vec select_neg(Vec x, Vec a, Vec b) {
  for (int i = 0; i < Vec::kWidth; ++i) a.v[i] = std::signbit(x.v[i]) ? a.v[i] : b.v[i];
  return a;
}
inline Vec exp(Vec a) {
  for (float& x : a.v) x = std::exp(x);
  return a;
}
// exp for arguments known to be <= 88 (see simd_avx512.h); here simply exp.
inline Vec exp_nonpos(Vec a) { return exp(a); }
// e^d for d <= 88, and e^(x - m) (softmax numerators; simd_avx512.h has a cheaper form).
inline Vec exp_near(Vec d) { return exp_nonpos(d); }
inline Vec exp_diff(Vec x, Vec m) { return exp_near(x - m); }
// max of a and b as int32 bit patterns (see simd_avx512.h).
inline int32_t float_bits(float f) {
  int32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}
inline Vec max_bits(Vec a, Vec b) {
  for (int i = 0; i < Vec::kWidth; ++i) {
    if (float_bits(b.v[i]) > float_bits(a.v[i])) a.v[i] = b.v[i];
  }
  return a;
}
inline float hmax_bits(Vec a) {
  float m = a.v[0];
  for (int i = 1; i < Vec::kWidth; ++i) m = float_bits(a.v[i]) > float_bits(m) ? a.v[i] : m;
  return m;
}
// Fixed-order horizontal reductions (pairwise, like the x86 versions).
inline float hsum(Vec a) {
  return ((a.v[0] + a.v[4]) + (a.v[2] + a.v[6])) + ((a.v[1] + a.v[5]) + (a.v[3] + a.v[7]));
}
inline float hmax(Vec a) {
  float m = a.v[0];
  for (int i = 1; i < Vec::kWidth; ++i) m = a.v[i] > m ? a.v[i] : m;
  return m;
}

}  // namespace mammoth::kernels::cpu::portable
