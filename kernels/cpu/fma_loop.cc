#include "kernels/cpu/fma_loop.h"

namespace mammoth::kernels::cpu {

void run_fma_chains(bool zmm, int64_t iterations) {
  for (int64_t it = 0; it < iterations; ++it) {
    if (zmm) {
      asm volatile(
          "vfmadd231ps %%zmm0, %%zmm1, %%zmm2\n vfmadd231ps %%zmm0, %%zmm1, %%zmm3\n"
          "vfmadd231ps %%zmm0, %%zmm1, %%zmm4\n vfmadd231ps %%zmm0, %%zmm1, %%zmm5\n"
          "vfmadd231ps %%zmm0, %%zmm1, %%zmm6\n vfmadd231ps %%zmm0, %%zmm1, %%zmm7\n"
          "vfmadd231ps %%zmm0, %%zmm1, %%zmm8\n vfmadd231ps %%zmm0, %%zmm1, %%zmm9\n"
          "vfmadd231ps %%zmm0, %%zmm1, %%zmm10\n vfmadd231ps %%zmm0, %%zmm1, %%zmm11\n"
          "vfmadd231ps %%zmm0, %%zmm1, %%zmm12\n vfmadd231ps %%zmm0, %%zmm1, %%zmm13\n" ::
              : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                "xmm10", "xmm11", "xmm12", "xmm13");
    } else {
      asm volatile(
          "vfmadd231ps %%ymm0, %%ymm1, %%ymm2\n vfmadd231ps %%ymm0, %%ymm1, %%ymm3\n"
          "vfmadd231ps %%ymm0, %%ymm1, %%ymm4\n vfmadd231ps %%ymm0, %%ymm1, %%ymm5\n"
          "vfmadd231ps %%ymm0, %%ymm1, %%ymm6\n vfmadd231ps %%ymm0, %%ymm1, %%ymm7\n"
          "vfmadd231ps %%ymm0, %%ymm1, %%ymm8\n vfmadd231ps %%ymm0, %%ymm1, %%ymm9\n"
          "vfmadd231ps %%ymm0, %%ymm1, %%ymm10\n vfmadd231ps %%ymm0, %%ymm1, %%ymm11\n"
          "vfmadd231ps %%ymm0, %%ymm1, %%ymm12\n vfmadd231ps %%ymm0, %%ymm1, %%ymm13\n" ::
              : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
                "xmm10", "xmm11", "xmm12", "xmm13");
    }
  }
}

}  // namespace mammoth::kernels::cpu
