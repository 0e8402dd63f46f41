// AVX2 + FMA GEMM micro-kernel, compiled with -mavx2 -mfma; used on CPUs without AVX-512 (and
// forced by tests). 6 x 16 is the classic Haswell tile: 12 ymm accumulators, 2 B loads and
// 6 A broadcasts per k step, leaving registers for the B vectors and a broadcast. Zen 4 runs
// two 256-bit FMAs per cycle, so this path reaches the same peak as AVX-512 there. Blocking
// (measured on the GPT-2 shapes): KC = 768 (an 18 KB A micro-panel in L1, whole K for the
// forward GEMMs), NC = 256 (768 KB packed B block in L2), MC = 4096 rows.
#include <immintrin.h>

#include "kernels/cpu/gemm_internal.h"

namespace mammoth::kernels::cpu::internal {
namespace {

#ifndef MAMMOTH_GEMM256_KC
#define MAMMOTH_GEMM256_KC 768
#endif
#ifndef MAMMOTH_GEMM256_NC
#define MAMMOTH_GEMM256_NC 256
#endif

template <int MR, int NV>
struct Avx2F32 {
  using Packed = float;
  static constexpr int kMR = MR, kNR = 8 * NV, kKP = 1;
  static constexpr int64_t kKC = MAMMOTH_GEMM256_KC;
  static constexpr int64_t kMC = (4096 + MR - 1) / MR * MR;
  static constexpr int64_t kNC = MAMMOTH_GEMM256_NC / kNR * kNR;

  static void micro(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                    float beta) {
    __m256 acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_setzero_ps();
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
      _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; ++k) {
      __m256 bv[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) bv[v] = _mm256_load_ps(b + k * kNR + 8 * v);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m256 ai = _mm256_broadcast_ss(a + k * MR + i);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(ai, bv[v], acc[i][v]);
      }
    }
    const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
    const bool read_c = beta != 0.0f;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float* crow = c + i * ldc;
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        __m256 r = _mm256_mul_ps(acc[i][v], va);
        if (read_c) r = _mm256_fmadd_ps(vb, _mm256_loadu_ps(crow + 8 * v), r);
        _mm256_storeu_ps(crow + 8 * v, r);
      }
    }
  }
};

using F32Kernel = Avx2F32<6, 2>;

void sgemm_avx2(const GemmArgs<float>& args, const GemmEpilogue& ep) {
  gemm_serial<F32Kernel>(args, ep);
}

// No bf16 arithmetic in AVX2: convert to fp32 while packing.
void gemm_bf16_avx2(const GemmArgs<uint16_t>& args) {
  gemm_serial<F32Kernel>(args, GemmEpilogue{});
}

}  // namespace

const GemmKernels& avx2_kernels() {
  static const GemmKernels k{F32Kernel::kMR, F32Kernel::kNR, &sgemm_avx2, &gemm_bf16_avx2};
  return k;
}

}  // namespace mammoth::kernels::cpu::internal
