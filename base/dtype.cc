#include "base/dtype.h"

#include "base/error.h"

namespace mammoth {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kBool: return "bool";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  for (DType t : kAllDTypes) {
    if (name == dtype_name(t)) return t;
  }
  MAMMOTH_THROW() << "[dtype] unknown dtype '" << name
                  << "' (expected one of f32, f64, bf16, f16, i32, i64, u8, bool)";
}

const char* dtype_safetensors_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF64: return "F64";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

bool dtype_from_safetensors_name(const std::string& name, DType* out) {
  for (DType t : kAllDTypes) {
    if (name == dtype_safetensors_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

float f16_to_float(f16 v) {
  const uint32_t h = v.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      u = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

f16 float_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  f16 r;
  if (abs > 0x7f800000u) {
    r.bits = static_cast<uint16_t>(sign | 0x7e00u);
    return r;
  }
  if (abs >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    r.bits = static_cast<uint16_t>(sign | 0x7c00u);
    return r;
  }
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) {  // below half the smallest subnormal
      r.bits = static_cast<uint16_t>(sign);
      return r;
    }
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // value / 2^-24 = mant * 2^(exp - 126)
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) ++half;
    r.bits = static_cast<uint16_t>(sign | half);
    return r;
  }
  uint32_t v = abs - 0x38000000u;  // rebias exponent 127 -> 15
  v += 0xfffu + ((v >> 13) & 1u);
  r.bits = static_cast<uint16_t>(sign | (v >> 13));
  return r;
}

}  // namespace mammoth
