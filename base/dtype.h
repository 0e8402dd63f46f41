// Element types shared by every layer: kernels, memory, engine and file formats.
//
// bf16 and f16 are stored as 16-bit patterns (mammoth::bf16 / mammoth::f16) and computed in
// float; conversions round to nearest even, as PyTorch and the hardware do.
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>

namespace mammoth {

enum class DType : uint8_t { kF32, kF64, kBF16, kF16, kI32, kI64, kU8, kBool };

inline constexpr DType kAllDTypes[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16,
                                       DType::kI32, DType::kI64, DType::kU8,   DType::kBool};

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kU8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

inline bool is_floating(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16 || t == DType::kF16;
}

// Short names used in messages and flags: f32, f64, bf16, f16, i32, i64, u8, bool.
const char* dtype_name(DType t);
// Parses a short name; throws mammoth::Error naming the bad value.
DType dtype_from_name(const std::string& name);
// safetensors' dtype strings: F32, F64, BF16, F16, I32, I64, U8, BOOL.
const char* dtype_safetensors_name(DType t);
// Returns false when `name` is not a safetensors dtype Mammoth supports.
bool dtype_from_safetensors_name(const std::string& name, DType* out);

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

struct bf16 {
  uint16_t bits = 0;
};
struct f16 {
  uint16_t bits = 0;
};

inline float bf16_to_float(bf16 v) {
  uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline bf16 float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  bf16 r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep it a quiet NaN
    r.bits = static_cast<uint16_t>((u >> 16) | 0x40);
    return r;
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  r.bits = static_cast<uint16_t>(u >> 16);
  return r;
}

float f16_to_float(f16 v);
f16 float_to_f16(float f);

}  // namespace mammoth
