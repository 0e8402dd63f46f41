// GEMM front end: argument checks, ISA dispatch, splitting over threads and batches, the
// portable micro-kernel, the per-thread packing scratch and the double-precision reference.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/isa_env.h"

namespace mammoth::kernels::cpu {
namespace internal {
namespace {

// Portable fallback: plain loops the compiler vectorises with the baseline ISA (SSE2 on
// x86-64). 4 x 16 keeps the accumulators within 16 xmm registers.
struct PortableF32 {
  using Packed = float;
  static constexpr int kMR = 4, kNR = 16, kKP = 1;
  static constexpr int64_t kKC = 256, kMC = 512, kNC = 512;

  static void micro(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, float alpha,
                    float beta) {
    float acc[kMR][kNR] = {};
    for (int64_t k = 0; k < kc; ++k) {
      for (int i = 0; i < kMR; ++i) {
        const float ai = a[k * kMR + i];
        for (int j = 0; j < kNR; ++j) acc[i][j] += ai * b[k * kNR + j];
      }
    }
    for (int i = 0; i < kMR; ++i) {
      float* crow = c + i * ldc;
      if (beta == 0.0f) {
        for (int j = 0; j < kNR; ++j) crow[j] = alpha * acc[i][j];
      } else {
        for (int j = 0; j < kNR; ++j) crow[j] = alpha * acc[i][j] + beta * crow[j];
      }
    }
  }
};

void sgemm_portable(const GemmArgs<float>& args, const GemmEpilogue& ep) {
  gemm_serial<PortableF32>(args, ep);
}

void gemm_bf16_portable(const GemmArgs<uint16_t>& args) {
  gemm_serial<PortableF32>(args, GemmEpilogue{});
}

}  // namespace

const GemmKernels& portable_kernels() {
  static const GemmKernels k{PortableF32::kMR, PortableF32::kNR, &sgemm_portable,
                             &gemm_bf16_portable};
  return k;
}

namespace {
std::atomic<bool> g_bf16_dot_allowed{true};
}  // namespace

void set_bf16_dot_allowed(bool allowed) { g_bf16_dot_allowed.store(allowed); }
bool bf16_dot_allowed() { return g_bf16_dot_allowed.load(); }

}  // namespace internal

namespace {

using internal::GemmArgs;
using internal::GemmKernels;

std::atomic<GemmIsa> g_forced_isa{GemmIsa::kAuto};

GemmIsa best_isa() {
#if defined(__x86_64__)
  static const GemmIsa best = [] {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("fma")) {
      return GemmIsa::kAvx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return GemmIsa::kAvx2;
    return GemmIsa::kPortable;
  }();
  return best;
#else
  return GemmIsa::kPortable;
#endif
}

// What kAuto means: MAMMOTH_ISA's family when it is set (isa_env.h), else the best one.
GemmIsa default_isa() {
  static const GemmIsa isa = [] {
    GemmIsa want = GemmIsa::kAuto;
    switch (isa_request_from_env()) {
      case IsaRequest::kAuto:
        return best_isa();
      case IsaRequest::kAvx512:
        want = GemmIsa::kAvx512;
        break;
      case IsaRequest::kAvx2:
        want = GemmIsa::kAvx2;
        break;
      case IsaRequest::kPortable:
        want = GemmIsa::kPortable;
        break;
    }
    const GemmIsa best = best_isa();
    MAMMOTH_CHECK(gemm_isa_supported(want))
        << "[" << kIsaEnvVar << "] " << kIsaEnvVar << "=" << gemm_isa_name(want)
        << ", but this CPU cannot run the " << gemm_isa_name(want) << " GEMM kernels (they need "
        << (want == GemmIsa::kAvx512 ? "AVX-512 F, BW, VL, DQ and FMA" : "AVX2 and FMA")
        << "); the best it runs is " << gemm_isa_name(best) << ": set " << kIsaEnvVar << " to "
        << (best == GemmIsa::kAvx2 ? "avx2, portable" : "portable") << " or auto";
    return want;
  }();
  return isa;
}

const GemmKernels& kernels_for(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kAvx512:
      return internal::avx512_kernels();
    case GemmIsa::kAvx2:
      return internal::avx2_kernels();
    default:
      return internal::portable_kernels();
  }
}

const GemmKernels& active_kernels() { return kernels_for(active_gemm_isa()); }

// Below this many flops a GEMM runs on the calling thread: waking the pool costs more.
constexpr double kParallelFlops = 4.0e6;

int usable_threads() { return in_parallel_region() ? 1 : num_threads(); }

void check_args(const char* fn, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                int64_t lda, int64_t ldb, int64_t ldc) {
  MAMMOTH_CHECK(M >= 0 && N >= 0 && K >= 0)
      << "[" << fn << "] negative size M=" << M << " N=" << N << " K=" << K;
  const int64_t a_cols = trans_a ? M : K;
  const int64_t b_cols = trans_b ? K : N;
  MAMMOTH_CHECK(lda >= std::max<int64_t>(1, a_cols))
      << "[" << fn << "] lda=" << lda << " is less than the row length " << a_cols
      << " of A (trans_a=" << trans_a << ")";
  MAMMOTH_CHECK(ldb >= std::max<int64_t>(1, b_cols))
      << "[" << fn << "] ldb=" << ldb << " is less than the row length " << b_cols
      << " of B (trans_b=" << trans_b << ")";
  MAMMOTH_CHECK(ldc >= std::max<int64_t>(1, N))
      << "[" << fn << "] ldc=" << ldc << " is less than N=" << N;
}

// C = beta * C (beta == 0 writes zeros without reading), then the epilogue: the whole answer
// when K == 0 or alpha == 0.
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc, const GemmEpilogue& ep) {
  for (int64_t i = 0; i < M; ++i) {
    float* row = C + i * ldc;
    if (beta == 0.0f) {
      std::fill(row, row + N, 0.0f);
    } else if (beta != 1.0f) {
      for (int64_t j = 0; j < N; ++j) row[j] *= beta;
    }
  }
  if (internal::has_epilogue(ep)) internal::apply_epilogue(ep, C, ldc, M, N, 0);
}

// Runs one GEMM on up to `threads` threads by cutting C into row slabs (each thread packs all
// of op(B) and its own rows of op(A)) or column slabs (the reverse), whichever duplicates
// less packing. Slabs follow micro-tile boundaries, so no tile is split.
template <typename In, typename Serial>
void run_split(const GemmArgs<In>& g, const GemmEpilogue& ep, int mr, int nr, int threads,
               const Serial& serial) {
  const double flops = 2.0 * static_cast<double>(g.M) * g.N * g.K;
  const int64_t m_units = (g.M + mr - 1) / mr;
  const int64_t n_units = (g.N + nr - 1) / nr;
  if (threads <= 1 || flops < kParallelFlops || (m_units < 2 && n_units < 2)) {
    serial(g, ep);
    return;
  }
  // Row slabs duplicate op(B) packing (K x N per thread), column slabs duplicate op(A)
  // (M x K): prefer rows when N <= M, unless there are too few row tiles to share.
  const bool split_rows = (g.M >= g.N && m_units >= threads) || n_units < threads ||
                          (m_units >= threads && n_units < m_units);
  if (split_rows) {
    parallel_for(0, m_units, 1, [&](int64_t b, int64_t e) {
      const int64_t r0 = b * mr, r1 = std::min(g.M, e * mr);
      GemmArgs<In> s = g;
      s.M = r1 - r0;
      s.A = g.trans_a ? g.A + r0 : g.A + r0 * g.lda;
      s.C = g.C + r0 * g.ldc;
      serial(s, ep);
    });
  } else {
    parallel_for(0, n_units, 1, [&](int64_t b, int64_t e) {
      const int64_t c0 = b * nr, c1 = std::min(g.N, e * nr);
      GemmArgs<In> s = g;
      s.N = c1 - c0;
      s.B = g.trans_b ? g.B + c0 * g.ldb : g.B + c0;
      s.C = g.C + c0;
      GemmEpilogue sep = ep;
      if (sep.bias) sep.bias += c0;
      serial(s, sep);
    });
  }
}

}  // namespace

bool gemm_isa_supported(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kAvx512:
      return best_isa() == GemmIsa::kAvx512;
    case GemmIsa::kAvx2:
      return best_isa() == GemmIsa::kAvx512 || best_isa() == GemmIsa::kAvx2;
    default:
      return true;
  }
}

void set_gemm_isa(GemmIsa isa) {
  MAMMOTH_CHECK(gemm_isa_supported(isa))
      << "[set_gemm_isa] this CPU does not support " << gemm_isa_name(isa) << " (best is "
      << gemm_isa_name(best_isa()) << ")";
  g_forced_isa.store(isa);
}

GemmIsa active_gemm_isa() {
  const GemmIsa forced = g_forced_isa.load();
  return forced == GemmIsa::kAuto ? default_isa() : forced;
}

const char* gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kAuto:
      return "auto";
    case GemmIsa::kAvx512:
      return "avx512";
    case GemmIsa::kAvx2:
      return "avx2";
    case GemmIsa::kPortable:
      return "portable";
  }
  return "unknown";
}

GemmTile sgemm_tile() {
  const GemmKernels& k = active_kernels();
  return {k.mr, k.nr};
}

void sgemm_fused(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                 int64_t ldc, const GemmEpilogue& epilogue) {
  check_args("sgemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc, epilogue);
    return;
  }
  const GemmKernels& k = active_kernels();
  const GemmArgs<float> g{trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc};
  run_split(g, epilogue, k.mr, k.nr, usable_threads(), k.sgemm);
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  sgemm_fused(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, GemmEpilogue{});
}

void sgemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                           const float* A, int64_t lda, int64_t stride_a, const float* B,
                           int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
                           int64_t stride_c, int64_t batch) {
  check_args("sgemm_strided_batched", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  MAMMOTH_CHECK(batch >= 0) << "[sgemm_strided_batched] negative batch " << batch;
  if (M == 0 || N == 0 || batch == 0) return;
  const GemmEpilogue none;
  if (K == 0 || alpha == 0.0f) {
    for (int64_t b = 0; b < batch; ++b) scale_c(M, N, beta, C + b * stride_c, ldc, none);
    return;
  }
  const GemmKernels& k = active_kernels();
  auto args = [&](int64_t b) {
    return GemmArgs<float>{
        trans_a, trans_b,          M,  N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb,
        beta,    C + b * stride_c, ldc};
  };
  const int threads = usable_threads();
  const double flops = 2.0 * static_cast<double>(M) * N * K;
  // Many small matrices (attention heads): one whole GEMM per thread. Few large ones: split
  // each across the threads.
  if (threads > 1 && (batch >= 4 * threads || (batch >= threads && flops < 5.0e7))) {
    parallel_for(0, batch, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) k.sgemm(args(b), none);
    });
  } else {
    for (int64_t b = 0; b < batch; ++b) run_split(args(b), none, k.mr, k.nr, threads, k.sgemm);
  }
}

void sgemm_grouped(const GemmGroup* groups, int64_t count) {
  const GemmEpilogue none;
  double flops = 0;
  for (int64_t g = 0; g < count; ++g) {
    const GemmGroup& G = groups[g];
    if (G.M == 0 || G.N == 0) continue;  // reads nothing (an expert without tokens)
    check_args("sgemm_grouped", G.trans_a, G.trans_b, G.M, G.N, G.K, G.lda, G.ldb, G.ldc);
    flops += 2.0 * static_cast<double>(G.M) * G.N * G.K;
  }
  const GemmKernels& k = active_kernels();
  const int threads = usable_threads();
  // Slabs of about a quarter of a thread's share (at least kParallelFlops / 4) balance unequal
  // groups without cutting small ones finer than a tile.
  const double target = std::max(kParallelFlops / 4, flops / (4.0 * std::max(threads, 1)));
  struct Slab {
    int64_t group, r0, r1;
  };
  std::vector<Slab> slabs;
  for (int64_t g = 0; g < count; ++g) {
    const GemmGroup& G = groups[g];
    if (G.M == 0 || G.N == 0) continue;
    const double row_flops = 2.0 * static_cast<double>(G.N) * std::max<int64_t>(G.K, 1);
    int64_t rows = static_cast<int64_t>(target / row_flops);
    rows = std::clamp<int64_t>((rows + k.mr - 1) / k.mr * k.mr, k.mr, G.M);
    for (int64_t r0 = 0; r0 < G.M; r0 += rows) slabs.push_back({g, r0, std::min(G.M, r0 + rows)});
  }
  auto run = [&](const Slab& s) {
    const GemmGroup& G = groups[s.group];
    float* C = G.C + s.r0 * G.ldc;
    if (G.K == 0) {
      scale_c(s.r1 - s.r0, G.N, 0.0f, C, G.ldc, none);
      return;
    }
    const GemmArgs<float> a{G.trans_a,
                            G.trans_b,
                            s.r1 - s.r0,
                            G.N,
                            G.K,
                            1.0f,
                            G.trans_a ? G.A + s.r0 : G.A + s.r0 * G.lda,
                            G.lda,
                            G.B,
                            G.ldb,
                            0.0f,
                            C,
                            G.ldc};
    k.sgemm(a, none);
  };
  const int64_t n = static_cast<int64_t>(slabs.size());
  if (threads <= 1 || flops < kParallelFlops || n < 2) {
    for (const Slab& s : slabs) run(s);
    return;
  }
  parallel_for(0, n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) run(slabs[i]);
  });
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
               int64_t ldc) {
  check_args("gemm_bf16", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  const GemmEpilogue none;
  if (K == 0 || alpha == 0.0f) {
    scale_c(M, N, beta, C, ldc, none);
    return;
  }
  const GemmKernels& k = active_kernels();
  const GemmArgs<uint16_t> g{trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc};
  run_split(g, none, k.mr, k.nr, usable_threads(),
            [&](const GemmArgs<uint16_t>& s, const GemmEpilogue&) { k.gemm_bf16(s); });
}

void dgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
           const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
           int64_t ldc) {
  check_args("dgemm", trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  // op(B) as a contiguous K x N copy so the inner loop is a unit-stride axpy over a row of C.
  std::vector<double> bt;
  const double* b = B;
  int64_t ldb_eff = ldb;
  if (trans_b && K > 0) {
    bt.resize(static_cast<size_t>(K * N));
    for (int64_t j = 0; j < N; ++j) {
      for (int64_t k = 0; k < K; ++k) bt[k * N + j] = B[j * ldb + k];
    }
    b = bt.data();
    ldb_eff = N;
  }
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, N * K));
  parallel_for(0, M, grain, [&](int64_t i0, int64_t i1) {
    std::vector<double> acc(static_cast<size_t>(N));
    for (int64_t i = i0; i < i1; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = 0; k < K; ++k) {
        const double a = trans_a ? A[k * lda + i] : A[i * lda + k];
        const double* brow = b + k * ldb_eff;
        for (int64_t j = 0; j < N; ++j) acc[j] += a * brow[j];
      }
      double* crow = C + i * ldc;
      for (int64_t j = 0; j < N; ++j) {
        crow[j] = beta == 0.0 ? alpha * acc[j] : alpha * acc[j] + beta * crow[j];
      }
    }
  });
}

}  // namespace mammoth::kernels::cpu
