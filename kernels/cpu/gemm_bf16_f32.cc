// bf16 GEMM on f32 operands (gemm_bf16_f32.h): packs f32 straight into bf16 k-pair panels and
// multiplies them with vdpbf16ps. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq
// -mavx512bf16 -mfma; called only after gemm_bf16_f32_supported().
//
// Layout and blocking follow the packed GEMM of gemm_internal.h (GotoBLAS loops KC/MC/NC,
// 6 x 64 register tile, panels zero-padded to full tiles and to an even k), so the
// micro-kernel is the same shape as gemm_avx512.cc's bf16 one; what differs is the packing.
// On that route (matmul.cc, where gemm_bf16_f32_enabled() is false) f32 operands are first
// rounded into a separate bf16 copy (written and re-read, a new allocation per call: page faults
// for the 77 MB LM-head weight) and then packed element by element. Here each pack routine reads
// f32, converts 32 values per instruction (vcvtne2ps2bf16, round to nearest even) and writes the
// panel directly:
//   op(A) rows contiguous in k (forward, dX):  convert a row's 32 k, store 16 k-pair words
//   op(A) = A^T (dW: dy^T):                    rows k, k+1 -> interleave -> one masked store
//   op(B) rows contiguous in n (dX: W, dW: x): rows k, k+1 -> interleave -> 64-byte stores
//   op(B) = B^T (forward: W^T, LM head):       16 columns x 32 k, 16x16 word transpose
// A k pair is one 32-bit word (low half = even k), the unit vdpbf16ps multiplies.
//
// GCC 12's AVX-512 shuffle intrinsics build their pass-through operand from an undefined value,
// which -W(maybe-)uninitialized reports once inlined; the value is never read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "kernels/cpu/gemm_bf16_f32.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/error.h"
#include "base/scratch.h"
#include "base/thread_pool.h"

namespace mammoth::kernels::cpu {
namespace {

constexpr int kMR = 6;         // rows of the register tile
constexpr int kNV = 4;         // 16-float vectors per tile row
constexpr int kNR = 16 * kNV;  // columns of the register tile
constexpr int64_t kKC = 1536;  // k per block (even): a 6 x 1536 bf16 A micro-panel is 18 KB
constexpr int64_t kMC = 4098;  // rows per packed A block (multiple of kMR)
constexpr int64_t kNC = 256;   // columns per packed B block (multiple of kNR): 768 KB in L2
constexpr double kParallelFlops = 4.0e6;  // below this, waking the pool costs more

struct Args {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  float alpha = 1.0f;
  const float* A = nullptr;
  int64_t lda = 0;
  const float* B = nullptr;
  int64_t ldb = 0;
  float beta = 0.0f;
  float* C = nullptr;
  int64_t ldc = 0;
};

inline __mmask16 first_n(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff)
                 : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1u);
}

// 32 bf16 of lo[0..15] then hi[0..15], rounded to nearest even.
inline __m512i to_bf16(__m512 lo, __m512 hi) {
  return reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
}

// vpermw index turning [x0..x15, y0..y15] into the words (x_j, y_j).
inline __m512i pair_index() {
  alignas(64) static const uint16_t idx[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                               21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                               11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_load_si512(idx);
}

// Words (row0[j], row1[j]) for j < n (zero beyond); row1 == nullptr reads as zeros.
inline __m512i pair_rows(const float* row0, const float* row1, int64_t n, __m512i idx) {
  const __mmask16 m = first_n(n);
  const __m512 lo = _mm512_maskz_loadu_ps(m, row0);
  const __m512 hi = row1 ? _mm512_maskz_loadu_ps(m, row1) : _mm512_setzero_ps();
  return _mm512_permutexvar_epi16(idx, to_bf16(lo, hi));
}

// r[i][j] -> r[j][i] for a 16 x 16 matrix of 32-bit words.
inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + c], lane L: column 4L + c of rows 4g..4g+3.
  for (int g = 0; g < 4; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  // A 4 x 4 transpose of 128-bit lanes among u[c], u[4 + c], u[8 + c], u[12 + c].
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    const __m512i y0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i y1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(x0, y0, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(x0, y0, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(x1, y1, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(x1, y1, 0xdd);
  }
}

// r[i][j] (8 rows of 16 words) -> out[j] = the 8 words r[0..7][j].
static_assert(kMR <= 8, "pack_a transposes at most 8 rows");
inline void transpose8x16(const __m512i (&r)[8], __m256i (&out)[16]) {
  __m512i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  // u[4g + c], lane L: column 4L + c of rows 4g..4g+3.
  for (int g = 0; g < 2; ++g) {
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  // Lanes (u[c] L, u[4 + c] L) side by side: column 4L + c, rows 0..7.
  for (int c = 0; c < 4; ++c) {
    const __m512i x0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i x1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
    const __m512i y0 = _mm512_shuffle_i32x4(x0, x0, 0xd8);
    const __m512i y1 = _mm512_shuffle_i32x4(x1, x1, 0xd8);
    out[c] = _mm512_castsi512_si256(y0);
    out[4 + c] = _mm512_extracti64x4_epi64(y0, 1);
    out[8 + c] = _mm512_castsi512_si256(y1);
    out[12 + c] = _mm512_extracti64x4_epi64(y1, 1);
  }
}

// Packs op(A)[i0:+mc, p0:+kc] into ceil(mc/kMR) panels of `pairs` x kMR words: word
// (p, i) = (op(A)[i, 2p], op(A)[i, 2p+1]) at p * kMR + i. Missing rows and k are zero.
void pack_a(bool trans, const float* A, int64_t lda, int64_t i0, int64_t mc, int64_t p0, int64_t kc,
            uint32_t* dst) {
  const int64_t pairs = (kc + 1) / 2;
  const __m512i idx = pair_index();
  if (trans) {
    // op(A)[i, k] = A[k, i]: rows k and k+1 of A give one word per op(A) row. A k pair at a
    // time across every panel, so each row of A is read as one run (a panel at a time read 6
    // floats of every row, 24 bytes a line, each line again for the next panel): 48 columns
    // (8 panels) into a buffer, then each panel's kMR words.
    constexpr int64_t kCols = 8 * kMR;
    static_assert(kCols % 16 == 0, "whole vectors of columns");
    alignas(64) uint32_t buf[kCols + 16];
    const __mmask8 store = static_cast<__mmask8>((1u << kMR) - 1u);
    for (int64_t p = 0; p < pairs; ++p) {
      const float* r0 = A + (p0 + 2 * p) * lda + i0;
      const float* r1 = 2 * p + 1 < kc ? r0 + lda : nullptr;
      for (int64_t i = 0; i < mc; i += kCols) {
        const int64_t n = std::min<int64_t>(kCols, mc - i);
        for (int64_t v = 0; v < kCols / 16; ++v) {
          const int64_t nv = n - 16 * v;
          const __m512i w =
              nv > 0 ? pair_rows(r0 + i + 16 * v, r1 ? r1 + i + 16 * v : nullptr, nv, idx)
                     : _mm512_setzero_si512();
          _mm512_store_si512(buf + 16 * v, w);
        }
        for (int64_t q = 0; q < (n + kMR - 1) / kMR; ++q) {
          uint32_t* d = dst + (i / kMR + q) * pairs * kMR + p * kMR;
          _mm256_mask_storeu_epi32(
              d, store, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(buf + q * kMR)));
        }
      }
    }
    return;
  }
  for (int64_t ip = 0; ip < mc; ip += kMR) {
    const int64_t rows = std::min<int64_t>(kMR, mc - ip);
    uint32_t* panel = dst + (ip / kMR) * pairs * kMR;
    // 32 k of the panel's rows -> 16 words per row, transposed (8 rows, the last zero) so that
    // each k pair's kMR words are one contiguous masked store.
    const __mmask8 store = static_cast<__mmask8>((1u << kMR) - 1u);
    const float* src = A + (i0 + ip) * lda + p0;
    for (int64_t k0 = 0; k0 < kc; k0 += 32) {
      const int64_t n = std::min<int64_t>(32, kc - k0);
      const __mmask16 lo = first_n(n), hi = first_n(n - 16);
      __m512i r[8];
      for (int i = 0; i < 8; ++i) {
        r[i] = i < rows ? to_bf16(_mm512_maskz_loadu_ps(lo, src + i * lda + k0),
                                  _mm512_maskz_loadu_ps(hi, src + i * lda + k0 + 16))
                        : _mm512_setzero_si512();
      }
      __m256i cols[16];
      transpose8x16(r, cols);
      uint32_t* d = panel + (k0 / 2) * kMR;
      const int64_t np = (n + 1) / 2;
      for (int64_t q = 0; q < np; ++q) _mm256_mask_storeu_epi32(d + q * kMR, store, cols[q]);
    }
  }
}

// Packs op(B)[p0:+kc, j0:+nc] into ceil(nc/kNR) panels of `pairs` x kNR words: word (p, j) at
// p * kNR + j. Missing columns and k are zero. `ahead` more columns of op(B) follow this block
// (the next block's): the transposed form prefetches into them.
void pack_b(bool trans, const float* B, int64_t ldb, int64_t p0, int64_t kc, int64_t j0, int64_t nc,
            int64_t ahead, uint32_t* dst) {
  const int64_t pairs = (kc + 1) / 2;
  const __m512i idx = pair_index();
  for (int64_t jp = 0; jp < nc; jp += kNR) {
    const int64_t cols = std::min<int64_t>(kNR, nc - jp);
    uint32_t* panel = dst + (jp / kNR) * pairs * kNR;
    if (!trans) {
      for (int64_t p = 0; p < pairs; ++p) {
        const float* r0 = B + (p0 + 2 * p) * ldb + j0 + jp;
        const bool odd = 2 * p + 1 < kc;
        for (int v = 0; v < kNV; ++v) {
          const int64_t n = cols - 16 * v;
          const __m512i w = n > 0
                                ? pair_rows(r0 + 16 * v, odd ? r0 + ldb + 16 * v : nullptr, n, idx)
                                : _mm512_setzero_si512();
          _mm512_store_si512(panel + p * kNR + 16 * v, w);
        }
      }
    } else {
      // Column j of op(B) is row j of B, contiguous in k: convert 32 k of 16 columns (16 words
      // each), then transpose so each k pair's 16 column words are one store.
      // 16 rows of B stream at once; each is prefetched kPrefetch floats ahead, and the 16 rows
      // after them (the next group's, where they exist) at the same k, so that a group does not
      // start on rows that miss every cache.
      constexpr int64_t kPrefetch = 128;
      for (int v = 0; v < kNV; ++v) {
        const int64_t jn = std::min<int64_t>(16, cols - 16 * v);
        if (jn <= 0) {
          for (int64_t p = 0; p < pairs; ++p) {
            _mm512_store_si512(panel + p * kNR + 16 * v, _mm512_setzero_si512());
          }
          continue;
        }
        const int64_t j = jp + 16 * v;  // the group's first column, within the block
        const int64_t next = std::clamp<int64_t>(nc + ahead - j - 16, 0, 16);
        const float* rows = B + (j0 + j) * ldb + p0;
        for (int64_t k0 = 0; k0 < kc; k0 += 32) {
          const int64_t n = std::min<int64_t>(32, kc - k0);
          const __mmask16 lo = first_n(n), hi = first_n(n - 16);
          __m512i r[16];
          for (int jj = 0; jj < 16; ++jj) {
            if (jj < jn) {
              const float* src = rows + jj * ldb + k0;
              if (k0 + kPrefetch < kc) {
                _mm_prefetch(reinterpret_cast<const char*>(src + kPrefetch), _MM_HINT_T0);
                _mm_prefetch(reinterpret_cast<const char*>(src + kPrefetch + 16), _MM_HINT_T0);
              }
              if (jj < next) {
                const float* later = src + 16 * ldb;
                _mm_prefetch(reinterpret_cast<const char*>(later), _MM_HINT_T1);
                if (n > 16) _mm_prefetch(reinterpret_cast<const char*>(later + 16), _MM_HINT_T1);
              }
              r[jj] = to_bf16(_mm512_maskz_loadu_ps(lo, src), _mm512_maskz_loadu_ps(hi, src + 16));
            } else {
              r[jj] = _mm512_setzero_si512();
            }
          }
          transpose16(r);
          uint32_t* d = panel + (k0 / 2) * kNR + 16 * v;
          const int64_t np = (n + 1) / 2;
          for (int64_t q = 0; q < np; ++q) _mm512_store_si512(d + q * kNR, r[q]);
        }
      }
    }
  }
}

// C[kMR, kNR] = alpha * (A panel @ B panel) (+ beta * C); beta == 0 does not read C.
inline void micro(int64_t pairs, const uint32_t* a, const uint32_t* b, float* c, int64_t ldc,
                  float alpha, float beta) {
  __m512 acc[kMR][kNV];
#pragma GCC unroll 8
  for (int i = 0; i < kMR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_setzero_ps();
  }
#pragma GCC unroll 8
  for (int i = 0; i < kMR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) {
      _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + 16 * v), _MM_HINT_T0);
    }
  }
#pragma GCC unroll 4
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh bv[kNV];
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) {
      bv[v] = reinterpret_cast<__m512bh>(_mm512_load_si512(b + p * kNR + 16 * v));
    }
#pragma GCC unroll 8
    for (int i = 0; i < kMR; ++i) {
      const __m512bh ai = reinterpret_cast<__m512bh>(_mm512_set1_epi32(a[p * kMR + i]));
#pragma GCC unroll 4
      for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], ai, bv[v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
  for (int i = 0; i < kMR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNV; ++v) {
      float* cp = c + i * ldc + 16 * v;
      __m512 r = _mm512_mul_ps(acc[i][v], va);
      if (beta != 0.0f) r = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cp), r);
      _mm512_storeu_ps(cp, r);
    }
  }
}

void gemm_serial(const Args& g) {
  const int64_t kc_max = std::min<int64_t>(kKC, (g.K + 1) / 2 * 2);
  const int64_t mc_max = std::min<int64_t>(kMC, (g.M + kMR - 1) / kMR * kMR);
  const int64_t nc_max = std::min<int64_t>(kNC, (g.N + kNR - 1) / kNR * kNR);
  auto* abuf = static_cast<uint32_t*>(
      thread_scratch(ScratchSlot::kGemmPackA, sizeof(uint16_t) * kc_max * mc_max));
  auto* bbuf = static_cast<uint32_t*>(
      thread_scratch(ScratchSlot::kGemmPackB, sizeof(uint16_t) * kc_max * nc_max));
  auto* tile = thread_scratch<float>(ScratchSlot::kGemmTile, kMR * kNR);
  for (int64_t pc = 0; pc < g.K; pc += kKC) {
    const int64_t kc = std::min<int64_t>(kKC, g.K - pc);
    const int64_t pairs = (kc + 1) / 2;
    const float beta = pc == 0 ? g.beta : 1.0f;
    for (int64_t ic = 0; ic < g.M; ic += kMC) {
      const int64_t mc = std::min<int64_t>(kMC, g.M - ic);
      pack_a(g.trans_a, g.A, g.lda, ic, mc, pc, kc, abuf);
      for (int64_t jc = 0; jc < g.N; jc += kNC) {
        const int64_t nc = std::min<int64_t>(kNC, g.N - jc);
        pack_b(g.trans_b, g.B, g.ldb, pc, kc, jc, nc, g.N - jc - nc, bbuf);
        for (int64_t ir = 0; ir < mc; ir += kMR) {
          const int64_t mr = std::min<int64_t>(kMR, mc - ir);
          const uint32_t* ap = abuf + (ir / kMR) * pairs * kMR;
          for (int64_t jr = 0; jr < nc; jr += kNR) {
            const int64_t nr = std::min<int64_t>(kNR, nc - jr);
            const uint32_t* bp = bbuf + (jr / kNR) * pairs * kNR;
            float* c = g.C + (ic + ir) * g.ldc + jc + jr;
            if (mr == kMR && nr == kNR) {
              micro(pairs, ap, bp, c, g.ldc, g.alpha, beta);
              continue;
            }
            micro(pairs, ap, bp, tile, kNR, g.alpha, 0.0f);
            for (int64_t i = 0; i < mr; ++i) {
              float* crow = c + i * g.ldc;
              const float* trow = tile + i * kNR;
              if (beta == 0.0f) {
                for (int64_t j = 0; j < nr; ++j) crow[j] = trow[j];
              } else {
                for (int64_t j = 0; j < nr; ++j) crow[j] = trow[j] + beta * crow[j];
              }
            }
          }
        }
      }
    }
  }
}

// One product on up to `threads` threads, cut into row slabs (each thread packs all of op(B),
// K x N) or column slabs (each packs all of op(A), M x K): the one that duplicates less
// packing, as long as it has a tile per thread. Slabs follow tile boundaries.
void run(const Args& g, int threads) {
  const double flops = 2.0 * static_cast<double>(g.M) * g.N * g.K;
  const int64_t m_units = (g.M + kMR - 1) / kMR, n_units = (g.N + kNR - 1) / kNR;
  if (threads <= 1 || flops < kParallelFlops || (m_units < threads && n_units < threads)) {
    gemm_serial(g);
    return;
  }
  const bool split_rows = n_units < threads || (m_units >= threads && g.N <= g.M);
  if (split_rows) {
    parallel_for(0, m_units, 1, [&](int64_t b, int64_t e) {
      Args s = g;
      const int64_t r0 = b * kMR, r1 = std::min(g.M, e * kMR);
      s.M = r1 - r0;
      s.A = g.trans_a ? g.A + r0 : g.A + r0 * g.lda;
      s.C = g.C + r0 * g.ldc;
      gemm_serial(s);
    });
  } else {
    parallel_for(0, n_units, 1, [&](int64_t b, int64_t e) {
      Args s = g;
      const int64_t c0 = b * kNR, c1 = std::min(g.N, e * kNR);
      s.N = c1 - c0;
      s.B = g.trans_b ? g.B + c0 * g.ldb : g.B + c0;
      s.C = g.C + c0;
      gemm_serial(s);
    });
  }
}

void check_args(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                int64_t ldb, int64_t ldc) {
  MAMMOTH_CHECK(M >= 0 && N >= 0 && K >= 0)
      << "[gemm_bf16_f32] negative size M=" << M << " N=" << N << " K=" << K;
  const int64_t a_cols = trans_a ? M : K, b_cols = trans_b ? K : N;
  MAMMOTH_CHECK(lda >= std::max<int64_t>(1, a_cols))
      << "[gemm_bf16_f32] lda=" << lda << " is less than the row length " << a_cols << " of A";
  MAMMOTH_CHECK(ldb >= std::max<int64_t>(1, b_cols))
      << "[gemm_bf16_f32] ldb=" << ldb << " is less than the row length " << b_cols << " of B";
  MAMMOTH_CHECK(ldc >= std::max<int64_t>(1, N))
      << "[gemm_bf16_f32] ldc=" << ldc << " is less than N=" << N;
}

// C = beta * C (beta == 0 writes zeros without reading): the whole answer when K or alpha is 0.
void scale_c(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    float* row = C + i * ldc;
    if (beta == 0.0f) {
      std::fill(row, row + N, 0.0f);
    } else if (beta != 1.0f) {
      for (int64_t j = 0; j < N; ++j) row[j] *= beta;
    }
  }
}

int usable_threads() { return in_parallel_region() ? 1 : num_threads(); }

}  // namespace

void gemm_bf16_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                   int64_t ldc) {
  gemm_bf16_f32_batched(trans_a, trans_b, M, N, K, alpha, A, lda, 0, B, ldb, 0, beta, C, ldc, 0, 1);
}

void gemm_bf16_f32_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                           const float* A, int64_t lda, int64_t stride_a, const float* B,
                           int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
                           int64_t stride_c, int64_t batch) {
  check_args(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  MAMMOTH_CHECK(batch >= 0) << "[gemm_bf16_f32] negative batch " << batch;
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0 || alpha == 0.0f) {
    for (int64_t b = 0; b < batch; ++b) scale_c(M, N, beta, C + b * stride_c, ldc);
    return;
  }
  auto args = [&](int64_t b) {
    return Args{
        trans_a, trans_b,          M,  N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb,
        beta,    C + b * stride_c, ldc};
  };
  const int threads = usable_threads();
  const double flops = 2.0 * static_cast<double>(M) * N * K;
  // Many small products (attention heads): whole products per thread; else split each one.
  if (threads > 1 && (batch >= 4 * threads || (batch >= threads && flops < 5.0e7))) {
    parallel_for(0, batch, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) gemm_serial(args(b));
    });
  } else {
    for (int64_t b = 0; b < batch; ++b) run(args(b), threads);
  }
}

}  // namespace mammoth::kernels::cpu
