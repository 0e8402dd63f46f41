// AVX-512 GEMM micro-kernels (fp32 FMA and AVX512_BF16 vdpbf16ps), compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mfma; only called after
// __builtin_cpu_supports says the CPU has them.
//
// Tile choice for Zen 4: it runs 512-bit FMAs at one per cycle (two 256-bit pipes) with a
// 4-cycle latency, so any tile with >= 8 independent accumulators keeps the FMA units busy and
// the choice is about loads per FMA, edge waste and what stays in cache. Measured against
// 12x32, 14x32 and 8x48 on the GPT-2 shapes, 6 x 64 was best: 24 zmm accumulators, 4 vector
// loads of B and 6 broadcasts of A per k step (24 FMAs). KC = 768 covers the whole K of the
// GPT-2 forward GEMMs (C is written once) with an 18 KB A micro-panel that stays in L1;
// NC = 256 keeps the packed B block (768 KB) in the 1 MB L2; MC = 4096 makes the M = 4096
// shapes pack op(B) once.
#include <immintrin.h>

#include "kernels/cpu/gemm_internal.h"

namespace mammoth::kernels::cpu::internal {
namespace {

#ifndef MAMMOTH_GEMM512_MR
#define MAMMOTH_GEMM512_MR 6
#endif
#ifndef MAMMOTH_GEMM512_NV
#define MAMMOTH_GEMM512_NV 4
#endif
#ifndef MAMMOTH_GEMM512_KC
#define MAMMOTH_GEMM512_KC 768
#endif
#ifndef MAMMOTH_GEMM512_NC
#define MAMMOTH_GEMM512_NC 256
#endif
#ifndef MAMMOTH_GEMM512_MC
#define MAMMOTH_GEMM512_MC 4096
#endif

// Stores one row of accumulators: c = alpha * acc (+ beta * c).
template <int NV>
inline void store_row(__m512 (&acc)[NV], float* c, __m512 alpha, __m512 beta, bool read_c) {
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    __m512 r = _mm512_mul_ps(acc[v], alpha);
    if (read_c) r = _mm512_fmadd_ps(beta, _mm512_loadu_ps(c + 16 * v), r);
    _mm512_storeu_ps(c + 16 * v, r);
  }
}

// fp32: C[MR, 16*NV] (+)= A panel (k-major, MR per k) @ B panel (k-major, 16*NV per k).
template <int MR, int NV>
struct Avx512F32 {
  using Packed = float;
  static constexpr int kMR = MR, kNR = 16 * NV, kKP = 1;
  static constexpr int64_t kKC = MAMMOTH_GEMM512_KC;
  static constexpr int64_t kMC = (MAMMOTH_GEMM512_MC + MR - 1) / MR * MR;
  static constexpr int64_t kNC = MAMMOTH_GEMM512_NC / kNR * kNR;

  static void micro(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                    float beta) {
    __m512 acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
    }
    // Warm the C tile while the k loop runs; it is needed only at the end.
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 16 * v), _MM_HINT_T0);
      }
    }
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; ++k) {
      __m512 bv[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_ps(b + k * kNR + 16 * v);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m512 ai = _mm512_set1_ps(a[k * MR + i]);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
      }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    const bool read_c = beta != 0.0f;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) store_row<NV>(acc[i], c + i * ldc, va, vb, read_c);
  }
};

// bf16: vdpbf16ps multiplies bf16 pairs along k and accumulates in fp32, so the panels hold
// k in pairs (kKP = 2): a broadcast 32-bit word of A is (a[i][k], a[i][k+1]) and a B vector is
// 16 columns x 2 k.
template <int MR, int NV>
struct Avx512Bf16 {
  using Packed = uint16_t;
  static constexpr int kMR = MR, kNR = 16 * NV, kKP = 2;
  static constexpr int64_t kKC = 2 * MAMMOTH_GEMM512_KC;
  static constexpr int64_t kMC = (MAMMOTH_GEMM512_MC + MR - 1) / MR * MR;
  static constexpr int64_t kNC = MAMMOTH_GEMM512_NC / kNR * kNR;

  static void micro(int64_t kcp, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc,
                    float alpha, float beta) {
    __m512 acc[MR][NV];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 16 * v), _MM_HINT_T0);
      }
    }
    const int64_t pairs = kcp / 2;
#pragma GCC unroll 4
    for (int64_t p = 0; p < pairs; ++p) {
      __m512bh bv[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) {
        bv[v] = (__m512bh)_mm512_load_si512(b + p * 2 * kNR + 32 * v);
      }
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        int32_t word;
        __builtin_memcpy(&word, a + p * 2 * MR + 2 * i, sizeof(word));
        const __m512bh ai = (__m512bh)_mm512_set1_epi32(word);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], ai, bv[v]);
      }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
    const bool read_c = beta != 0.0f;
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) store_row<NV>(acc[i], c + i * ldc, va, vb, read_c);
  }
};

using F32Kernel = Avx512F32<MAMMOTH_GEMM512_MR, MAMMOTH_GEMM512_NV>;
using Bf16Kernel = Avx512Bf16<MAMMOTH_GEMM512_MR, MAMMOTH_GEMM512_NV>;

void sgemm_avx512(const GemmArgs<float>& args, const GemmEpilogue& ep) {
  gemm_serial<F32Kernel>(args, ep);
}

void gemm_bf16_avx512(const GemmArgs<uint16_t>& args) {
  // Without AVX512_BF16, convert to fp32 while packing and use the fp32 kernel.
  static const bool has_bf16 = __builtin_cpu_supports("avx512bf16");
  if (has_bf16 && bf16_dot_allowed()) {
    gemm_serial<Bf16Kernel>(args, GemmEpilogue{});
  } else {
    gemm_serial<F32Kernel>(args, GemmEpilogue{});
  }
}

}  // namespace

const GemmKernels& avx512_kernels() {
  static const GemmKernels k{F32Kernel::kMR, F32Kernel::kNR, &sgemm_avx512, &gemm_bf16_avx512};
  return k;
}

}  // namespace mammoth::kernels::cpu::internal
