// Internals shared by the GEMM translation units: the serial blocked driver (a template over
// the micro-kernel), the packing routines and the per-ISA kernel tables.
//
// Every ISA file (gemm_avx512.cc, gemm_avx2.cc, and gemm.cc for the portable path) includes
// this header and instantiates gemm_serial with its own micro-kernel type, so the driver and
// the packing loops are compiled (and auto-vectorised) with that file's -m flags. Kernel types
// live in each file's anonymous namespace, which makes every instantiation a distinct symbol:
// the helpers below them sit in an anonymous namespace for the same reason (see there).
//
// Blocking (one thread's view; threads get independent row or column slabs of C):
//   for pc in K step KC:                 beta is applied on the first K block only
//     for ic in M step MC:  pack op(A)[ic:+MC, pc:+KC] into MR-row panels   (~L3)
//       for jc in N step NC:  pack op(B)[pc:+KC, jc:+NC] into NR-col panels (~L2)
//         for ir in MC step MR:          the A micro-panel (MR x KC) is reused across jr
//           for jr in NC step NR:  micro-kernel: C[MR,NR] (+)= A panel @ B panel
// Panels are zero-padded to full MR / NR (and to the kernel's k granularity), so there is one
// micro-kernel; edge tiles are computed into a scratch tile and copied out.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "base/scratch.h"
#include "kernels/cpu/gemm.h"

namespace mammoth::kernels::cpu::internal {

// One serial GEMM call with inputs of type In (float, or uint16_t holding bf16 bits).
template <typename In>
struct GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f;
  const In* A = nullptr;
  int64_t lda = 0;
  const In* B = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  float* C = nullptr;
  int64_t ldc = 0;
};

// What one ISA file provides. mr/nr are the fp32 micro-tile so the threading code can cut C
// along tile boundaries.
struct GemmKernels {
  int mr = 1;
  int nr = 1;
  void (*sgemm)(const GemmArgs<float>& args, const GemmEpilogue& epilogue) = nullptr;
  void (*gemm_bf16)(const GemmArgs<uint16_t>& args) = nullptr;
};

const GemmKernels& portable_kernels();
const GemmKernels& avx2_kernels();
const GemmKernels& avx512_kernels();

// Tests only: false makes the AVX-512 path convert bf16 to fp32 even on CPUs with AVX512_BF16,
// so the conversion path is covered on this machine too. Defined in gemm.cc.
void set_bf16_dot_allowed(bool allowed);
bool bf16_dot_allowed();

// Everything below is compiled once per ISA file with that file's -m flags. It sits in an
// anonymous namespace so each translation unit keeps its own copy: with ordinary inline
// functions or templates (pack_a<6, 1, float, float> is instantiated by both the AVX2 and the
// AVX-512 file) the linker would keep one copy for all, and an AVX-512 copy could then run on
// a CPU that only has AVX2.
namespace {

inline float bf16_bits_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

template <typename In, typename Packed>
inline Packed convert_element(In x) {
  if constexpr (sizeof(In) == 2 && sizeof(Packed) == 4) {
    return bf16_bits_to_float(x);
  } else {
    return static_cast<Packed>(x);
  }
}

// Packs op(A)[i0:i0+mc, p0:p0+kc] into ceil(mc/MR) panels of kcp*MR elements, kcp = kc
// rounded up to KP. Element (i, k) of a panel sits at (k/KP)*MR*KP + i*KP + k%KP, so a
// KP-wide k group of one row is contiguous (KP = 2 for the bf16 dot-product kernel).
template <int MR, int KP, typename In, typename Packed>
inline void pack_a(bool trans, const In* A, int64_t lda, int64_t i0, int64_t mc, int64_t p0,
                   int64_t kc, Packed* dst) {
  const int64_t kcp = (kc + KP - 1) / KP * KP;
  for (int64_t ip = 0; ip < mc; ip += MR) {
    const int64_t rows = std::min<int64_t>(MR, mc - ip);
    Packed* panel = dst + (ip / MR) * kcp * MR;
    if (rows < MR || kcp != kc) std::memset(panel, 0, sizeof(Packed) * kcp * MR);
    if (!trans && rows == MR) {
      // Row i of op(A) is contiguous in k: read MR rows side by side so the panel is written
      // sequentially (this packing dominates when N is one or two panels wide).
      const In* src = A + (i0 + ip) * lda + p0;
      for (int64_t k = 0; k < kc; ++k) {
        Packed* d = panel + (k / KP) * MR * KP + k % KP;
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) d[i * KP] = convert_element<In, Packed>(src[i * lda + k]);
      }
    } else if (!trans) {
      for (int64_t i = 0; i < rows; ++i) {
        const In* src = A + (i0 + ip + i) * lda + p0;
        for (int64_t k = 0; k < kc; ++k) {
          panel[(k / KP) * MR * KP + i * KP + k % KP] = convert_element<In, Packed>(src[k]);
        }
      }
    } else {
      // op(A)[i, k] = A[k, i]: a k step of the panel is a contiguous run of A's row k.
      for (int64_t k = 0; k < kc; ++k) {
        const In* src = A + (p0 + k) * lda + i0 + ip;
        Packed* d = panel + (k / KP) * MR * KP + k % KP;
        for (int64_t i = 0; i < rows; ++i) d[i * KP] = convert_element<In, Packed>(src[i]);
      }
    }
  }
}

// Packs op(B)[p0:p0+kc, j0:j0+nc] into ceil(nc/NR) panels; element (k, j) of a panel sits at
// (k/KP)*NR*KP + j*KP + k%KP.
template <int NR, int KP, typename In, typename Packed>
inline void pack_b(bool trans, const In* B, int64_t ldb, int64_t p0, int64_t kc, int64_t j0,
                   int64_t nc, Packed* dst) {
  const int64_t kcp = (kc + KP - 1) / KP * KP;
  for (int64_t jp = 0; jp < nc; jp += NR) {
    const int64_t cols = std::min<int64_t>(NR, nc - jp);
    Packed* panel = dst + (jp / NR) * kcp * NR;
    if (cols < NR || kcp != kc) std::memset(panel, 0, sizeof(Packed) * kcp * NR);
    if (!trans) {
      for (int64_t k = 0; k < kc; ++k) {
        const In* src = B + (p0 + k) * ldb + j0 + jp;
        Packed* d = panel + (k / KP) * NR * KP + k % KP;
        if constexpr (KP == 1 && sizeof(In) == sizeof(Packed)) {
          if (cols == NR) {
            std::memcpy(d, src, sizeof(Packed) * NR);
            continue;
          }
        }
        for (int64_t j = 0; j < cols; ++j) d[j * KP] = convert_element<In, Packed>(src[j]);
      }
    } else {
      // op(B)[k, j] = B[j, k]: transpose 8 columns x 8 k at a time so reads stay in a few
      // cache lines and writes are contiguous runs.
      for (int64_t k0 = 0; k0 < kc; k0 += 8) {
        const int64_t kn = std::min<int64_t>(8, kc - k0);
        for (int64_t j = 0; j < cols; ++j) {
          const In* src = B + (j0 + jp + j) * ldb + p0 + k0;
          for (int64_t k = 0; k < kn; ++k) {
            const int64_t kk = k0 + k;
            panel[(kk / KP) * NR * KP + j * KP + kk % KP] = convert_element<In, Packed>(src[k]);
          }
        }
      }
    }
  }
}

// exp(x) for the GELU epilogue: range reduction to 2^n * 2^f and a degree-6 polynomial, plain
// arithmetic so the epilogue loop vectorises (relative error ~2e-7 on [-87, 88]).
inline float epilogue_exp(float x) {
  x = std::min(88.0f, std::max(-87.0f, x));
  const float t = x * 1.44269504f;
  const float n = __builtin_floorf(t + 0.5f);
  const float f = t - n;  // [-0.5, 0.5]
  float p = 1.5353362e-4f;
  p = p * f + 1.3398874e-3f;
  p = p * f + 9.6184050e-3f;
  p = p * f + 5.5503406e-2f;
  p = p * f + 2.4022652e-1f;
  p = p * f + 6.9314718e-1f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

inline float gelu_tanh(float x) {
  // 0.5 x (1 + tanh(u)) with tanh(u) = 1 - 2 / (exp(2u) + 1).
  const float u = 0.7978845608f * (x + 0.044715f * x * x * x);
  const float t = 1.0f - 2.0f / (epilogue_exp(2.0f * u) + 1.0f);
  return 0.5f * x * (1.0f + t);
}

// Adds bias and applies the activation to rows x cols of C (already alpha*AB + beta*C).
inline void apply_epilogue(const GemmEpilogue& ep, float* c, int64_t ldc, int64_t rows,
                           int64_t cols, int64_t col0) {
  const float* bias = ep.bias ? ep.bias + col0 : nullptr;
  for (int64_t i = 0; i < rows; ++i) {
    float* row = c + i * ldc;
    if (bias) {
      for (int64_t j = 0; j < cols; ++j) row[j] += bias[j];
    }
    if (ep.activation == GemmActivation::kGeluTanh) {
      for (int64_t j = 0; j < cols; ++j) row[j] = gelu_tanh(row[j]);
    }
  }
}

inline bool has_epilogue(const GemmEpilogue& ep) {
  return ep.bias != nullptr || ep.activation != GemmActivation::kNone;
}

// The serial blocked GEMM. Kern provides:
//   using Packed;                        element type of the packed panels
//   kMR, kNR, kKP (k granularity), kKC, kMC, kNC
//   static void micro(int64_t kcp, const Packed* a, const Packed* b, float* c, int64_t ldc,
//                     float alpha, float beta);   full tile; beta == 0 must not read c
template <typename Kern, typename In>
inline void gemm_serial(const GemmArgs<In>& g, const GemmEpilogue& ep) {
  using Packed = typename Kern::Packed;
  constexpr int MR = Kern::kMR, NR = Kern::kNR, KP = Kern::kKP;
  constexpr int64_t KC = Kern::kKC, MC = Kern::kMC, NC = Kern::kNC;
  static_assert(KC % KP == 0 && MC % MR == 0 && NC % NR == 0, "blocking must tile");
  const int64_t kc_max = std::min<int64_t>(KC, (g.K + KP - 1) / KP * KP);
  const int64_t mc_max = std::min<int64_t>(MC, (g.M + MR - 1) / MR * MR);
  const int64_t nc_max = std::min<int64_t>(NC, (g.N + NR - 1) / NR * NR);
  auto* abuf = thread_scratch<Packed>(ScratchSlot::kGemmPackA, kc_max * mc_max);
  auto* bbuf = thread_scratch<Packed>(ScratchSlot::kGemmPackB, kc_max * nc_max);
  auto* tile = thread_scratch<float>(ScratchSlot::kGemmTile, MR * NR);
  const bool epilogue = has_epilogue(ep);

  for (int64_t pc = 0; pc < g.K; pc += KC) {
    const int64_t kc = std::min<int64_t>(KC, g.K - pc);
    const int64_t kcp = (kc + KP - 1) / KP * KP;
    const float beta = pc == 0 ? g.beta : 1.0f;
    const bool last_k = pc + kc == g.K;
    for (int64_t ic = 0; ic < g.M; ic += MC) {
      const int64_t mc = std::min<int64_t>(MC, g.M - ic);
      pack_a<MR, KP>(g.trans_a, g.A, g.lda, ic, mc, pc, kc, abuf);
      for (int64_t jc = 0; jc < g.N; jc += NC) {
        const int64_t nc = std::min<int64_t>(NC, g.N - jc);
        pack_b<NR, KP>(g.trans_b, g.B, g.ldb, pc, kc, jc, nc, bbuf);
        for (int64_t ir = 0; ir < mc; ir += MR) {
          const int64_t mr = std::min<int64_t>(MR, mc - ir);
          const Packed* ap = abuf + (ir / MR) * kcp * MR;
          for (int64_t jr = 0; jr < nc; jr += NR) {
            const int64_t nr = std::min<int64_t>(NR, nc - jr);
            const Packed* bp = bbuf + (jr / NR) * kcp * NR;
            float* c = g.C + (ic + ir) * g.ldc + jc + jr;
            if (mr == MR && nr == NR) {
              Kern::micro(kcp, ap, bp, c, g.ldc, g.alpha, beta);
            } else {
              Kern::micro(kcp, ap, bp, tile, NR, g.alpha, 0.0f);
              for (int64_t i = 0; i < mr; ++i) {
                float* crow = c + i * g.ldc;
                const float* trow = tile + i * NR;
                if (beta == 0.0f) {
                  for (int64_t j = 0; j < nr; ++j) crow[j] = trow[j];
                } else {
                  for (int64_t j = 0; j < nr; ++j) crow[j] = trow[j] + beta * crow[j];
                }
              }
            }
            if (last_k && epilogue) apply_epilogue(ep, c, g.ldc, mr, nr, jc + jr);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace mammoth::kernels::cpu::internal
