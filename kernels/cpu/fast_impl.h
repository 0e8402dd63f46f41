// The fused f32 kernels of fast.h, written once against a vector type `Vec`.
//
// Included by exactly one translation unit per instruction set, after that ISA's simd_*.h and
// with MAMMOTH_FAST_NS naming its namespace (avx512, avx2, portable), so each copy is compiled
// with its own -m flags and the copies never collide at link time.
//
// Row kernels read a row from memory once and make their later passes over it from cache (rows
// of the vocabulary size fit in L2). Reductions use several vector accumulators in a fixed
// order, so a row's result depends only on the row and the ISA, never on the thread count.
// Attention is tiled: blocks of queries against blocks of keys through the packed sgemm, with
// an online softmax; no T x T matrix is stored.
#ifndef MAMMOTH_FAST_NS
#error "define MAMMOTH_FAST_NS and include the ISA's simd_*.h before fast_impl.h"
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/scratch.h"
#include "base/thread_pool.h"
#include "kernels/cpu/fast.h"
#include "kernels/cpu/gemm.h"

namespace mammoth::kernels::cpu::MAMMOTH_FAST_NS {
namespace {

constexpr int W = Vec::kWidth;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int64_t kRowBlock = 64;  // rows per partial sum of weight gradients (at least)
constexpr int64_t kMaxRowBlocks = 256;

int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1)); }

// ---- row primitives --------------------------------------------------------------------------

float row_max(const float* x, int64_t n) {
  Vec a0 = Vec::set1(-kInf), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 = max(a0, Vec::load(x + i));
    a1 = max(a1, Vec::load(x + i + W));
    a2 = max(a2, Vec::load(x + i + 2 * W));
    a3 = max(a3, Vec::load(x + i + 3 * W));
  }
  for (; i + W <= n; i += W) a0 = max(a0, Vec::load(x + i));
  if (i < n) a1 = max(a1, Vec::load_n(x + i, static_cast<int>(n - i), -kInf));
  return hmax(max(max(a0, a1), max(a2, a3)));
}

// Vec::load, or with kMem (the data arrives from memory) Vec::load_mem.
template <bool kMem>
inline Vec load_v(const float* p) {
  return kMem ? Vec::load_mem(p) : Vec::load(p);
}

template <bool kMem = false>
float row_sum(const float* x, int64_t n) {
  Vec a0 = Vec::zero(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 = a0 + load_v<kMem>(x + i);
    a1 = a1 + load_v<kMem>(x + i + W);
    a2 = a2 + load_v<kMem>(x + i + 2 * W);
    a3 = a3 + load_v<kMem>(x + i + 3 * W);
  }
  for (; i + W <= n; i += W) a0 = a0 + load_v<kMem>(x + i);
  if (i < n) a1 = a1 + Vec::load_n(x + i, static_cast<int>(n - i));
  return hsum((a0 + a1) + (a2 + a3));
}

template <bool kMem = false>
float row_dot(const float* x, const float* y, int64_t n) {
  Vec a0 = Vec::zero(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 = fma(load_v<kMem>(x + i), load_v<kMem>(y + i), a0);
    a1 = fma(load_v<kMem>(x + i + W), load_v<kMem>(y + i + W), a1);
    a2 = fma(load_v<kMem>(x + i + 2 * W), load_v<kMem>(y + i + 2 * W), a2);
    a3 = fma(load_v<kMem>(x + i + 3 * W), load_v<kMem>(y + i + 3 * W), a3);
  }
  for (; i + W <= n; i += W) a0 = fma(load_v<kMem>(x + i), load_v<kMem>(y + i), a0);
  if (i < n) {
    const int r = static_cast<int>(n - i);
    a1 = fma(Vec::load_n(x + i, r), Vec::load_n(y + i, r), a1);
  }
  return hsum((a0 + a1) + (a2 + a3));
}

// Softmax-style rows are read from memory once, in blocks of kOnlineBlock floats (2 KiB): an
// online softmax by block. Each block's exponentials are taken against a reference known before
// the block (the largest value seen so far), and the block's own maximum is found in the same
// loop from the same loads, so reading the row overlaps the arithmetic. Two other forms are
// slower on rows from memory: a separate max pass (the core waits on memory, then memory on the
// core), and reading the next block's maximum in the loop over the current one from L1
// (BENCHMARKS.md, "Kernel design measurements").
constexpr int64_t kOnlineBlock = 512;
// A row's first reference is the maximum of its first kHintFloats; a block whose maximum exceeds
// its reference by more than kOnlineSlack is redone against that maximum (from L1), so no
// exponential exceeds e^2 and the ones above the reference lose at most ~4 * 2^-24 relative
// (exp_diff's error grows with |x - m|). A row whose maximum keeps rising block after block
// costs up to twice the exponentials; typical rows (logits, attention scores) reach most of
// their maximum within the first kHintFloats and never redo.
constexpr int64_t kHintFloats = 4 * W;
constexpr float kOnlineSlack = 2.0f;

int64_t online_blocks(int64_t n) { return (n + kOnlineBlock - 1) / kOnlineBlock; }

// s += exp(x - ref) over x[0, len), in two vector partial sums in a fixed order (e may alias x:
// each vector is loaded before it is stored); with kStore e[0, len) = exp(x - ref); with kMax
// returns the largest x - ref if any is >= 0 (otherwise some negative value). The maximum is taken
// on the bit patterns (max_bits): the integer units have issue slots to spare, the float max takes
// one of the non-FMA pipes' that the exponential needs. The paired loop keeps one sum and one
// maximum: with a pair of each, AVX2's 16 registers do not hold the loop, and the spilled sum's add
// waits on a store and a reload every iteration. `inline` here and on block_scale: without it GCC
// leaves them out of line, and softmax is slower for the calls.
//
// With a Side (kSide), the same loop also writes another row's finished output: side.y[i] =
// side.e[i] * side.f + side.g over [0, len) (one rounding: with g = 0 exactly e * f), full
// vectors with streaming stores (side.y aligned). Each iteration loads before it stores (see
// softmax_fused_rows on why the order matters).
struct Side {
  const float* e = nullptr;
  float* y = nullptr;
  Vec f = Vec::zero(), g = Vec::zero();
};

template <bool kStore, bool kMax, bool kSide = false>
inline float exp_pass(const float* x, float* e, int64_t len, float ref, Vec& s0, Vec& s1,
                      const Side& side = {}) {
  const Vec mv = Vec::set1(ref);
  Vec a0 = s0, a1 = s1;
  Vec n0 = Vec::set1(-0.0f), n1 = n0;  // the lowest bit pattern as int32
  int64_t i = 0;
  for (; i + 2 * W <= len; i += 2 * W) {
    const Vec d0 = Vec::load(x + i) - mv, d1 = Vec::load(x + i + W) - mv;
    Vec p0, p1;
    if (kSide) {
      p0 = Vec::load(side.e + i);
      p1 = Vec::load(side.e + i + W);
    }
    if (kMax) n0 = max_bits(n0, max_bits(d0, d1));
    const Vec e0 = exp_near(d0), e1 = exp_near(d1);
    if (kStore) {
      e0.store(e + i);
      e1.store(e + i + W);
    }
    if (kSide) {
      fma(p0, side.f, side.g).stream(side.y + i);
      fma(p1, side.f, side.g).stream(side.y + i + W);
    }
    a0 = a0 + (e0 + e1);
  }
  for (; i + W <= len; i += W) {
    const Vec d0 = Vec::load(x + i) - mv;
    Vec p0;
    if (kSide) p0 = Vec::load(side.e + i);
    if (kMax) n0 = max_bits(n0, d0);
    const Vec v = exp_near(d0);
    if (kStore) v.store(e + i);
    if (kSide) fma(p0, side.f, side.g).stream(side.y + i);
    a0 = a0 + v;
  }
  if (i < len) {
    const int r = static_cast<int>(len - i);
    const Vec d0 = Vec::load_n(x + i, r, -kInf) - mv;
    Vec p0;
    if (kSide) p0 = Vec::load_n(side.e + i, r);
    if (kMax) n1 = max_bits(n1, d0);
    const Vec v = exp_near(d0);
    if (kStore) v.store_n(e + i, r);
    if (kSide) fma(p0, side.f, side.g).store_n(side.y + i, r);
    a1 = a1 + v;
  }
  s0 = a0;
  s1 = a1;
  return kMax ? hmax_bits(max_bits(n0, n1)) : 0.0f;
}

// e = exp(x - m) (e may alias x; m >= max x); returns the sum of e.
float exp_store_sum(const float* x, float* e, int64_t n, float m) {
  Vec a0 = Vec::zero(), a1 = a0;
  exp_pass<true, false>(x, e, n, m, a0, a1);
  return hsum(a0 + a1);
}

// The running state over one row: the reference m and vector partial sums of exp(x - m),
// rescaled by exp(m_old - m_new) when m grows. m is at least -FLT_MAX, never -inf, so blocks of
// -inf (masked positions) contribute exp(-inf) = 0 rather than exp(-inf + inf) = NaN. A NaN in
// the row reaches the sum (through its own exponential) and so every output.
struct OnlineExp {
  float m;
  Vec s0 = Vec::zero(), s1 = Vec::zero();

  // `hint`: the maximum of the row's first elements (row_hint).
  explicit OnlineExp(float hint) : m(std::max(hint, -std::numeric_limits<float>::max())) {}

  // Folds in x[0, len); with kStore, e[0, len) = exp(x - ref), where ref (returned) is the
  // block's reference: ref <= m after the call, so e * exp(ref - m) / sum() is the softmax.
  // `last`: no block of this row follows, so a rise above m inside the slack needs no rescale
  // (an exponential and its latency per row, on rows of one block).
  // With kSide, the first pass over the block also writes side's output (exp_pass).
  template <bool kStore, bool kSide = false>
  float add(const float* x, float* e, int64_t len, bool last, const Side& side = {}) {
    const float ref = m;
    // The sums in locals: as members they are stored and reloaded every iteration (the stores
    // to e may alias them, as far as the compiler knows), which puts a store-to-load forwarding
    // delay on the sums' dependency chain.
    Vec a0 = s0, a1 = s1;
    // dm: the block's largest x - ref when one is >= 0 (below: some negative value, unused).
    const float dm = exp_pass<kStore, true, kSide>(x, e, len, ref, a0, a1, side);
    if (dm > kOnlineSlack) {  // redo against the block's maximum (not taken by NaN)
      const float bm = ref + dm;
      const Vec r = exp_diff(Vec::set1(ref), Vec::set1(bm));
      a0 = s0 * r;
      a1 = s1 * r;
      exp_pass<kStore, false>(x, e, len, bm, a0, a1);
      m = bm;
      s0 = a0;
      s1 = a1;
      return bm;
    }
    s0 = a0;
    s1 = a1;
    const float bm = ref + dm;
    if (!last && dm > 0.0f && bm > m) {  // later blocks against the new maximum
      const Vec r = exp_diff(Vec::set1(m), Vec::set1(bm));
      s0 = s0 * r;
      s1 = s1 * r;
      m = bm;
    }
    return ref;
  }
  float sum() const { return hsum(s0 + s1); }
};

float row_hint(const float* x, int64_t n) { return row_max(x, std::min(n, kHintFloats)); }

// Rows [rb, re) of x through OnlineExp. row(m, oe, block_ref) gets each row's state and each
// block's reference; with kStore the exponentials go to e_of(m).
template <bool kStore, typename ERow, typename Row>
void online_rows(const float* x, int64_t rb, int64_t re, int64_t n, ERow e_of, Row row) {
  const int64_t nb = online_blocks(n);
  std::vector<float> block_ref(static_cast<size_t>(nb));
  for (int64_t m = rb; m < re; ++m) {
    const float* xr = x + m * n;
    float* er = kStore ? e_of(m) : nullptr;
    OnlineExp oe(row_hint(xr, n));
    for (int64_t k = 0; k < nb; ++k) {
      const int64_t b0 = k * kOnlineBlock, len = std::min(kOnlineBlock, n - b0);
      block_ref[static_cast<size_t>(k)] =
          oe.add<kStore>(xr + b0, kStore ? er + b0 : nullptr, len, k + 1 == nb);
    }
    row(m, oe, block_ref.data());
  }
}

Vec load_r(const float* p, int r) { return r == W ? Vec::load(p) : Vec::load_n(p, r); }
// load_r for data arriving from memory (Vec::load_mem).
Vec load_mem_r(const float* p, int r) { return r == W ? Vec::load_mem(p) : Vec::load_n(p, r); }

// Writes y[0, n) from f(i, r), the vector of elements [i, i + r) (r < W only at the edges, where
// f must load with load_r). With `stream`, full vectors go out as non-temporal stores (aligned
// by a partial head), skipping the read-for-ownership a plain store of a cold line costs; for
// outputs larger than the last-level cache (stream_output), which would not stay cached anyway.
template <typename F>
void emit(bool stream, float* y, int64_t n, F f) {
  int64_t i = 0;
  if (stream) {
    constexpr int64_t kAlign = W * static_cast<int64_t>(sizeof(float));
    const int64_t mis = static_cast<int64_t>(reinterpret_cast<uintptr_t>(y) % kAlign) / 4;
    if (mis != 0) {
      const int h = static_cast<int>(std::min<int64_t>(W - mis, n));
      f(0, h).store_n(y, h);
      i = h;
    }
    for (; i + W <= n; i += W) f(i, W).stream(y + i);
  } else {
    for (; i + W <= n; i += W) f(i, W).store(y + i);
  }
  if (i < n) {
    const int r = static_cast<int>(n - i);
    f(i, r).store_n(y + i, r);
  }
}

// Whether every row of n floats from p starts on a vector boundary, as streaming stores of whole
// vectors need.
inline bool rows_aligned(const float* p, int64_t n) {
  return reinterpret_cast<uintptr_t>(p) % (W * sizeof(float)) == 0 && n % W == 0;
}

// The backward kernels accept dx == dy, and cross_entropy_backward dx == its logits
// (kernels/op_list.h: the engine hands them a buffer nothing else reads): every element of that
// input is loaded before dx's at the same place is stored. They then store plainly, never
// streaming: the lines were just read, so a store costs no read-for-ownership and the line goes
// back as an ordinary write-back, which outruns streaming stores of the same data (BENCHMARKS.md,
// "Kernel design measurements").
inline bool in_place(const float* dx, const float* dy) { return dx == dy; }

// Applies f(Vec) -> Vec elementwise from one input row to one output row.
template <typename F>
void map1(const float* x, float* y, int64_t n, F f, bool stream = false) {
  emit(stream, y, n, [&](int64_t i, int r) { return f(load_r(x + i, r)); });
}
template <typename F>
void map2(const float* a, const float* b, float* y, int64_t n, F f, bool stream = false) {
  emit(stream, y, n, [&](int64_t i, int r) { return f(load_r(a + i, r), load_r(b + i, r)); });
}

// f(m) for every row, threaded over row ranges; `stream` fences each range's streaming stores.
template <typename F>
void for_rows(int64_t rows, int64_t n, F f, bool stream = false) {
  parallel_for(0, rows, row_grain(n), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) f(m);
    if (stream) Vec::fence();
  });
}

// dst[j] = sum over blocks b (in order) of src[b * stride + j].
void sum_blocks(const float* src, int64_t blocks, int64_t n, int64_t stride, float* dst) {
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    Vec s = Vec::zero();
    for (int64_t b = 0; b < blocks; ++b) s = s + Vec::load(src + b * stride + j);
    s.store(dst + j);
  }
  for (; j < n; ++j) {
    float s = 0;
    for (int64_t b = 0; b < blocks; ++b) s += src[b * stride + j];
    dst[j] = s;
  }
}

// ---- sum of squares -------------------------------------------------------------------------

// y[m] = sum of x[m, :]^2. Rows are cut into blocks of kSqBlock floats, each summed by row_dot
// (four vector sums in f32, fixed order) and the blocks' sums added in f64 in order: the result
// does not depend on the thread count, and one long row (a flat gradient of 10^8 floats, the
// grad-norm's case) is read by every thread at memory speed.
void sum_sq(const float* x, float* y, int64_t rows, int64_t n) {
  constexpr int64_t kSqBlock = 16384;
  const int64_t nb = std::max<int64_t>(1, (n + kSqBlock - 1) / kSqBlock);
  std::vector<double> part(static_cast<size_t>(rows * nb));
  parallel_for(0, rows * nb, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const int64_t b0 = k % nb * kSqBlock, len = std::min(kSqBlock, n - b0);
      const float* p = x + k / nb * n + b0;
      part[static_cast<size_t>(k)] = len > 0 ? row_dot<true>(p, p, len) : 0.0;
    }
  });
  for (int64_t m = 0; m < rows; ++m) {
    double s = 0.0;
    for (int64_t j = 0; j < nb; ++j) s += part[static_cast<size_t>(m * nb + j)];
    y[m] = static_cast<float>(s);
  }
}

// y[j] = the sum of x[:, j] over contiguous [rows, n], from zero and the rows in order, in f32
// (sum_blocks): the order and precision of the product 1^T x it stands for, and the same at any
// thread count (threads take runs of whole vectors of columns).
void sum_rows(const float* x, float* y, int64_t rows, int64_t n) {
  const int64_t vecs = (n + W - 1) / W;
  parallel_for(0, vecs, std::max<int64_t>(1, 65536 / std::max<int64_t>(W * rows, 1)),
               [&](int64_t b, int64_t e) {
                 const int64_t j0 = b * W;
                 sum_blocks(x + j0, rows, std::min(n, e * W) - j0, n, y + j0);
               });
}

// ---- softmax family --------------------------------------------------------------------------

// The scale of block k of a softmax row, exp(block_ref[k] - m) / sum with inv = 1 / sum: block
// k's exponentials were taken against block_ref[k] <= m. Kept from block k - 1 (f) where the
// reference did not move; where it is m itself, exp(m - m) is exactly 1 and skipped, with its
// latency.
inline Vec block_scale(const float* block_ref, int64_t k, float m, float inv, Vec f) {
  if (k > 0 && block_ref[k] == block_ref[k - 1]) return f;
  return block_ref[k] == m ? Vec::set1(inv)
                           : exp_diff(Vec::set1(block_ref[k]), Vec::set1(m)) * Vec::set1(inv);
}

// y = e * (block k's scale) over a row of n whose exponentials e were taken against block_ref.
void scale_row(const float* e, float* y, int64_t n, const float* block_ref, float m, float inv,
               bool stream) {
  Vec f = Vec::zero();
  for (int64_t k = 0; k < online_blocks(n); ++k) {
    f = block_scale(block_ref, k, m, inv, f);
    const int64_t b0 = k * kOnlineBlock;
    map1(
        e + b0, y + b0, std::min(kOnlineBlock, n - b0), [&](Vec v) { return v * f; }, stream);
  }
}

// Rows whose buffer of exponentials would take more than a quarter of L1 (over 2048 floats here),
// written with streaming stores: the exponentials of the row's first blocks (a quarter of L1 of
// them) are kept in a buffer, and the second pass takes the others again from x, against the same
// references, so the result is bitwise the one the buffered path gives. Where the row and that
// buffer would not fit in L1 together (over 6144 floats here) nothing is kept. A whole-row buffer
// that falls out of L1 makes its stores and loads L1 misses beside the memory stream, which costs
// more than taking the exponentials twice, and more than keeping only a quarter of L1 of them
// (BENCHMARKS.md, "Kernel design measurements").
bool softmax_recomputes(int64_t rows, int64_t n) {
  return stream_output(rows * n * 4) && n * 4 > l1_data_cache_bytes() / 4;
}

void softmax_long_rows(const float* x, float* y, int64_t rows, int64_t n) {
  const int64_t nb = online_blocks(n);
  const int64_t l1 = l1_data_cache_bytes();
  const int64_t kept =
      n * 4 + l1 / 4 <= l1 ? std::min<int64_t>(nb, l1 / 4 / (kOnlineBlock * 4)) : 0;
  parallel_for(0, rows, row_grain(n), [&](int64_t b, int64_t e) {
    float* buf = thread_scratch<float>(ScratchSlot::kRowBuffer, kept * kOnlineBlock);
    std::vector<float> block_ref(static_cast<size_t>(nb));
    for (int64_t m = b; m < e; ++m) {
      const float* xr = x + m * n;
      float* yr = y + m * n;
      OnlineExp oe(row_hint(xr, n));
      for (int64_t k = 0; k < nb; ++k) {
        const int64_t b0 = k * kOnlineBlock, len = std::min(kOnlineBlock, n - b0);
        block_ref[static_cast<size_t>(k)] = k < kept
                                                ? oe.add<true>(xr + b0, buf + b0, len, k + 1 == nb)
                                                : oe.add<false>(xr + b0, nullptr, len, k + 1 == nb);
      }
      const float inv = 1.0f / oe.sum();
      Vec f = Vec::zero();
      for (int64_t k = 0; k < nb; ++k) {
        f = block_scale(block_ref.data(), k, oe.m, inv, f);
        const int64_t b0 = k * kOnlineBlock, len = std::min(kOnlineBlock, n - b0);
        if (k < kept) {
          map1(
              buf + b0, yr + b0, len, [&](Vec v) { return v * f; }, true);
          continue;
        }
        const Vec rv = Vec::set1(block_ref[static_cast<size_t>(k)]);
        emit(true, yr + b0, len, [&](int64_t i, int r) {
          const float* p = xr + b0 + i;
          return exp_diff(r == W ? Vec::load(p) : Vec::load_n(p, r, -kInf), rv) * f;
        });
      }
    }
    Vec::fence();
  });
}

// Rows [rb, re) of a streaming softmax, software-pipelined: row m's output is written in the
// loop that takes row m + 1's exponentials (exp_pass's Side), so reading memory overlaps writing
// it; done one after the other, the exponential pass waits on compute and the output pass on the
// write bandwidth. Two row buffers of exponentials, the current row's and the next's. They sit
// half a page apart modulo 4 KiB: at the same page offset, every load of the current buffer would
// follow a store to the other at the same offset (4 KiB aliasing), and the pipelined form would be
// slower than the plain one; half a page (or 1 or 3 KiB) apart it is faster (BENCHMARKS.md,
// "Kernel design measurements").
// y's rows must be aligned for streaming stores (softmax checks).
void softmax_fused_rows(const float* x, float* y, int64_t rb, int64_t re, int64_t n) {
  const int64_t nb = online_blocks(n);
  constexpr int64_t kPage = 4096 / sizeof(float);
  const int64_t stride = (n + kPage - 1) / kPage * kPage + kPage / 2;
  float* raw = thread_scratch<float>(ScratchSlot::kRowBuffer, stride + n + kPage);
  float* e0 = raw + (kPage - reinterpret_cast<uintptr_t>(raw) / sizeof(float) % kPage) % kPage;
  float* buf[2] = {e0, e0 + stride};
  std::vector<float> refs[2] = {std::vector<float>(static_cast<size_t>(nb)),
                                std::vector<float>(static_cast<size_t>(nb))};
  float m_prev = 0.0f, inv_prev = 0.0f;
  for (int64_t m = rb; m <= re; ++m) {
    const int cur = static_cast<int>((m - rb) & 1), prev = cur ^ 1;
    const float* pref = refs[prev].data();
    float* py = m > rb ? y + (m - 1) * n : nullptr;  // the previous row's output
    if (m == re) {                                   // the last row's output on its own
      scale_row(buf[prev], py, n, pref, m_prev, inv_prev, true);
      break;
    }
    Vec f = Vec::zero();
    const float* xr = x + m * n;
    OnlineExp oe(row_hint(xr, n));
    for (int64_t k = 0; k < nb; ++k) {
      const int64_t b0 = k * kOnlineBlock, len = std::min(kOnlineBlock, n - b0);
      const bool last = k + 1 == nb;
      float* ref = refs[cur].data() + k;
      if (m == rb) {
        *ref = oe.add<true>(xr + b0, buf[cur] + b0, len, last);
      } else {
        f = block_scale(pref, k, m_prev, inv_prev, f);
        *ref =
            oe.add<true, true>(xr + b0, buf[cur] + b0, len, last, Side{buf[prev] + b0, py + b0, f});
      }
    }
    m_prev = oe.m;
    inv_prev = 1.0f / oe.sum();
  }
}

// Streaming (outputs larger than the last-level cache): softmax_fused_rows where y's rows are
// aligned, else the exponentials go to a per-thread row buffer and y is written once, at the end;
// not streaming: they go to y and are scaled in place. Long rows: softmax_long_rows. (The
// buffered and in-place paths stay apart: folded into one, with a branch per block, the buffered
// path is slower.)
void softmax(const float* x, float* y, int64_t rows, int64_t n) {
  if (softmax_recomputes(rows, n)) {
    softmax_long_rows(x, y, rows, n);
    return;
  }
  const bool stream = stream_output(rows * n * 4);
  const bool aligned = rows_aligned(y, n);
  if (stream && aligned) {
    parallel_for(0, rows, row_grain(n), [&](int64_t b, int64_t e) {
      softmax_fused_rows(x, y, b, e, n);
      Vec::fence();
    });
    return;
  }
  parallel_for(0, rows, row_grain(n), [&](int64_t b, int64_t e) {
    float* scratch = stream ? thread_scratch<float>(ScratchSlot::kRowBuffer, n) : nullptr;
    online_rows<true>(
        x, b, e, n, [&](int64_t m) { return stream ? scratch : y + m * n; },
        [&](int64_t m, const OnlineExp& oe, const float* block_ref) {
          scale_row(stream ? scratch : y + m * n, y + m * n, n, block_ref, oe.m, 1.0f / oe.sum(),
                    stream);
        });
    if (stream) Vec::fence();
  });
}

// Whether two rows of n floats take at most a quarter of L1 (1024 floats here): where the
// pipelined row kernels' choice between reading the next row in the current row's loop and one
// row at a time turns.
bool two_rows_in_quarter_l1(int64_t n) { return 2 * n * 4 * 4 <= l1_data_cache_bytes(); }

// Rows [rb, re) of a streaming log_softmax, pipelined as softmax_fused_rows: row m's output
// (x - lse, from x's row m in cache) is written in the loop over row m + 1. Only for short rows
// (two_rows_in_quarter_l1): there it is faster than one row at a time, on longer rows no faster
// and then slower (BENCHMARKS.md, "Kernel design measurements").
void log_softmax_fused_rows(const float* x, float* y, int64_t rb, int64_t re, int64_t n) {
  const int64_t nb = online_blocks(n);
  float lse_prev = 0.0f;
  for (int64_t m = rb; m <= re; ++m) {
    const float* px = m > rb ? x + (m - 1) * n : nullptr;  // the previous row
    float* py = m > rb ? y + (m - 1) * n : nullptr;
    if (m == re) {
      const Vec lse = Vec::set1(lse_prev);
      map1(
          px, py, n, [&](Vec v) { return v - lse; }, true);
      break;
    }
    const float* xr = x + m * n;
    OnlineExp oe(row_hint(xr, n));
    const Vec one = Vec::set1(1.0f), neg_lse = Vec::set1(-lse_prev);  // x * 1 - lse
    for (int64_t k = 0; k < nb; ++k) {
      const int64_t b0 = k * kOnlineBlock, len = std::min(kOnlineBlock, n - b0);
      const bool last = k + 1 == nb;
      if (m == rb) {
        oe.add<false>(xr + b0, nullptr, len, last);
      } else {
        oe.add<false, true>(xr + b0, nullptr, len, last, Side{px + b0, py + b0, one, neg_lse});
      }
    }
    lse_prev = oe.m + std::log(oe.sum());
  }
}

void log_softmax(const float* x, float* y, int64_t rows, int64_t n) {
  const bool stream = stream_output(rows * n * 4);
  const bool aligned = rows_aligned(y, n);
  if (stream && aligned && two_rows_in_quarter_l1(n)) {
    parallel_for(0, rows, row_grain(n), [&](int64_t b, int64_t e) {
      log_softmax_fused_rows(x, y, b, e, n);
      Vec::fence();
    });
    return;
  }
  parallel_for(0, rows, row_grain(n), [&](int64_t b, int64_t e) {
    online_rows<false>(
        x, b, e, n, [](int64_t) { return static_cast<float*>(nullptr); },
        [&](int64_t m, const OnlineExp& oe, const float*) {
          const Vec lse = Vec::set1(oe.m + std::log(oe.sum()));
          map1(
              x + m * n, y + m * n, n, [&](Vec v) { return v - lse; }, stream);
        });
    if (stream) Vec::fence();
  });
}

// One row of softmax_backward (dx = y * (dy - dot)) that also returns the dot of the next row
// (ng, np), read in the same loop: reading the next row overlaps writing this one. The dot is
// accumulated in row_dot's exact order, so a row's result never depends on where a thread's
// range starts. kStream: full vectors go out with streaming stores (out 64-byte aligned).
template <bool kStream>
float softmax_backward_row(const float* g, const float* p, float* out, int64_t n, float dot,
                           const float* ng, const float* np) {
  const Vec dv = Vec::set1(dot);
  auto put = [&](int64_t i) {
    const Vec v = Vec::load(p + i) * (Vec::load(g + i) - dv);
    if (kStream) {
      v.stream(out + i);
    } else {
      v.store(out + i);
    }
  };
  Vec a0 = Vec::zero(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 = fma(Vec::load(ng + i), Vec::load(np + i), a0);
    a1 = fma(Vec::load(ng + i + W), Vec::load(np + i + W), a1);
    put(i);
    put(i + W);
    a2 = fma(Vec::load(ng + i + 2 * W), Vec::load(np + i + 2 * W), a2);
    a3 = fma(Vec::load(ng + i + 3 * W), Vec::load(np + i + 3 * W), a3);
    put(i + 2 * W);
    put(i + 3 * W);
  }
  for (; i + W <= n; i += W) {
    a0 = fma(Vec::load(ng + i), Vec::load(np + i), a0);
    put(i);
  }
  if (i < n) {
    const int r = static_cast<int>(n - i);
    a1 = fma(Vec::load_n(ng + i, r), Vec::load_n(np + i, r), a1);
    (Vec::load_n(p + i, r) * (Vec::load_n(g + i, r) - dv)).store_n(out + i, r);
  }
  return hsum((a0 + a1) + (a2 + a3));
}

// dx = y * (dy - dot(dy, y)), each row's dot read while the previous row is written (above).
// Rows whose output is not 64-byte aligned under streaming stores (which need it) take row_dot
// and emit one after the other instead, and so does dx written over dy (in_place, above): there
// the stores hit lines just loaded, and the look-ahead's loads of row m + 1 would follow stores
// to row m at the same page offset whenever a row is a multiple of 4 KiB (4 KiB aliasing), which
// makes the look-ahead slower than one row after the other. So do short rows
// (two_rows_in_quarter_l1), since the dot reads with load_mem: there one row at a time is faster
// than the look-ahead, which wins on longer rows (BENCHMARKS.md, "Kernel design measurements").
void softmax_backward(const float* dy, const float* y, float* dx, int64_t rows, int64_t n) {
  const bool stream = stream_output(rows * n * 4) && !in_place(dx, dy);
  parallel_for(0, rows, row_grain(n), [&](int64_t rb, int64_t re) {
    float dot = row_dot<true>(dy + rb * n, y + rb * n, n);
    for (int64_t m = rb; m < re; ++m) {
      const int64_t o = m * n;
      const float *g = dy + o, *p = y + o;
      float* out = dx + o;
      const bool aligned = reinterpret_cast<uintptr_t>(out) % (W * sizeof(float)) == 0;
      if (m + 1 == re || (stream && !aligned) || in_place(dx, dy) || two_rows_in_quarter_l1(n)) {
        const Vec dv = Vec::set1(dot);
        emit(stream, out, n,
             [&](int64_t i, int r) { return load_r(p + i, r) * (load_r(g + i, r) - dv); });
        if (m + 1 < re) dot = row_dot<true>(g + n, p + n, n);
      } else if (stream) {
        dot = softmax_backward_row<true>(g, p, out, n, dot, g + n, p + n);
      } else {
        dot = softmax_backward_row<false>(g, p, out, n, dot, g + n, p + n);
      }
    }
    if (stream) Vec::fence();
  });
}

// The backwards that take the probabilities again from log-probabilities (log_softmax's e^y,
// cross_entropy's e^(x - lse): exponents <= 0) use exp_near, as the forwards' numerators do: its
// relative error (6 + 2|d|) * 2^-24 gives a probability e^d within 6 * 2^-24 absolute, and it
// costs 8 operations against exp_nonpos's 12 (17 on AVX2), so both backwards run faster with it
// on both ISAs, most on AVX2 (BENCHMARKS.md, "Kernel design measurements").
void log_softmax_backward(const float* dy, const float* y, float* dx, int64_t rows, int64_t n) {
  const bool stream = stream_output(rows * n * 4) && !in_place(dx, dy);
  for_rows(
      rows, n,
      [&](int64_t m) {
        const int64_t o = m * n;
        const Vec s = Vec::set1(row_sum<true>(dy + o, n));
        map2(
            dy + o, y + o, dx + o, n, [&](Vec g, Vec ly) { return g - exp_near(ly) * s; }, stream);
      },
      stream);
}

// ---- normalisation ---------------------------------------------------------------------------

// Four accumulators, as row_sum: with two, the fma latency chain (not the loads) sets the pace.
float centred_sq_sum(const float* x, int64_t n, float mu) {
  const Vec mv = Vec::set1(mu);
  Vec a0 = Vec::zero(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    const Vec d0 = Vec::load(x + i) - mv, d1 = Vec::load(x + i + W) - mv;
    const Vec d2 = Vec::load(x + i + 2 * W) - mv, d3 = Vec::load(x + i + 3 * W) - mv;
    a0 = fma(d0, d0, a0);
    a1 = fma(d1, d1, a1);
    a2 = fma(d2, d2, a2);
    a3 = fma(d3, d3, a3);
  }
  for (; i + W <= n; i += W) {
    const Vec d = Vec::load(x + i) - mv;
    a0 = fma(d, d, a0);
  }
  if (i < n) {
    const int r = static_cast<int>(n - i);
    const Vec d = Vec::load_n(x + i, r, mu) - mv;  // padding lanes contribute exactly 0
    a1 = fma(d, d, a1);
  }
  return hsum((a0 + a1) + (a2 + a3));
}

// A row's mean and sum of squared deviations (M2), in one read of the row: the sums of d = x - s
// and of d^2 about s, the mean of the row's first vector, in float (four accumulators each, so
// neither latency chain sets the pace), then M2 = S2 - S1^2 / n in double. S2 / M2 =
// 1 + (s - mean)^2 n / M2: about 1 + 1/W on typical rows, so the subtraction costs next to no
// accuracy. Rows where it exceeds kShiftedLimit (a first vector far from the rest of the row)
// take the exact two passes again (a sum, then the squared deviations from its mean; the row is
// in cache by then), so M2's error stays within ~kShiftedLimit times the float sums' rounding.
// Shifting by x[0] alone cancels enough to move train_tp_test's tensor-parallel gradient norms
// visibly further from the single process's than either this or the two passes do.
// The one read is faster than two passes over the row (a sum in chunks of 256 floats merged by
// Chan's formula past 1024, then the squared deviations) on most shapes (BENCHMARKS.md, "Kernel
// design measurements").
constexpr double kShiftedLimit = 16.0;

template <bool kMem>
void row_mean_m2(const float* x, int64_t n, double& mean, double& m2) {
  const int head = static_cast<int>(std::min<int64_t>(W, n));
  const float s = hsum(Vec::load_n(x, head)) / static_cast<float>(head);
  const Vec sv = Vec::set1(s);
  Vec a[4], q[4];
  for (int k = 0; k < 4; ++k) a[k] = q[k] = Vec::zero();
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const Vec d = load_v<kMem>(x + i + k * W) - sv;
      a[k] = a[k] + d;
      q[k] = fma(d, d, q[k]);
    }
  }
  for (; i < n; i += W) {
    const int r = static_cast<int>(std::min<int64_t>(W, n - i));
    const Vec d = Vec::load_n(x + i, r, s) - sv;  // padding lanes contribute exactly 0
    a[0] = a[0] + d;
    q[0] = fma(d, d, q[0]);
  }
  const double s1 = hsum((a[0] + a[1]) + (a[2] + a[3]));
  const double s2 = hsum((q[0] + q[1]) + (q[2] + q[3]));
  const double dn = static_cast<double>(n);
  m2 = s2 - s1 * s1 / dn;
  if (m2 < 0.0) m2 = 0.0;  // rounding; a NaN stays NaN (std::max would make it 0)
  mean = s + s1 / dn;
  if (s2 > kShiftedLimit * m2) {
    const float mu = static_cast<float>(static_cast<double>(row_sum<false>(x, n)) / dn);
    mean = mu;
    m2 = centred_sq_sum(x, n, mu);
  }
}

// Long norm rows. A norm's second pass reads its row again together with the weight vectors and
// partials (`arrays` rows of n floats in all, the row included). Where those take 2/3 of L1 or
// more they no longer stay there between the passes, and the next row's arrival evicts what the
// second pass needs, so the per-row form falls far behind the memory's pace.
// Such rows go in groups of kNormGroup: each row's statistics first, then the group's output
// kNormCols columns at a time across its rows, so a block of the weights stays in L1 while the
// rows come back from L2. While a group's output goes out, the next group's rows are prefetched,
// evenly over the output blocks, so memory reads them during the writes instead of after them.
// Prefetching faster than the output's pace (the next group within the first half of the output)
// or slower is no better; prefetching into L1 (t0) is worse. The threshold is 2/3 of L1, not more:
// the per-row forms already fall behind the grouped ones below 3/4 (layer_norm forward at 2032
// floats, its backward at 1200), and each kernel counts every array its second pass reads
// (BENCHMARKS.md, "Kernel design measurements").
constexpr int64_t kNormGroup = 16;
constexpr int64_t kNormCols = 512;

bool norm_rows_long(int64_t n, int arrays) {
  return int64_t{3} * arrays * n * static_cast<int64_t>(sizeof(float)) >= 2 * l1_data_cache_bytes();
}

// Rows [g0, g1) of a norm's output, column block by column block: out(m) is row m's output and
// row(m) returns f(i, r), the vector of its elements [i, i + r) (loading with load_r). [next,
// next_end) is prefetched (into L2) as the blocks go out: n floats of it over each column block.
template <typename Out, typename Row>
void norm_group_output(bool stream, int64_t g0, int64_t g1, int64_t n, Out out, Row row,
                       const float* next, const float* next_end) {
  const char* p = reinterpret_cast<const char*>(next);
  const char* end = reinterpret_cast<const char*>(next_end);
  constexpr int64_t kLineFloats = 16;  // a 64-byte line
  for (int64_t c = 0; c < n; c += kNormCols) {
    const int64_t len = std::min(kNormCols, n - c);
    for (int64_t m = g0; m < g1; ++m) {
      const auto f = row(m);
      emit(stream, out(m) + c, len, [&](int64_t i, int r) { return f(c + i, r); });
      for (int64_t k = 0; k < len && p < end; k += kLineFloats, p += 4 * kLineFloats) {
        __builtin_prefetch(p, 0, 1);  // prefetcht2 on x86
      }
    }
  }
}

// Rows [0, rows) of a norm forward over x: stats(m, from_memory) takes row m's statistics, row(m)
// gives its output as for norm_group_output; long rows (`arrays` as for norm_rows_long) go in
// groups, whose rows the statistics find in cache (prefetched, except for each thread's first
// group): from_memory false.
template <typename Stats, typename Row>
void norm_forward_rows(int64_t rows, int64_t n, int arrays, const float* x, float* y, Stats stats,
                       Row row) {
  const bool stream = stream_output(rows * n * 4);
  if (!norm_rows_long(n, arrays)) {
    for_rows(
        rows, n,
        [&](int64_t m) {
          stats(m, true);
          const auto f = row(m);
          if (m + 1 == rows) return emit(stream, y + m * n, n, f);
          // The next row is prefetched (into L2) along the output, a line per vector, so that
          // memory reads it while this row's output goes out (BENCHMARKS.md, "Kernel design
          // measurements": layer_norm's rows of 1280-1792 floats gain most).
          const float* next = x + (m + 1) * n;
          emit(stream, y + m * n, n, [&](int64_t i, int r) {
            __builtin_prefetch(next + i, 0, 1);  // prefetcht2 on x86
            return f(i, r);
          });
        },
        stream);
    return;
  }
  const int64_t groups = (rows + kNormGroup - 1) / kNormGroup;
  parallel_for(0, groups, 1, [&](int64_t gb, int64_t ge) {
    for (int64_t g = gb; g < ge; ++g) {
      const int64_t g0 = g * kNormGroup, g1 = std::min(rows, g0 + kNormGroup);
      for (int64_t m = g0; m < g1; ++m) stats(m, false);
      // The next group of this thread's range, if any.
      const int64_t next_end = g + 1 < ge ? std::min(rows, g1 + kNormGroup) : g1;
      norm_group_output(
          stream, g0, g1, n, [&](int64_t m) { return y + m * n; }, row, x + g1 * n,
          x + next_end * n);
    }
    if (stream) Vec::fence();
  });
}

void layer_norm(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                int64_t rows, int64_t n, double eps) {
  norm_forward_rows(
      rows, n, 3, x, y,
      [&](int64_t m, bool from_memory) {
        double mu, m2;
        if (from_memory) {
          row_mean_m2<true>(x + m * n, n, mu, m2);
        } else {
          row_mean_m2<false>(x + m * n, n, mu, m2);
        }
        mean[m] = static_cast<float>(mu);
        rstd[m] = static_cast<float>(1.0 / std::sqrt(m2 / static_cast<double>(n) + eps));
      },
      [&](int64_t m) {
        const float* xr = x + m * n;
        const Vec mv = Vec::set1(mean[m]), rv = Vec::set1(rstd[m]);
        return [=](int64_t i, int r) {
          return fma((load_mem_r(xr + i, r) - mv) * rv, load_r(w + i, r), load_r(b + i, r));
        };
      });
}

// dx = rstd * (dy * w - a - xhat * c), given na = -a and nc = -c, in explicit fmas: written as
// that expression, the compiler contracts it differently in emit's streaming and plain loops,
// whose results then differ in the last bit (so dx would depend on the tensor's size).
inline Vec norm_dx(Vec g, Vec w, Vec xhat, Vec rv, Vec na, Vec nc) {
  return rv * fma(xhat, nc, fma(g, w, na));
}

// One block of rows of layer_norm / rms_norm backward (centred = false: rms, mean unused).
// dx for each row; this block's weight-gradient partials added into pdw (and pdb), zeroed by
// the caller.
template <bool kCentred>
void norm_backward_block(const float* dy, const float* x, const float* w, const float* mean,
                         const float* rstd, float* dx, float* pdw, float* pdb, int64_t r0,
                         int64_t r1, int64_t n, bool stream) {
  for (int64_t m = r0; m < r1; ++m) {
    const float* dyr = dy + m * n;
    const float* xr = x + m * n;
    const Vec mv = Vec::set1(kCentred ? mean[m] : 0.0f), rv = Vec::set1(rstd[m]);
    // Pass 1: s1 = sum(dy * w), s2 = sum(dy * w * xhat); weight-gradient partials. Two
    // accumulators each (even and odd vectors): with one, the add/fma latency chain sets the pace.
    Vec s1[2] = {Vec::zero(), Vec::zero()}, s2[2] = {Vec::zero(), Vec::zero()};
    int64_t i = 0;
    auto step = [&](Vec g, Vec xv, Vec wv, float* pw, float* pb, int r, int k) {
      const Vec xhat = (xv - mv) * rv;
      const Vec gw = g * wv;
      if constexpr (kCentred) s1[k] = s1[k] + gw;
      s2[k] = fma(gw, xhat, s2[k]);
      if (r == W) {
        fma(g, xhat, Vec::load(pw)).store(pw);
        if constexpr (kCentred) (Vec::load(pb) + g).store(pb);
      } else {
        fma(g, xhat, Vec::load_n(pw, r)).store_n(pw, r);
        if constexpr (kCentred) (Vec::load_n(pb, r) + g).store_n(pb, r);
      }
    };
    for (; i + 2 * W <= n; i += 2 * W) {
      step(Vec::load_mem(dyr + i), Vec::load_mem(xr + i), Vec::load(w + i), pdw + i,
           kCentred ? pdb + i : nullptr, W, 0);
      step(Vec::load_mem(dyr + i + W), Vec::load_mem(xr + i + W), Vec::load(w + i + W), pdw + i + W,
           kCentred ? pdb + i + W : nullptr, W, 1);
    }
    if (i + W <= n) {
      step(Vec::load_mem(dyr + i), Vec::load_mem(xr + i), Vec::load(w + i), pdw + i,
           kCentred ? pdb + i : nullptr, W, 0);
      i += W;
    }
    if (i < n) {
      const int r = static_cast<int>(n - i);
      step(Vec::load_n(dyr + i, r), Vec::load_n(xr + i, r), Vec::load_n(w + i, r), pdw + i,
           kCentred ? pdb + i : nullptr, r, 1);
    }
    const Vec na = Vec::set1(kCentred ? -hsum(s1[0] + s1[1]) / static_cast<float>(n) : 0.0f);
    const Vec nc = Vec::set1(-hsum(s2[0] + s2[1]) / static_cast<float>(n));
    // Pass 2 (row in cache): dx = rstd * (dy * w - a - xhat * c).
    emit(stream, dx + m * n, n, [&](int64_t i, int r) {
      const Vec xhat = (load_r(xr + i, r) - mv) * rv;
      return norm_dx(load_r(dyr + i, r), load_r(w + i, r), xhat, rv, na, nc);
    });
  }
  if (stream) Vec::fence();
}

// Long rows of norm backward (norm_rows_long: the row's x and dy, w and the partials dw, db),
// in groups of kNormBackGroup rows: each row's sums first, then the group's dx kColVecs vectors
// of columns at a time across its rows, that block's weight-gradient sums held in registers over
// the group and added to the partials once. On such rows the per-row form reads its partials
// and w from L2 in both passes.
// A block is 128 columns (512 bytes of each row) on every ISA: what sets the pace is the bytes of
// each row a block takes, not the registers. On AVX-512 that is eight vectors (w, dw and db
// sums: 24 of the 32 registers), faster than four, and sixteen are no faster. On AVX2 it is
// sixteen, its w and sums partly on the stack, far faster than two (64 bytes of a row) and level
// with AVX-512. The v loops carry `#pragma GCC unroll`: left rolled, GCC keeps the arrays in
// memory, which slows AVX-512 (AVX2's 16 registers cannot hold them anyway).
// Groups of at most kNormBackGroup rows, and at most kNormBackGroupBytes of x and dy (half of a
// 1 MiB L2), from which the second pass reads them back: on rows of 16384 floats and more, 32
// rows (4-8 MB) no longer come back from L2, and byte-bounded groups are faster (BENCHMARKS.md,
// "Kernel design measurements").
constexpr int64_t kNormBackGroup = 32;
constexpr int64_t kNormBackGroupBytes = int64_t{512} << 10;
constexpr int kColVecs = 128 / W;  // W divides 128 on every ISA

struct NormRow {
  float mean, rstd, a, c;  // dx = rstd * (dy * w - a - xhat * c)
};

// Columns [j, j + kColVecs * W) of rows [g0, g1); kStream: the rows' blocks are aligned.
template <bool kCentred, bool kStream>
void norm_backward_cols(const float* dy, const float* x, const float* w, const NormRow* k,
                        float* dx, float* pdw, float* pdb, int64_t g0, int64_t g1, int64_t n,
                        int64_t j) {
  Vec wv[kColVecs], aw[kColVecs], ab[kColVecs];
#pragma GCC unroll 16
  for (int v = 0; v < kColVecs; ++v) {
    wv[v] = Vec::load(w + j + v * W);
    aw[v] = Vec::zero();
    ab[v] = Vec::zero();
  }
  for (int64_t m = g0; m < g1; ++m) {
    const NormRow& q = k[m - g0];
    const Vec mv = Vec::set1(q.mean), rv = Vec::set1(q.rstd), na = Vec::set1(-q.a),
              nc = Vec::set1(-q.c);
    const float* g = dy + m * n + j;
    const float* xr = x + m * n + j;
    float* out = dx + m * n + j;
#pragma GCC unroll 16
    for (int v = 0; v < kColVecs; ++v) {
      const Vec gv = Vec::load(g + v * W);
      const Vec xhat = (Vec::load(xr + v * W) - mv) * rv;
      const Vec o = norm_dx(gv, wv[v], xhat, rv, na, nc);
      if (kStream) {
        o.stream(out + v * W);
      } else {
        o.store(out + v * W);
      }
      aw[v] = fma(gv, xhat, aw[v]);
      if (kCentred) ab[v] = ab[v] + gv;
    }
  }
#pragma GCC unroll 16
  for (int v = 0; v < kColVecs; ++v) {
    (Vec::load(pdw + j + v * W) + aw[v]).store(pdw + j + v * W);
    if (kCentred) (Vec::load(pdb + j + v * W) + ab[v]).store(pdb + j + v * W);
  }
}

// The columns [j, n) left over by norm_backward_cols, a vector at a time.
template <bool kCentred>
void norm_backward_tail(const float* dy, const float* x, const float* w, const NormRow* k,
                        float* dx, float* pdw, float* pdb, int64_t g0, int64_t g1, int64_t n,
                        int64_t j) {
  for (; j < n; j += W) {
    const int r = static_cast<int>(std::min<int64_t>(W, n - j));
    const Vec wv = load_r(w + j, r);
    Vec aw = Vec::zero(), ab = Vec::zero();
    for (int64_t m = g0; m < g1; ++m) {
      const NormRow& q = k[m - g0];
      const Vec rv = Vec::set1(q.rstd);
      const Vec gv = load_r(dy + m * n + j, r);
      const Vec xhat = (load_r(x + m * n + j, r) - Vec::set1(q.mean)) * rv;
      norm_dx(gv, wv, xhat, rv, Vec::set1(-q.a), Vec::set1(-q.c)).store_n(dx + m * n + j, r);
      aw = fma(gv, xhat, aw);
      if (kCentred) ab = ab + gv;
    }
    (load_r(pdw + j, r) + aw).store_n(pdw + j, r);
    if (kCentred) (load_r(pdb + j, r) + ab).store_n(pdb + j, r);
  }
}

// norm_backward_block for long rows (above).
template <bool kCentred>
void norm_backward_block_long(const float* dy, const float* x, const float* w, const float* mean,
                              const float* rstd, float* dx, float* pdw, float* pdb, int64_t r0,
                              int64_t r1, int64_t n, bool stream) {
  NormRow k[kNormBackGroup];
  constexpr int64_t kCols = kColVecs * W;
  const int64_t full = n / kCols * kCols;
  // Streaming stores need every row's column blocks aligned.
  const bool aligned = rows_aligned(dx, n);
  const int64_t group = std::clamp<int64_t>(kNormBackGroupBytes / (8 * n), 4, kNormBackGroup);
  for (int64_t g0 = r0; g0 < r1; g0 += group) {
    const int64_t g1 = std::min(r1, g0 + group);
    for (int64_t m = g0; m < g1; ++m) {
      const float* dyr = dy + m * n;
      const float* xr = x + m * n;
      const float mu = kCentred ? mean[m] : 0.0f;
      const Vec mv = Vec::set1(mu), rv = Vec::set1(rstd[m]);
      // Two accumulators each (even and odd vectors), in named registers: GCC keeps them as arrays
      // on the stack when indexed in a loop, and every vector waits on a store and a reload.
      Vec s1a = Vec::zero(), s1b = s1a, s2a = s1a, s2b = s1a;
      int64_t i = 0;
      for (; i + 2 * W <= n; i += 2 * W) {
        const Vec gwa = Vec::load_mem(dyr + i) * Vec::load(w + i);
        const Vec gwb = Vec::load_mem(dyr + i + W) * Vec::load(w + i + W);
        if constexpr (kCentred) {
          s1a = s1a + gwa;
          s1b = s1b + gwb;
        }
        s2a = fma(gwa, (Vec::load_mem(xr + i) - mv) * rv, s2a);
        s2b = fma(gwb, (Vec::load_mem(xr + i + W) - mv) * rv, s2b);
      }
      for (; i < n; i += W) {
        const int r = static_cast<int>(std::min<int64_t>(W, n - i));
        const Vec gw = load_r(dyr + i, r) * load_r(w + i, r);
        if constexpr (kCentred) s1a = s1a + gw;
        s2b = fma(gw, (load_r(xr + i, r) - mv) * rv, s2b);
      }
      k[m - g0] = {mu, rstd[m], kCentred ? hsum(s1a + s1b) / static_cast<float>(n) : 0.0f,
                   hsum(s2a + s2b) / static_cast<float>(n)};
    }
    for (int64_t j = 0; j < full; j += kCols) {
      if (stream && aligned) {
        norm_backward_cols<kCentred, true>(dy, x, w, k, dx, pdw, pdb, g0, g1, n, j);
      } else {
        norm_backward_cols<kCentred, false>(dy, x, w, k, dx, pdw, pdb, g0, g1, n, j);
      }
    }
    norm_backward_tail<kCentred>(dy, x, w, k, dx, pdw, pdb, g0, g1, n, full);
  }
  if (stream) Vec::fence();
}

template <bool kCentred>
void norm_backward(const float* dy, const float* x, const float* w, const float* mean,
                   const float* rstd, float* dx, float* dw, float* db, int64_t rows, int64_t n) {
  // Blocks of at least kRowBlock rows, and at most kMaxRowBlocks of them, so the partials (kept
  // in this thread's scratch after the call) stay small: rows * n / 32 floats uncapped, 64 MB
  // for 65536 x 8192. The blocks depend on the shape only, never on the thread count.
  const int64_t per = std::max(kRowBlock, (rows + kMaxRowBlocks - 1) / kMaxRowBlocks);
  const int64_t blocks = (rows + per - 1) / per;
  const bool stream = stream_output(rows * n * 4) && !in_place(dx, dy);
  // Each block's weight-gradient partials (dw, then db), summed in block order at the end, so the
  // result never depends on the thread count.
  const int64_t per_block = kCentred ? 2 * n : n;
  float* partial = thread_scratch<float>(ScratchSlot::kNormPartials, blocks * per_block);
  // A block accumulates in this thread's own buffer, which stays in L1 from block to block, and
  // is copied out when done: accumulating in place, each block would first meet its slice of
  // `partial` cold, which slows layer_norm backward. In the buffer db sits 2 KiB past dw modulo
  // 4 KiB: at the same page offset (n = 1024, say), every load of db[i] after the store of dw[i]
  // would meet 4 KiB aliasing (BENCHMARKS.md, "Kernel design measurements").
  const int64_t db_off = kCentred ? n + ((512 - n % 1024) % 1024 + 1024) % 1024 : 0;
  // x, dy, w and the partials: dw and db (layer_norm), dw (rms_norm).
  const bool long_rows = norm_rows_long(n, kCentred ? 5 : 4);
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    float* lw = thread_scratch<float>(ScratchSlot::kNormBlock, db_off + n);
    float* lb = kCentred ? lw + db_off : nullptr;
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t r0 = blk * per, r1 = std::min(rows, (blk + 1) * per);
      std::fill(lw, lw + n, 0.0f);
      if (kCentred) std::fill(lb, lb + n, 0.0f);
      if (long_rows) {
        norm_backward_block_long<kCentred>(dy, x, w, mean, rstd, dx, lw, lb, r0, r1, n, stream);
      } else {
        norm_backward_block<kCentred>(dy, x, w, mean, rstd, dx, lw, lb, r0, r1, n, stream);
      }
      float* out = partial + blk * per_block;
      std::memcpy(out, lw, static_cast<size_t>(n) * sizeof(float));
      if (kCentred) std::memcpy(out + n, lb, static_cast<size_t>(n) * sizeof(float));
    }
  });
  sum_blocks(partial, blocks, n, per_block, dw);
  if (kCentred) sum_blocks(partial + n, blocks, n, per_block, db);
}

void layer_norm_backward(const float* dy, const float* x, const float* w, const float* mean,
                         const float* rstd, float* dx, float* dw, float* db, int64_t rows,
                         int64_t n) {
  norm_backward<true>(dy, x, w, mean, rstd, dx, dw, db, rows, n);
}

void rms_norm(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t n,
              double eps) {
  norm_forward_rows(
      rows, n, 2, x, y,
      [&](int64_t m, bool from_memory) {
        const float* xr = x + m * n;
        const float ss = from_memory ? row_dot<true>(xr, xr, n) : row_dot<false>(xr, xr, n);
        const double ms = static_cast<double>(ss) / n;
        rstd[m] = static_cast<float>(1.0 / std::sqrt(ms + eps));
      },
      [&](int64_t m) {
        const float* xr = x + m * n;
        const Vec rv = Vec::set1(rstd[m]);
        return [=](int64_t i, int r) { return load_mem_r(xr + i, r) * rv * load_r(w + i, r); };
      });
}

void rms_norm_backward(const float* dy, const float* x, const float* w, const float* rstd,
                       float* dx, float* dw, int64_t rows, int64_t n) {
  norm_backward<false>(dy, x, w, nullptr, rstd, dx, dw, nullptr, rows, n);
}

// ---- cross-entropy ---------------------------------------------------------------------------

void check_target(int64_t t, int64_t V, int64_t row) {
  MAMMOTH_CHECK(t >= 0 && t < V) << "[cross_entropy] target " << t << " at row " << row
                                 << " is out of range for " << V << " classes";
}

// loss = (1-s) * (lse - x[t]) + s * (lse - mean(x)). One read of the row from memory, by
// blocks through OnlineExp.
void cross_entropy(const float* x, const int64_t* target, float* loss, float* lse_out, int64_t rows,
                   int64_t V, int64_t ignore_index, double smoothing) {
  for_rows(rows, V, [&](int64_t m) {
    const float* xr = x + m * V;
    OnlineExp oe(row_hint(xr, V));
    float sum_x = 0.0f;
    for (int64_t c0 = 0; c0 < V; c0 += kOnlineBlock) {
      const int64_t cn = std::min(kOnlineBlock, V - c0);
      oe.add<false>(xr + c0, nullptr, cn, c0 + cn == V);
      if (smoothing != 0.0) sum_x += row_sum(xr + c0, cn);
    }
    const double lse = static_cast<double>(oe.m) + std::log(static_cast<double>(oe.sum()));
    lse_out[m] = static_cast<float>(lse);
    const int64_t t = target[m];
    if (t == ignore_index) {
      loss[m] = 0.0f;
      return;
    }
    check_target(t, V, m);
    const double s = smoothing;
    loss[m] = static_cast<float>((1 - s) * (lse - xr[t]) + s * (lse - sum_x / V));
  });
}

// dlogits = dloss * (softmax - (1-s) * onehot - s / V); softmax by exp_near (see
// log_softmax_backward).
void cross_entropy_backward(const float* dloss, const float* x, const int64_t* target,
                            const float* lse, float* dx, int64_t rows, int64_t V,
                            int64_t ignore_index, double smoothing) {
  const bool stream = stream_output(rows * V * 4) && !in_place(dx, x);
  for_rows(
      rows, V,
      [&](int64_t m) {
        float* dr = dx + m * V;
        const int64_t t = target[m];
        if (t == ignore_index) {
          std::fill(dr, dr + V, 0.0f);
          return;
        }
        check_target(t, V, m);
        const float g = dloss[m];
        const Vec gv = Vec::set1(g), l = Vec::set1(lse[m]);
        const Vec smooth = Vec::set1(static_cast<float>(smoothing / V));
        map1(
            x + m * V, dr, V, [&](Vec v) { return gv * (exp_near(v - l) - smooth); }, stream);
        dr[t] -= g * static_cast<float>(1 - smoothing);
      },
      stream);
}

// ---- AdamW -----------------------------------------------------------------------------------

// `inline`: without it GCC calls it once per vector of AdamW (as normal_cdf in GELU).
inline Vec load_grad(const void* g, DType gdt, int64_t i, int r) {
  if (gdt == DType::kF32) {
    const float* gf = static_cast<const float*>(g) + i;
    return r == W ? Vec::load_mem(gf) : Vec::load_n(gf, r);
  }
  const uint16_t* gh = static_cast<const uint16_t*>(g) + i;
  if (r == W) return gdt == DType::kBF16 ? Vec::load_bf16(gh) : Vec::load_f16(gh);
  uint16_t tmp[W] = {};
  std::memcpy(tmp, gh, sizeof(uint16_t) * r);
  return gdt == DType::kBF16 ? Vec::load_bf16(tmp) : Vec::load_f16(tmp);
}

void store_half(void* w16, DType dt, int64_t i, Vec x, int r) {
  uint16_t* p = static_cast<uint16_t*>(w16) + i;
  if (r == W) {
    if (dt == DType::kBF16) {
      x.store_bf16(p);
    } else {
      x.store_f16(p);
    }
    return;
  }
  uint16_t tmp[W];
  if (dt == DType::kBF16) {
    x.store_bf16(tmp);
  } else {
    x.store_f16(tmp);
  }
  std::memcpy(p, tmp, sizeof(uint16_t) * r);
}

template <bool kHalfOut>
void adamw_range(float* w, const void* g, DType gdt, float* m, float* v, void* w16, DType w16dt,
                 int64_t b, int64_t e, const AdamWConsts& c) {
  const Vec b1 = Vec::set1(c.b1), b2 = Vec::set1(c.b2);
  const Vec one_b1 = Vec::set1(1.0f - c.b1), one_b2 = Vec::set1(1.0f - c.b2);
  const Vec decay = Vec::set1(c.decay), step = Vec::set1(c.step_size);
  const Vec isb = Vec::set1(c.inv_sqrt_bc2), eps = Vec::set1(c.eps), gs = Vec::set1(c.grad_scale);
  for (int64_t i = b; i < e; i += W) {
    const int r = static_cast<int>(std::min<int64_t>(W, e - i));
    const Vec gi = load_grad(g, gdt, i, r) * gs;
    Vec mi, vi, wi;
    if (r == W) {
      mi = Vec::load_mem(m + i), vi = Vec::load_mem(v + i), wi = Vec::load_mem(w + i);
    } else {
      mi = Vec::load_n(m + i, r), vi = Vec::load_n(v + i, r), wi = Vec::load_n(w + i, r);
    }
    mi = b1 * mi + one_b1 * gi;
    vi = b2 * vi + one_b2 * gi * gi;
    const Vec denom = sqrt(vi) * isb + eps;
    wi = wi * decay - step * mi / denom;
    if (r == W) {
      mi.store(m + i), vi.store(v + i), wi.store(w + i);
    } else {
      mi.store_n(m + i, r), vi.store_n(v + i, r), wi.store_n(w + i, r);
    }
    if constexpr (kHalfOut) store_half(w16, w16dt, i, wi, r);
  }
}

void adamw(float* w, const void* g, DType gdt, float* m, float* v, void* w16, DType w16dt,
           int64_t n, const AdamWConsts& c) {
  // Chunks are whole vectors so a chunk boundary never changes which lanes an element uses.
  parallel_for(0, (n + W - 1) / W, 4096, [&](int64_t b, int64_t e) {
    const int64_t i0 = b * W, i1 = std::min(n, e * W);
    if (w16 != nullptr) {
      adamw_range<true>(w, g, gdt, m, v, w16, w16dt, i0, i1, c);
    } else {
      adamw_range<false>(w, g, gdt, m, v, w16, w16dt, i0, i1, c);
    }
  });
}

// ---- GELU (tanh form) over contiguous runs; the caller threads -------------------------------

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluC = 0.044715f;

// e^d for the sigmoids below: exp_near of d held at 88 or below. These kernels are bound by
// arithmetic, not memory, on AVX2 (8 lanes; the exponent bits built with integer shifts), and
// exp_near is 14 operations against exp's 24, so the cheaper exponential speeds them up
// directly (BENCHMARKS.md, "Kernel design measurements"). Holding d at 88 changes only results
// below 1e-37 in magnitude (e^88 in a denominator); exp_near's (6 + 2|d|) 2^-24 relative error
// shrinks to nothing in 1 / (1 + e^d) wherever e^d is small, and where it is large the result is
// within a few 1e-6 relative of a value that is itself below e^-|d|. NaN stays NaN (min returns
// its second operand); x = -inf gives -inf (its exact limit is 0 * inf).
inline Vec exp_sigmoid_arg(Vec d) { return exp_near(min(Vec::set1(88.0f), d)); }

// 0.5 x (1 + tanh(u)) = x * sigmoid(2u), u = sqrt(2/pi) (x + c x^3).
void gelu_tanh(const float* x, float* y, int64_t n, bool stream) {
  const Vec k = Vec::set1(-2.0f * kSqrt2OverPi), c = Vec::set1(kGeluC), one = Vec::set1(1.0f);
  map1(
      x, y, n,
      [&](Vec v) {
        const Vec e = exp_sigmoid_arg(k * fma(c * v, v * v, v));
        return v / (one + e);
      },
      stream);
  if (stream) Vec::fence();
}

// d/dx = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 c x^2), s = sigmoid(2u) = (1 + tanh(u)) / 2.
void gelu_tanh_backward(const float* dy, const float* x, float* dx, int64_t n, bool stream) {
  const Vec k = Vec::set1(-2.0f * kSqrt2OverPi), c = Vec::set1(kGeluC), one = Vec::set1(1.0f);
  const Vec k2 = Vec::set1(2.0f * kSqrt2OverPi), c3 = Vec::set1(3.0f * kGeluC);
  map2(
      dy, x, dx, n,
      [&](Vec g, Vec v) {
        const Vec v2 = v * v;
        const Vec s = one / (one + exp_sigmoid_arg(k * fma(c * v, v2, v)));
        const Vec ds = k2 * v * s * (one - s) * fma(c3, v2, one);
        return g * (s + ds);
      },
      stream);
  if (stream) Vec::fence();
}

// ---- GELU (erf form) and SiLU over contiguous runs; the caller threads -----------------------

// Phi(x) = (1 + erf(x / sqrt 2)) / 2 from erfc(|u|) ~ poly(t) e^{-u^2}, t = 1 / (1 + p |u|)
// (Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7, which is what Phi needs). `g` is
// e^{-u^2} = e^{-x^2 / 2}, which the derivative needs too (phi(x) = g / sqrt(2 pi)); through
// exp_diff, whose error (|u^2| + 6) * 2^-24 relative is far inside the formula's. The backward's
// (the forward needs no e^{-u^2}: gelu_erf below).
struct NormalCdf {
  Vec cdf, g;
};
// `inline`: without it GCC calls it once per vector, on both ISAs.
inline NormalCdf normal_cdf(Vec x) {
  const Vec u = abs(x) * Vec::set1(0.7071067811865476f);
  const Vec t = Vec::set1(1.0f) / fma(Vec::set1(0.3275911f), u, Vec::set1(1.0f));
  // The polynomial's coefficients halved: p is half of A&S's.
  Vec p = Vec::set1(0.5307027145f);
  p = fma(p, t, Vec::set1(-0.7265760135f));
  p = fma(p, t, Vec::set1(0.7107068705f));
  p = fma(p, t, Vec::set1(-0.142248368f));
  p = fma(p, t, Vec::set1(0.127414796f));
  const Vec g = exp_diff(Vec::zero(), u * u);
  const Vec half_erfc = p * t * g;
  return {select_neg(x, half_erfc, Vec::set1(1.0f) - half_erfc), g};
}

// x Phi(x) = (x + |x| erf(|x| / sqrt 2)) / 2, with erf(a / sqrt 2) = a P(a^2) / Q(a^2): a
// rational minimax fit (tools/fit_gelu_erf.py) on a < 5.5437, beyond which erf rounds to 1.
// No exponential: half the arithmetic of the erfc form that normal_cdf keeps for the backward,
// whose e^{-x^2/2} the derivative needs anyway. Evaluated in f32 with fused multiply-adds, erf is
// within 3.2e-7 and GELU within 9.2e-7 (2.8 ulp above 1 in magnitude; the erfc form: 4.2e-7,
// 2.1 ulp); 1.2e-6 with the portable kernels' separate multiply and add.
inline Vec gelu_erf(Vec x) {
  const Vec a = abs(x), w = a * a;
  Vec p = Vec::set1(2.201042403893183e-10f);
  p = fma(p, w, Vec::set1(-4.4068325877333336e-08f));
  p = fma(p, w, Vec::set1(6.5843250922625884e-06f));
  p = fma(p, w, Vec::set1(0.0003511540708132088f));
  p = fma(p, w, Vec::set1(0.009085815399885178f));
  p = fma(p, w, Vec::set1(0.07287204265594482f));
  p = fma(p, w, Vec::set1(0.7978842854499817f));
  Vec q = Vec::set1(6.400727579602972e-05f);
  q = fma(q, w, Vec::set1(0.0018611414125189185f));
  q = fma(q, w, Vec::set1(0.029391035437583923f));
  q = fma(q, w, Vec::set1(0.25799596309661865f));
  q = fma(q, w, Vec::set1(1.0f));
  const Vec e = select_neg(a - Vec::set1(5.5437f), a * p / q, Vec::set1(1.0f));
  const Vec h = Vec::set1(0.5f);
  return fma(h * a, e, h * x);
}

void gelu(const float* x, float* y, int64_t n, bool stream) {
  map1(
      x, y, n, [&](Vec v) { return gelu_erf(v); }, stream);
  if (stream) Vec::fence();
}

// d/dx x Phi(x) = Phi(x) + x phi(x)
void gelu_backward(const float* dy, const float* x, float* dx, int64_t n, bool stream) {
  const Vec inv_sqrt_2pi = Vec::set1(0.3989422804014327f);
  map2(
      dy, x, dx, n,
      [&](Vec g, Vec v) {
        const NormalCdf nc = normal_cdf(v);
        return g * fma(v * inv_sqrt_2pi, nc.g, nc.cdf);
      },
      stream);
  if (stream) Vec::fence();
}

void silu(const float* x, float* y, int64_t n, bool stream) {
  const Vec one = Vec::set1(1.0f);
  map1(
      x, y, n, [&](Vec v) { return v / (one + exp_sigmoid_arg(Vec::zero() - v)); }, stream);
  if (stream) Vec::fence();
}

// d/dx x s(x) = s (1 + x (1 - s))
void silu_backward(const float* dy, const float* x, float* dx, int64_t n, bool stream) {
  const Vec one = Vec::set1(1.0f);
  map2(
      dy, x, dx, n,
      [&](Vec g, Vec v) {
        const Vec s = one / (one + exp_sigmoid_arg(Vec::zero() - v));
        return g * s * fma(v, one - s, one);
      },
      stream);
  if (stream) Vec::fence();
}

void exp_run(const float* x, float* y, int64_t n, bool nonpos) {
  if (nonpos) {
    map1(x, y, n, [](Vec v) { return exp_nonpos(v); });
  } else {
    map1(x, y, n, [](Vec v) { return exp(v); });
  }
}

// ---- attention -------------------------------------------------------------------------------

constexpr int64_t kBq = 128;  // query rows per block
constexpr int64_t kBk = 128;  // keys per block

// Sets S[r][c] = -inf where query i0 + r may not see key j0 + c.
void mask_block(const AttnArgs& a, int64_t b, int64_t i0, int64_t rows, int64_t j0, int64_t cols,
                float* S) {
  if (a.key_mask != nullptr) {
    const bool* km = a.key_mask + b * a.Tk + j0;
    for (int64_t c = 0; c < cols; ++c) {
      if (km[c]) continue;
      for (int64_t r = 0; r < rows; ++r) S[r * kBk + c] = -kInf;
    }
  }
  if (a.causal) {
    for (int64_t r = 0; r < rows; ++r) {
      const KeyRange keys = visible_keys(true, a.window, i0 + r, a.Tq, a.Tk);
      for (int64_t c = 0; c < std::min(cols, keys.begin - j0); ++c) S[r * kBk + c] = -kInf;
      for (int64_t c = std::max<int64_t>(0, keys.end - j0); c < cols; ++c) S[r * kBk + c] = -kInf;
    }
  }
}

// Keys before key_begin are outside the sliding window of every query row [i0, i0 + rows).
int64_t key_begin(const AttnArgs& a, int64_t i0) {
  return visible_keys(a.causal, a.window, i0, a.Tq, a.Tk).begin;
}

// Keys [0, kend) can be visible to query rows [i0, i0 + rows).
int64_t key_end(const AttnArgs& a, int64_t i0, int64_t rows) {
  return visible_keys(a.causal, a.window, i0 + rows - 1, a.Tq, a.Tk).end;
}

// ---- products inside an attention block -------------------------------------------------------
// Every product inside a block is at most kBq x kBk x D with its operands in cache. sgemm packs
// both operands first, which costs as much as the product at a 64-token head, and computes whole
// rectangles where the causal mask leaves a triangle. These tiles read op(A) one broadcast
// element at a time (any strides, so a transposed A costs nothing) and B as whole vectors of a
// row-major matrix, and each row tile takes only the keys (or queries) it can see.

// Accumulators: 4 x 4 of 32 zmm registers, 6 x 2 of 16 ymm (with the B row and a broadcast).
constexpr int kTileRows = Vec::kWidth >= 16 ? 4 : 6;
constexpr int kTileVecs = Vec::kWidth >= 16 ? 4 : 2;

// C[MR][NV vectors] = alpha * sum over k in [k0, k1) of A[m * a_rs + k * a_cs] * B[k * ldb + n],
// added to C when accumulate.
template <int MR, int NV>
void block_tile(const float* A, int64_t a_rs, int64_t a_cs, int64_t k0, int64_t k1, const float* B,
                int64_t ldb, float alpha, bool accumulate, float* C, int64_t ldc) {
  Vec acc[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[m][v] = Vec::zero();
  for (int64_t k = k0; k < k1; ++k) {
    Vec b[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) b[v] = Vec::load(B + k * ldb + v * Vec::kWidth);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const Vec x = Vec::set1(A[m * a_rs + k * a_cs]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[m][v] = fma(x, b[v], acc[m][v]);
    }
  }
  const Vec al = Vec::set1(alpha);
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      float* c = C + m * ldc + v * Vec::kWidth;
      const Vec r = acc[m][v] * al;
      (accumulate ? r + Vec::load(c) : r).store(c);
    }
}

using BlockTileFn = void (*)(const float*, int64_t, int64_t, int64_t, int64_t, const float*,
                             int64_t, float, bool, float*, int64_t);

template <int MR>
constexpr std::array<BlockTileFn, kTileVecs> block_tile_row() {
  return []<size_t... V>(std::index_sequence<V...>) {
    return std::array<BlockTileFn, kTileVecs>{&block_tile<MR, static_cast<int>(V) + 1>...};
  }
  (std::make_index_sequence<kTileVecs>{});
}

// Which part of a row tile's product to compute: k in [k0, k1), columns [n0, n1) (rounded out
// to whole vectors; B and C must hold those columns).
struct TileRange {
  int64_t k0, k1, n0, n1;
};

// C (+)= alpha * op(A) B for rows [0, M), in tiles of kTileRows rows; range(m0, rows) says what
// each tile computes.
template <typename RangeFn>
void block_gemm(int64_t M, const float* A, int64_t a_rs, int64_t a_cs, const float* B, int64_t ldb,
                float alpha, bool accumulate, float* C, int64_t ldc, RangeFn range) {
  static constexpr auto kTiles = []<size_t... R>(std::index_sequence<R...>) {
    return std::array<std::array<BlockTileFn, kTileVecs>, kTileRows>{
        block_tile_row<static_cast<int>(R) + 1>()...};
  }
  (std::make_index_sequence<kTileRows>{});
  constexpr int64_t W = Vec::kWidth;
  for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
    const int64_t rows = std::min<int64_t>(kTileRows, M - m0);
    const TileRange t = range(m0, rows);
    const int64_t n1 = (t.n1 + W - 1) / W * W;
    for (int64_t n = t.n0 / W * W; n < n1; n += kTileVecs * W) {
      const int64_t vecs = std::min<int64_t>(kTileVecs, (n1 - n) / W);
      kTiles[rows - 1][vecs - 1](A + m0 * a_rs, a_rs, a_cs, t.k0, t.k1, B + n, ldb, alpha,
                                 accumulate, C + m0 * ldc + n, ldc);
    }
  }
}

// X^T of rows [0, cols) of X [*, D] into XT [D, kBk], zero in the columns up to the next
// whole vector.
void transpose_block(const float* X, int64_t cols, int64_t D, float* XT) {
  const int64_t padded =
      std::min<int64_t>(kBk, (cols + Vec::kWidth - 1) / Vec::kWidth * Vec::kWidth);
  for (int64_t d = 0; d < D; ++d) {
    float* row = XT + d * kBk;
    for (int64_t c = 0; c < cols; ++c) row[c] = X[c * D + d];
    std::fill(row + cols, row + padded, 0.0f);
  }
}

// What each tile of a product inside query block [i0, i0 + rows) x key block [j0, j0 + cols)
// computes; positions relative to the block.
struct BlockRanges {
  const AttnArgs& a;
  int64_t i0, rows, j0, cols;

  // Keys that query rows [m0, m0 + n) can see.
  std::pair<int64_t, int64_t> keys(int64_t m0, int64_t n) const {
    return {std::clamp<int64_t>(key_begin(a, i0 + m0) - j0, 0, cols),
            std::clamp<int64_t>(key_end(a, i0 + m0, n) - j0, 0, cols)};
  }
  // Query rows that can see some key of [c0, c0 + n). Both ends of a row's key range never
  // decrease down the rows.
  std::pair<int64_t, int64_t> queries(int64_t c0, int64_t n) const {
    if (!a.causal) return {0, rows};
    int64_t lo = 0, hi = rows;
    while (lo < rows && key_end(a, i0 + lo, 1) <= j0 + c0) ++lo;
    while (hi > lo && key_begin(a, i0 + hi - 1) >= j0 + c0 + n) --hi;
    return {lo, hi};
  }
  // Score tiles (S, P, dP): query rows by the keys they see, a D-long dot each.
  TileRange score(int64_t m0, int64_t n) const {
    const auto [c0, c1] = keys(m0, n);
    return {0, a.D, c0, c1};
  }
  // Query rows times the key block (P V, dS K): summed over the keys they see.
  TileRange query(int64_t m0, int64_t n) const {
    const auto [c0, c1] = keys(m0, n);
    return {c0, c1, 0, a.D};
  }
  // Key rows times the query block (P^T dO, dS^T Q): summed over the queries that see them.
  TileRange key(int64_t c0, int64_t n) const {
    const auto [r0, r1] = queries(c0, n);
    return {r0, r1, 0, a.D};
  }
};

void attention(const AttnArgs& a) {
  const int64_t D = a.D, group = a.Hq / a.Hk;
  const int64_t nqb = (a.Tq + kBq - 1) / kBq;
  const bool tiles = D % Vec::kWidth == 0;  // block_tile reads whole vectors of K, V rows
  parallel_for(0, a.B * a.Hq * nqb, 1, [&](int64_t t0, int64_t t1) {
    float* S = thread_scratch<float>(ScratchSlot::kAttentionA, kBq * kBk);
    float* O = thread_scratch<float>(ScratchSlot::kAttentionB, kBq * D);
    float* KT = tiles ? thread_scratch<float>(ScratchSlot::kAttentionT, D * kBk) : nullptr;
    std::vector<float> mrow(kBq), lrow(kBq);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t qb = t % nqb, bh = t / nqb, b = bh / a.Hq, h = bh % a.Hq;
      const int64_t i0 = qb * kBq, rows = std::min(kBq, a.Tq - i0);
      const int64_t qoff = ((b * a.Hq + h) * a.Tq + i0) * D;
      const float* Q = a.q + qoff;
      const float* K = a.k + (b * a.Hk + h / group) * a.Tk * D;
      const float* V = a.v + (b * a.Hk + h / group) * a.Tk * D;
      std::fill(O, O + kBq * D, 0.0f);
      std::fill(mrow.begin(), mrow.end(), -kInf);
      std::fill(lrow.begin(), lrow.end(), 0.0f);
      const int64_t kend = key_end(a, i0, rows);
      for (int64_t j0 = key_begin(a, i0) / kBk * kBk; j0 < kend; j0 += kBk) {
        const int64_t cols = std::min(kBk, kend - j0);
        const BlockRanges blk{a, i0, rows, j0, cols};
        if (tiles) {
          transpose_block(K + j0 * D, cols, D, KT);
          block_gemm(rows, Q, D, 1, KT, kBk, a.scale, false, S, kBk,
                     [&](int64_t m0, int64_t n) { return blk.score(m0, n); });
        } else {
          sgemm(false, true, rows, cols, D, a.scale, Q, D, K + j0 * D, D, 0.0f, S, kBk);
        }
        mask_block(a, b, i0, rows, j0, cols, S);
        for (int64_t r = 0; r < rows; ++r) {
          float* sr = S + r * kBk;
          const float mnew = std::max(mrow[r], row_max(sr, cols));
          if (mnew == -kInf) {  // nothing visible yet: this block adds nothing to the row
            std::fill(sr, sr + cols, 0.0f);
            continue;
          }
          const float corr = std::exp(mrow[r] - mnew);
          lrow[r] = lrow[r] * corr + exp_store_sum(sr, sr, cols, mnew);
          mrow[r] = mnew;
          if (corr != 1.0f) {
            const Vec cv = Vec::set1(corr);
            map1(O + r * D, O + r * D, D, [&](Vec o) { return o * cv; });
          }
        }
        if (tiles) {
          block_gemm(rows, S, kBk, 1, V + j0 * D, D, 1.0f, true, O, D,
                     [&](int64_t m0, int64_t n) { return blk.query(m0, n); });
        } else {
          sgemm(false, false, rows, D, cols, 1.0f, S, kBk, V + j0 * D, D, 1.0f, O, D);
        }
      }
      float* out = a.out + qoff;
      float* lse = a.lse + (b * a.Hq + h) * a.Tq + i0;
      for (int64_t r = 0; r < rows; ++r) {
        if (lrow[r] == 0.0f) {  // every key masked: output zeros, lse -inf
          std::fill(out + r * D, out + (r + 1) * D, 0.0f);
          lse[r] = -kInf;
          continue;
        }
        const Vec inv = Vec::set1(1.0f / lrow[r]);
        map1(O + r * D, out + r * D, D, [&](Vec o) { return o * inv; });
        lse[r] = mrow[r] + std::log(lrow[r]);
      }
    }
  });
}

// FlashAttention-2-style backward. One task per (batch, kv head) owns dk, dv of that head and
// dq of its query heads, so every sum runs on one thread in a fixed order (deterministic at any
// thread count). Per key block, for each query block: recompute P from the saved lse, then
// dV += P^T dO, dP = dO V^T, dS = P (dP - delta) scale, dK += dS^T Q, dQ += dS K.
void attention_backward(const AttnArgs& a) {
  const int64_t D = a.D, group = a.Hq / a.Hk;
  const int64_t nrows = a.B * a.Hq * a.Tq;
  std::vector<float> delta(static_cast<size_t>(nrows));
  parallel_for(0, nrows, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) delta[r] = row_dot(a.dout + r * D, a.out + r * D, D);
  });
  const Vec scale = Vec::set1(a.scale);
  const bool tiles = D % Vec::kWidth == 0;  // block_tile reads whole vectors of the D-long rows
  parallel_for(0, a.B * a.Hk, 1, [&](int64_t t0, int64_t t1) {
    float* P = thread_scratch<float>(ScratchSlot::kAttentionA, kBq * kBk);
    float* dP = thread_scratch<float>(ScratchSlot::kAttentionB, kBq * kBk);
    float* KT = tiles ? thread_scratch<float>(ScratchSlot::kAttentionT, 2 * D * kBk) : nullptr;
    float* VT = tiles ? KT + D * kBk : nullptr;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / a.Hk, hk = t % a.Hk;
      const float* K = a.k + t * a.Tk * D;
      const float* V = a.v + t * a.Tk * D;
      float* dK = a.dk + t * a.Tk * D;
      float* dV = a.dv + t * a.Tk * D;
      std::fill(dK, dK + a.Tk * D, 0.0f);
      std::fill(dV, dV + a.Tk * D, 0.0f);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        float* dq = a.dq + (b * a.Hq + h) * a.Tq * D;
        std::fill(dq, dq + a.Tq * D, 0.0f);
      }
      for (int64_t j0 = 0; j0 < a.Tk; j0 += kBk) {
        const int64_t cols = std::min(kBk, a.Tk - j0);
        if (tiles) {
          transpose_block(K + j0 * D, cols, D, KT);
          transpose_block(V + j0 * D, cols, D, VT);
        }
        for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
          const int64_t head_row = (b * a.Hq + h) * a.Tq;
          for (int64_t i0 = 0; i0 < a.Tq; i0 += kBq) {
            const int64_t rows = std::min(kBq, a.Tq - i0);
            if (key_end(a, i0, rows) <= j0) continue;     // causal: no key of this block visible
            if (j0 + cols <= key_begin(a, i0)) continue;  // all slid out of the window
            const float* Q = a.q + (head_row + i0) * D;
            const float* dO = a.dout + (head_row + i0) * D;
            const float* lse = a.lse + head_row + i0;
            const float* dl = delta.data() + head_row + i0;
            float* dQ = a.dq + (head_row + i0) * D;
            const BlockRanges blk{a, i0, rows, j0, cols};
            const auto score_tile = [&](int64_t m0, int64_t n) { return blk.score(m0, n); };
            const auto key_tile = [&](int64_t c0, int64_t n) { return blk.key(c0, n); };
            const auto query_tile = [&](int64_t m0, int64_t n) { return blk.query(m0, n); };
            if (tiles) {
              block_gemm(rows, Q, D, 1, KT, kBk, a.scale, false, P, kBk, score_tile);
            } else {
              sgemm(false, true, rows, cols, D, a.scale, Q, D, K + j0 * D, D, 0.0f, P, kBk);
            }
            mask_block(a, b, i0, rows, j0, cols, P);
            for (int64_t r = 0; r < rows; ++r) {
              float* pr = P + r * kBk;
              if (std::isinf(lse[r])) {  // fully masked row: no gradient flows
                std::fill(pr, pr + cols, 0.0f);
                continue;
              }
              const Vec l = Vec::set1(lse[r]);
              map1(pr, pr, cols, [&](Vec s) { return exp_nonpos(s - l); });  // s <= lse
            }
            if (tiles) {
              block_gemm(cols, P, 1, kBk, dO, D, 1.0f, true, dV + j0 * D, D, key_tile);
              block_gemm(rows, dO, D, 1, VT, kBk, 1.0f, false, dP, kBk, score_tile);
            } else {
              sgemm(true, false, cols, D, rows, 1.0f, P, kBk, dO, D, 1.0f, dV + j0 * D, D);
              sgemm(false, true, rows, cols, D, 1.0f, dO, D, V + j0 * D, D, 0.0f, dP, kBk);
            }
            // dS = P (dP - delta) scale over the keys each row sees; zero elsewhere (a tile
            // left dP unwritten there, and P is zero).
            for (int64_t r = 0; r < rows; ++r) {
              const auto [c0, c1] = blk.keys(r, 1);
              float* ds = dP + r * kBk;
              const Vec dr = Vec::set1(dl[r]);
              std::fill(ds, ds + c0, 0.0f);
              map2(P + r * kBk + c0, ds + c0, ds + c0, std::max<int64_t>(0, c1 - c0),
                   [&](Vec p, Vec dp) { return p * (dp - dr) * scale; });
              std::fill(ds + std::max(c0, c1), ds + cols, 0.0f);
            }
            if (tiles) {
              block_gemm(cols, dP, 1, kBk, Q, D, 1.0f, true, dK + j0 * D, D, key_tile);
              block_gemm(rows, dP, kBk, 1, K + j0 * D, D, 1.0f, true, dQ, D, query_tile);
            } else {
              sgemm(true, false, cols, D, rows, 1.0f, dP, kBk, Q, D, 1.0f, dK + j0 * D, D);
              sgemm(false, false, rows, D, cols, 1.0f, dP, kBk, K + j0 * D, D, 1.0f, dQ, D);
            }
          }
        }
      }
    }
  });
}

}  // namespace

const FastKernels& fast_kernels() {
  static const FastKernels k{
      &softmax,
      &log_softmax,
      &softmax_backward,
      &log_softmax_backward,
      &layer_norm,
      &layer_norm_backward,
      &rms_norm,
      &rms_norm_backward,
      &sum_sq,
      &sum_rows,
      &cross_entropy,
      &cross_entropy_backward,
      &adamw,
      &attention,
      &attention_backward,
      &gelu_tanh,
      &gelu_tanh_backward,
      &gelu,
      &gelu_backward,
      &silu,
      &silu_backward,
      &exp_run,
  };
  return k;
}

}  // namespace mammoth::kernels::cpu::MAMMOTH_FAST_NS
