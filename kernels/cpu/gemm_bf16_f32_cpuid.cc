// gemm_bf16_f32_supported() and _enabled(), in their own translation unit compiled without
// AVX-512 flags so the checks themselves run on any x86-64 CPU.
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_bf16_f32.h"
#include "kernels/cpu/gemm_internal.h"

namespace mammoth::kernels::cpu {

bool gemm_bf16_f32_supported() {
#if defined(__x86_64__)
  static const bool supported =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bf16");
  return supported;
#else
  return false;
#endif
}

bool gemm_bf16_f32_enabled() {
  return gemm_bf16_f32_supported() && active_gemm_isa() == GemmIsa::kAvx512 &&
         internal::bf16_dot_allowed();
}

}  // namespace mammoth::kernels::cpu
