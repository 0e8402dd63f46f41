// Runtime choice of the vector instruction set for the CPU backend's fused f32 kernels
// (softmax, norms, cross-entropy, attention, AdamW, ...).
//
// Those kernels are written once against a small vector type (simd_avx512.h, simd_avx2.h,
// simd_portable.h) and compiled three times, each translation unit with its own -m flags. The
// best family the CPU supports is picked at run time; tests force the others with
// set_simd_isa. The GEMM has its own switch (gemm.h: set_gemm_isa).
#pragma once

#include <cstdint>

namespace mammoth::kernels::cpu {

enum class SimdIsa { kAuto, kAvx512, kAvx2, kPortable };

// Forces a kernel family (tests, benchmarks). kAuto picks the best the CPU supports.
// Throws mammoth::Error if the CPU lacks the requested ISA.
void set_simd_isa(SimdIsa isa);
// The family the fused kernels use now (never kAuto).
SimdIsa active_simd_isa();
const char* simd_isa_name(SimdIsa isa);
// True if this CPU can run the given family (kAuto and kPortable always can).
bool simd_isa_supported(SimdIsa isa);

// Outputs larger than this many bytes are written with non-temporal stores (default: the
// last-level cache size). Tests set 0 to force that path on small inputs; -1 restores the default.
void set_stream_threshold(int64_t bytes);

}  // namespace mammoth::kernels::cpu
