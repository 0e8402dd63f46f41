// Tests for base/dtype.h: sizes and names, and bf16/f16 <-> float conversion checked against
// hand-computed bit patterns and an independent nearest-value reference (no PyTorch involved).
#include "base/dtype.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"

namespace {

using mammoth::bf16;
using mammoth::DType;
using mammoth::f16;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

uint16_t bf16_bits(float f) { return mammoth::float_to_bf16(f).bits; }
uint16_t f16_bits(float f) { return mammoth::float_to_f16(f).bits; }
float bf16_value(uint16_t b) { return mammoth::bf16_to_float(bf16{b}); }
float f16_value(uint16_t b) { return mammoth::f16_to_float(f16{b}); }

// IEEE binary16 decoded from its fields with ldexp: a reference independent of dtype.cc.
double f16_reference_value(uint16_t bits) {
  const int sign = bits >> 15;
  const int exp = (bits >> 10) & 0x1f;
  const int mant = bits & 0x3ff;
  double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return sign ? -v : v;
}

// Round-to-nearest-even to binary16 by search over all finite positive values.
uint16_t f16_reference_round(float x) {
  static const std::vector<double> values = [] {
    std::vector<double> v;
    for (uint32_t b = 0; b <= 0x7bff; ++b) v.push_back(f16_reference_value(b));
    return v;
  }();
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  // 65520 = 65504 + half an ulp: the tie goes to the even neighbour, which is infinity.
  if (a >= 65520.0) return sign | 0x7c00;
  const auto it = std::lower_bound(values.begin(), values.end(), a);
  // Between 65504 and 65520 the nearest finite value is 65504 (0x7bff).
  if (it == values.end()) return sign | 0x7bff;
  const uint16_t hi = static_cast<uint16_t>(it - values.begin());
  if (values[hi] == a || hi == 0) return sign | hi;
  const uint16_t lo = hi - 1;
  const double dlo = a - values[lo];
  const double dhi = values[hi] - a;
  if (dlo < dhi) return sign | lo;
  if (dhi < dlo) return sign | hi;
  return sign | ((lo & 1) ? hi : lo);
}

// Round-to-nearest-even to bfloat16: the two candidates are the float truncated to 16 bits and
// the next bfloat16 up; compare distances in double (exact for these magnitudes).
uint16_t bf16_reference_round(float x) {
  const uint32_t u = to_bits(x);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  if ((u & 0xffff) == 0) return lo;
  const double a = std::fabs(static_cast<double>(x));
  const double vlo = std::fabs(static_cast<double>(from_bits(static_cast<uint32_t>(lo) << 16)));
  // Above the largest finite bfloat16 the upper neighbour is infinity, treated as 2^128.
  const double vhi =
      (hi & 0x7fff) == 0x7f80
          ? std::ldexp(1.0, 128)
          : std::fabs(static_cast<double>(from_bits(static_cast<uint32_t>(hi) << 16)));
  const double dlo = a - vlo;
  const double dhi = vhi - a;
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1) ? hi : lo;
}

}  // namespace

TEST_CASE("dtype sizes and names", "[dtype]") {
  REQUIRE(mammoth::dtype_size(DType::kF32) == 4);
  REQUIRE(mammoth::dtype_size(DType::kF64) == 8);
  REQUIRE(mammoth::dtype_size(DType::kBF16) == 2);
  REQUIRE(mammoth::dtype_size(DType::kF16) == 2);
  REQUIRE(mammoth::dtype_size(DType::kI32) == 4);
  REQUIRE(mammoth::dtype_size(DType::kI64) == 8);
  REQUIRE(mammoth::dtype_size(DType::kU8) == 1);
  REQUIRE(mammoth::dtype_size(DType::kBool) == 1);
  REQUIRE(mammoth::is_floating(DType::kBF16));
  REQUIRE_FALSE(mammoth::is_floating(DType::kI64));

  for (DType t : mammoth::kAllDTypes) {
    REQUIRE(mammoth::dtype_from_name(mammoth::dtype_name(t)) == t);
    DType parsed = DType::kBool;
    REQUIRE(mammoth::dtype_from_safetensors_name(mammoth::dtype_safetensors_name(t), &parsed));
    REQUIRE(parsed == t);
  }
  REQUIRE(std::string(mammoth::dtype_name(DType::kBF16)) == "bf16");
  REQUIRE(std::string(mammoth::dtype_safetensors_name(DType::kBF16)) == "BF16");
  DType unused = DType::kF32;
  REQUIRE_FALSE(mammoth::dtype_from_safetensors_name("F8_E4M3", &unused));
  REQUIRE_THROWS_WITH(mammoth::dtype_from_name("float17"),
                      Catch::Matchers::Contains("[dtype] unknown dtype 'float17'"));
}

TEST_CASE("bf16 hand-computed values", "[dtype][bf16]") {
  REQUIRE(bf16_bits(1.0f) == 0x3f80);
  REQUIRE(bf16_bits(-2.0f) == 0xc000);
  REQUIRE(bf16_bits(0.0f) == 0x0000);
  REQUIRE(bf16_bits(-0.0f) == 0x8000);
  REQUIRE(bf16_value(0x4049) == 3.140625f);
  REQUIRE(bf16_bits(3.14159265f) == 0x4049);
  // Ties go to the even mantissa: 1 + 2^-8 sits halfway between 0x3f80 and 0x3f81.
  REQUIRE(bf16_bits(from_bits(0x3f808000)) == 0x3f80);
  REQUIRE(bf16_bits(from_bits(0x3f818000)) == 0x3f82);
  REQUIRE(bf16_bits(from_bits(0x3f808001)) == 0x3f81);
  REQUIRE(bf16_bits(from_bits(0x3f807fff)) == 0x3f80);
  REQUIRE(bf16_bits(from_bits(0xbf818000)) == 0xbf82);
  // Largest float rounds up to infinity; infinities stay infinities.
  REQUIRE(bf16_bits(std::numeric_limits<float>::max()) == 0x7f80);
  REQUIRE(bf16_bits(from_bits(0x7f7f7fff)) == 0x7f7f);
  REQUIRE(bf16_bits(std::numeric_limits<float>::infinity()) == 0x7f80);
  REQUIRE(bf16_bits(-std::numeric_limits<float>::infinity()) == 0xff80);
  // Subnormals: the smallest bf16 subnormal is 2^-133 (float bits 0x00010000).
  REQUIRE(bf16_bits(from_bits(0x00010000)) == 0x0001);
  REQUIRE(bf16_value(0x0001) == std::ldexp(1.0f, -133));
  REQUIRE(bf16_bits(from_bits(0x00008000)) == 0x0000);  // tie to even (zero)
  REQUIRE(bf16_bits(from_bits(0x00018000)) == 0x0002);  // tie to even (up)
  REQUIRE(bf16_bits(from_bits(0x00000001)) == 0x0000);
  REQUIRE(bf16_bits(from_bits(0x007fffff)) == 0x0080);  // largest subnormal -> smallest normal
}

TEST_CASE("bf16 NaN stays NaN, never becomes infinity", "[dtype][bf16]") {
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu}) {
    const uint16_t b = bf16_bits(from_bits(u));
    INFO("float bits " << std::hex << u << " -> bf16 " << b);
    REQUIRE((b & 0x7f80) == 0x7f80);
    REQUIRE((b & 0x007f) != 0);
    REQUIRE(std::isnan(bf16_value(b)));
    REQUIRE((b & 0x8000) == ((u >> 16) & 0x8000));
  }
}

TEST_CASE("bf16 round trip of every pattern", "[dtype][bf16]") {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = bf16_value(static_cast<uint16_t>(b));
    REQUIRE(to_bits(f) == b << 16);
    if (std::isnan(f)) {
      REQUIRE(std::isnan(bf16_value(bf16_bits(f))));
    } else if (bf16_bits(f) != b) {
      FAIL("bf16 " << std::hex << b << " round-tripped to " << bf16_bits(f));
    }
  }
}

TEST_CASE("bf16 rounding matches the nearest-even reference", "[dtype][bf16]") {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<uint32_t> any_bits;
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = any_bits(rng);
    // Every 4th sample is an exact tie, where an off-by-one rounding rule shows.
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;
    const float x = from_bits(u);
    if (std::isnan(x)) continue;
    const uint16_t got = bf16_bits(x);
    const uint16_t want = bf16_reference_round(x);
    if (got != want) FAIL("float bits " << std::hex << u << ": bf16 " << got << ", want " << want);
  }
}

TEST_CASE("f16 hand-computed values", "[dtype][f16]") {
  REQUIRE(f16_bits(1.0f) == 0x3c00);
  REQUIRE(f16_bits(-2.0f) == 0xc000);
  REQUIRE(f16_bits(0.0f) == 0x0000);
  REQUIRE(f16_bits(-0.0f) == 0x8000);
  REQUIRE(f16_bits(0.1f) == 0x2e66);
  REQUIRE(f16_value(0x2e66) == 0.0999755859375f);
  REQUIRE(f16_bits(65504.0f) == 0x7bff);
  REQUIRE(f16_bits(65519.0f) == 0x7bff);
  REQUIRE(f16_bits(65520.0f) == 0x7c00);  // tie between 65504 (odd) and 65536: overflow
  REQUIRE(f16_bits(1e6f) == 0x7c00);
  REQUIRE(f16_bits(-1e6f) == 0xfc00);
  REQUIRE(f16_value(0x7c00) == std::numeric_limits<float>::infinity());
  REQUIRE(f16_value(0xfc00) == -std::numeric_limits<float>::infinity());
  REQUIRE(f16_bits(std::numeric_limits<float>::infinity()) == 0x7c00);
  // Ties to even in the normal range: 1 + 2^-11 is halfway between 0x3c00 and 0x3c01.
  REQUIRE(f16_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);
  REQUIRE(f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);
  REQUIRE(f16_bits(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3c01);
  // Subnormals: 2^-24 is the smallest, 0x03ff the largest, 0x0400 = 2^-14 the smallest normal.
  REQUIRE(f16_bits(std::ldexp(1.0f, -24)) == 0x0001);
  REQUIRE(f16_value(0x0001) == std::ldexp(1.0f, -24));
  REQUIRE(f16_value(0x03ff) == 1023 * std::ldexp(1.0f, -24));
  REQUIRE(f16_value(0x0400) == std::ldexp(1.0f, -14));
  REQUIRE(f16_bits(std::ldexp(1.0f, -25)) == 0x0000);      // tie to even (zero)
  REQUIRE(f16_bits(3 * std::ldexp(1.0f, -25)) == 0x0002);  // tie to even (up)
  REQUIRE(f16_bits(std::ldexp(1.0f, -25) * 1.0001f) == 0x0001);
  REQUIRE(f16_bits(std::ldexp(1.0f, -26)) == 0x0000);
  REQUIRE(f16_bits(-std::ldexp(1.0f, -26)) == 0x8000);
  REQUIRE(f16_bits(1023.5f * std::ldexp(1.0f, -24)) == 0x0400);  // rounds into the normals
  REQUIRE(f16_bits(1022.5f * std::ldexp(1.0f, -24)) == 0x03fe);
  REQUIRE(f16_bits(-5 * std::ldexp(1.0f, -24)) == 0x8005);
}

TEST_CASE("f16 NaN stays NaN", "[dtype][f16]") {
  for (uint32_t u : {0x7fc00000u, 0x7f800001u, 0xffc00000u, 0x7f801fffu}) {
    const uint16_t h = f16_bits(from_bits(u));
    INFO("float bits " << std::hex << u << " -> f16 " << h);
    REQUIRE((h & 0x7c00) == 0x7c00);
    REQUIRE((h & 0x03ff) != 0);
    REQUIRE(std::isnan(f16_value(h)));
  }
  REQUIRE(std::isnan(f16_value(0x7e00)));
  REQUIRE(std::isnan(f16_value(0x7c01)));
}

TEST_CASE("f16 decodes every pattern like the field-wise reference", "[dtype][f16]") {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    const float f = f16_value(b);
    const int exp = (h >> 10) & 0x1f;
    if (exp == 0x1f) {
      REQUIRE(((h & 0x3ff) != 0) == std::isnan(f));
      continue;
    }
    if (static_cast<double>(f) != f16_reference_value(b)) {
      FAIL("f16 " << std::hex << h << " decoded to " << f);
    }
    if (f16_bits(f) != b) FAIL("f16 " << std::hex << h << " round-tripped to " << f16_bits(f));
  }
}

TEST_CASE("f16 rounding matches the nearest-even reference", "[dtype][f16]") {
  std::mt19937 rng(99);
  // Exponents from far below the subnormals to above the overflow threshold.
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-28, 17);
  std::uniform_int_distribution<uint32_t> tie_pattern(0, 0x7bfe);
  for (int i = 0; i < 200000; ++i) {
    float x = std::ldexp(mantissa(rng), exponent(rng));
    if (i % 2) x = -x;
    if (i % 5 == 0) {
      // Exactly halfway between two neighbouring f16 values (exact in float).
      const uint16_t lo = static_cast<uint16_t>(tie_pattern(rng));
      x = static_cast<float>((f16_reference_value(lo) + f16_reference_value(lo + 1)) / 2);
    }
    const uint16_t got = f16_bits(x);
    const uint16_t want = f16_reference_round(x);
    if (got != want) {
      FAIL("x = " << x << " (bits " << std::hex << to_bits(x) << "): f16 " << got << ", want "
                  << want);
    }
  }
}
