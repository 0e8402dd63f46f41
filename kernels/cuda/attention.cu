// CUDA scaled dot-product attention, forward and backward, with causal and key-padding masks and
// grouped-query attention (query head h reads kv head h / (Hq / Hk)). Same semantics as
// kernels/cpu/attention.cc: no T x T matrix is stored; the forward saves lse (f32 [B, Hq, Tq]);
// a row whose keys are all masked outputs zeros with lse = -inf.
//
// - bf16/f16 with head dim 32/64/96/128: a flash-style forward on tensor cores (WMMA
//   m16n16k16, fp32 accumulation). A block owns 64 query rows (4 warps x 16), streams 64-key tiles
//   of K and V through shared memory, and keeps an online softmax per row.
// - everything else (f32, other head dims) and the backward: one warp per row, streaming keys
//   with warp-wide dot products. The backward runs two passes like the CPU kernel (dq per query
//   row; dk, dv per key row over its query-head group), so every output is written by one warp:
//   deterministic, no atomics.
#include <mma.h>

#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/params.h"

namespace mammoth::kernels::cuda {
namespace {

struct Geometry {
  int64_t B, Hq, Hk, Tq, Tk, D, group;
  float scale;
  bool causal;
  const bool* key_mask;

  Geometry(std::span<const TensorArg> qkv, const AttentionParams& p, int mask_input) {
    B = qkv[0].shape[0];
    Hq = qkv[0].shape[1];
    Tq = qkv[0].shape[2];
    D = qkv[0].shape[3];
    Hk = qkv[1].shape[1];
    Tk = qkv[1].shape[2];
    MAMMOTH_CHECK(Hk > 0 && Hq % Hk == 0)
        << "[attention] query heads " << Hq << " must be a multiple of kv heads " << Hk;
    group = Hq / Hk;
    scale = static_cast<float>(p.scale != 0.0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(D)));
    causal = p.causal;
    MAMMOTH_CHECK(p.window == 0)
        << "[attention] a sliding window (" << p.window
        << ") is not implemented by the CUDA kernel; the CPU kernel has it";
    key_mask = p.has_key_mask ? qkv[mask_input].ptr<const bool>() : nullptr;
  }
};

struct DevGeom {
  int64_t B, Hq, Hk, Tq, Tk, D, group;
  float scale;
  bool causal;
  const bool* key_mask;
  __device__ __forceinline__ bool visible(int64_t b, int64_t i, int64_t j) const {
    if (causal && j > i + (Tk - Tq)) return false;
    return key_mask == nullptr || key_mask[b * Tk + j];
  }
};

DevGeom dev(const Geometry& g) {
  return {g.B, g.Hq, g.Hk, g.Tq, g.Tk, g.D, g.group, g.scale, g.causal, g.key_mask};
}

// ---- row-wise kernels (any dtype, D <= 32 * kPerLane) -------------------------------------
template <typename T, int kPerLane>
__global__ void attn_fwd_rows(const T* __restrict__ q, const T* __restrict__ k,
                              const T* __restrict__ v, T* __restrict__ o, float* __restrict__ lse,
                              DevGeom g) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= g.B * g.Hq * g.Tq) return;
  const int64_t i = row % g.Tq, bh = row / g.Tq, b = bh / g.Hq, h = bh % g.Hq;
  const int64_t kvoff = (b * g.Hk + h / g.group) * g.Tk * g.D;
  float qv[kPerLane], acc[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    qv[e] = d < g.D ? to_float(q[row * g.D + d]) : 0.0f;
    acc[e] = 0.0f;
  }
  float mx = -INFINITY, denom = 0.0f;
  const int64_t jend = g.causal ? min(g.Tk, i + (g.Tk - g.Tq) + 1) : g.Tk;
  for (int64_t j = 0; j < jend; ++j) {
    if (g.key_mask != nullptr && !g.key_mask[b * g.Tk + j]) continue;
    const T* kj = k + kvoff + j * g.D;
    float s = 0.0f;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t d = lane + 32 * e;
      if (d < g.D) s += qv[e] * to_float(kj[d]);
    }
    s = warp_sum(s) * g.scale;
    if (s > mx) {
      const float c = mx == -INFINITY ? 0.0f : expf(mx - s);
      denom *= c;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) acc[e] *= c;
      mx = s;
    }
    const float p = expf(s - mx);
    denom += p;
    const T* vj = v + kvoff + j * g.D;
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int64_t d = lane + 32 * e;
      if (d < g.D) acc[e] += p * to_float(vj[d]);
    }
  }
  const float inv = denom > 0.0f ? 1.0f / denom : 0.0f;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < g.D) o[row * g.D + d] = from_float<T>(acc[e] * inv);
  }
  if (lane == 0) lse[row] = denom > 0.0f ? mx + logf(denom) : -INFINITY;
}

template <typename T>
__global__ void attn_delta(const T* __restrict__ dout, const T* __restrict__ out,
                           float* __restrict__ delta, int64_t rows, int64_t D) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float s = 0.0f;
  for (int64_t d = lane; d < D; d += 32)
    s += to_float(dout[row * D + d]) * to_float(out[row * D + d]);
  s = warp_sum(s);
  if (lane == 0) delta[row] = s;
}

// dq_i = scale * sum_j p_ij (dout_i . v_j - delta_i) k_j
template <typename T, int kPerLane>
__global__ void attn_bwd_dq_rows(const T* __restrict__ dout, const T* __restrict__ q,
                                 const T* __restrict__ k, const T* __restrict__ v,
                                 const float* __restrict__ lse, const float* __restrict__ delta,
                                 T* __restrict__ dq, DevGeom g) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= g.B * g.Hq * g.Tq) return;
  const int64_t i = row % g.Tq, bh = row / g.Tq, b = bh / g.Hq, h = bh % g.Hq;
  const int64_t kvoff = (b * g.Hk + h / g.group) * g.Tk * g.D;
  float qv[kPerLane], dov[kPerLane], acc[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    qv[e] = d < g.D ? to_float(q[row * g.D + d]) : 0.0f;
    dov[e] = d < g.D ? to_float(dout[row * g.D + d]) : 0.0f;
    acc[e] = 0.0f;
  }
  const float l = lse[row], dl = delta[row];
  if (l != -INFINITY) {
    const int64_t jend = g.causal ? min(g.Tk, i + (g.Tk - g.Tq) + 1) : g.Tk;
    for (int64_t j = 0; j < jend; ++j) {
      if (g.key_mask != nullptr && !g.key_mask[b * g.Tk + j]) continue;
      const T* kj = k + kvoff + j * g.D;
      const T* vj = v + kvoff + j * g.D;
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int64_t d = lane + 32 * e;
        if (d < g.D) {
          s += qv[e] * to_float(kj[d]);
          dp += dov[e] * to_float(vj[d]);
        }
      }
      s = warp_sum(s) * g.scale;
      dp = warp_sum(dp);
      const float ds = expf(s - l) * (dp - dl) * g.scale;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int64_t d = lane + 32 * e;
        if (d < g.D) acc[e] += ds * to_float(kj[d]);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < g.D) dq[row * g.D + d] = from_float<T>(acc[e]);
  }
}

// For kv head (b, hk) and key j: dv_j = sum p_ij dout_i, dk_j = sum ds_ij q_i over the group's
// query heads and all visible i.
template <typename T, int kPerLane>
__global__ void attn_bwd_dkdv_rows(const T* __restrict__ dout, const T* __restrict__ q,
                                   const T* __restrict__ k, const T* __restrict__ v,
                                   const float* __restrict__ lse, const float* __restrict__ delta,
                                   T* __restrict__ dk, T* __restrict__ dv, DevGeom g) {
  const int64_t row = blockIdx.x * int64_t{blockDim.x / 32} + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= g.B * g.Hk * g.Tk) return;
  const int64_t j = row % g.Tk, bh = row / g.Tk, b = bh / g.Hk, hk = bh % g.Hk;
  float kv[kPerLane], vv[kPerLane], adk[kPerLane], adv[kPerLane];
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    kv[e] = d < g.D ? to_float(k[row * g.D + d]) : 0.0f;
    vv[e] = d < g.D ? to_float(v[row * g.D + d]) : 0.0f;
    adk[e] = 0.0f;
    adv[e] = 0.0f;
  }
  const bool key_on = g.key_mask == nullptr || g.key_mask[b * g.Tk + j];
  // Causal: query i sees key j when j <= i + (Tk - Tq), i.e. i >= j - (Tk - Tq).
  const int64_t ibegin = g.causal ? max(int64_t{0}, j - (g.Tk - g.Tq)) : 0;
  for (int64_t h = hk * g.group; key_on && h < (hk + 1) * g.group; ++h) {
    for (int64_t i = ibegin; i < g.Tq; ++i) {
      const int64_t qr = (b * g.Hq + h) * g.Tq + i;
      const float l = lse[qr];
      if (l == -INFINITY) continue;
      const T* qi = q + qr * g.D;
      const T* doi = dout + qr * g.D;
      float s = 0.0f, dp = 0.0f;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int64_t d = lane + 32 * e;
        if (d < g.D) {
          s += to_float(qi[d]) * kv[e];
          dp += to_float(doi[d]) * vv[e];
        }
      }
      s = warp_sum(s) * g.scale;
      dp = warp_sum(dp);
      const float p = expf(s - l);
      const float ds = p * (dp - delta[qr]) * g.scale;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int64_t d = lane + 32 * e;
        if (d < g.D) {
          adv[e] += p * to_float(doi[d]);
          adk[e] += ds * to_float(qi[d]);
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int64_t d = lane + 32 * e;
    if (d < g.D) {
      dk[row * g.D + d] = from_float<T>(adk[e]);
      dv[row * g.D + d] = from_float<T>(adv[e]);
    }
  }
}

// ---- flash forward on tensor cores (bf16 / f16) --------------------------------------------
constexpr int kBr = 64, kBc = 64, kWarps = 4;
constexpr int kSLd = kBc + 4;  // float scores, ldm multiple of 4
constexpr int kPLd = kBc + 8;  // half probabilities, ldm multiple of 8

template <int D>
constexpr int kHLd = D + 8;  // half Q/K/V rows
template <int D>
constexpr int kOLd = D + 4;  // float O rows

template <int D>
constexpr size_t flash_smem_bytes() {
  return sizeof(uint16_t) * 3 * kBr * kHLd<D> + sizeof(float) * kWarps * 16 * kSLd +
         sizeof(uint16_t) * kWarps * 16 * kPLd + sizeof(float) * kWarps * 16 * kOLd<D>;
}

// Copies `rows` rows of D halves (row stride D in global) into shared memory with 16-byte
// vectors; rows beyond `valid` are zero.
template <typename T, int D>
__device__ __forceinline__ void load_tile(T* dst, const T* src, int64_t valid) {
  constexpr int kVec = 8;  // halves per 16 bytes
  constexpr int kPerRow = D / kVec;
  for (int e = threadIdx.x; e < kBr * kPerRow; e += blockDim.x) {
    const int r = e / kPerRow, c = (e % kPerRow) * kVec;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (r < valid) val = *reinterpret_cast<const uint4*>(src + int64_t{r} * D + c);
    *reinterpret_cast<uint4*>(dst + r * kHLd<D> + c) = val;
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kWarps * 32)
    attn_fwd_flash(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   T* __restrict__ o, float* __restrict__ lse, DevGeom g) {
  namespace wmma = nvcuda::wmma;
  extern __shared__ __align__(128) unsigned char smem[];  // WMMA pointers need 32 B
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kBr * kHLd<D>;
  T* sV = sK + kBc * kHLd<D>;
  float* sS = reinterpret_cast<float*>(sV + kBc * kHLd<D>);
  T* sP = reinterpret_cast<T*>(sS + kWarps * 16 * kSLd);
  float* sO = reinterpret_cast<float*>(sP + kWarps * 16 * kPLd);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t bh = blockIdx.y, b = bh / g.Hq, h = bh % g.Hq;
  const int64_t i0 = int64_t{blockIdx.x} * kBr;
  const int64_t qoff = bh * g.Tq * D;
  const int64_t kvoff = (b * g.Hk + h / g.group) * g.Tk * D;

  float* wS = sS + warp * 16 * kSLd;
  T* wP = sP + warp * 16 * kPLd;
  float* wO = sO + warp * 16 * kOLd<D>;

  load_tile<T, D>(sQ, q + qoff + i0 * D, g.Tq - i0);
  for (int e = lane; e < 16 * kOLd<D>; e += 32) wO[e] = 0.0f;

  // Lane pair (2r, 2r+1) owns row r of the warp's 16: score columns [32*(lane&1), +32) and
  // output columns [D/2*(lane&1), +D/2).
  const int r = lane >> 1, half = lane & 1;
  const int64_t i = i0 + warp * 16 + r;
  float m_row = -INFINITY, l_row = 0.0f;

  const int64_t i_last = min(g.Tq - 1, i0 + kBr - 1);
  const int64_t j_end = g.causal ? max(int64_t{0}, min(g.Tk, i_last + (g.Tk - g.Tq) + 1)) : g.Tk;

  for (int64_t j0 = 0; j0 < j_end; j0 += kBc) {
    __syncthreads();  // previous tile fully consumed
    load_tile<T, D>(sK, k + kvoff + j0 * D, g.Tk - j0);
    load_tile<T, D>(sV, v + kvoff + j0 * D, g.Tk - j0);
    __syncthreads();

    // S = Q_w K^T  (16 x 64)
#pragma unroll
    for (int nt = 0; nt < kBc / 16; ++nt) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, sQ + warp * 16 * kHLd<D> + kk * 16, kHLd<D>);
        wmma::load_matrix_sync(fb, sK + nt * 16 * kHLd<D> + kk * 16, kHLd<D>);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(wS + nt * 16, acc, kSLd, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax on this lane's 32 scores of row r.
    float s[32];
    float tile_max = -INFINITY;
#pragma unroll
    for (int c = 0; c < 32; ++c) {
      const int col = half * 32 + c;
      const int64_t j = j0 + col;
      const bool vis = i < g.Tq && j < g.Tk && g.visible(b, i, j);
      s[c] = vis ? wS[r * kSLd + col] * g.scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[c]);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m_row, tile_max);
    float alpha = 1.0f, psum = 0.0f;
    if (m_new != -INFINITY) {
      alpha = m_row == -INFINITY ? 0.0f : expf(m_row - m_new);
#pragma unroll
      for (int c = 0; c < 32; ++c) {
        const float p = s[c] == -INFINITY ? 0.0f : expf(s[c] - m_new);
        psum += p;
        wP[r * kPLd + half * 32 + c] = from_float<T>(p);
      }
    } else {
#pragma unroll
      for (int c = 0; c < 32; ++c) wP[r * kPLd + half * 32 + c] = from_float<T>(0.0f);
    }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    l_row = l_row * alpha + psum;
    m_row = m_new;
    for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d) wO[r * kOLd<D> + d] *= alpha;
    __syncwarp();

    // O_w += P_w V  (16 x D)
#pragma unroll
    for (int dt = 0; dt < D / 16; ++dt) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, wO + dt * 16, kOLd<D>, wmma::mem_row_major);
#pragma unroll
      for (int ks = 0; ks < kBc / 16; ++ks) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, wP + ks * 16, kPLd);
        wmma::load_matrix_sync(fb, sV + ks * 16 * kHLd<D> + dt * 16, kHLd<D>);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(wO + dt * 16, acc, kOLd<D>, wmma::mem_row_major);
    }
    __syncwarp();
  }

  if (i < g.Tq) {
    const float inv = l_row > 0.0f ? 1.0f / l_row : 0.0f;
    T* orow = o + qoff + i * D;
    for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d) {
      orow[d] = from_float<T>(wO[r * kOLd<D> + d] * inv);
    }
    if (half == 0) lse[bh * g.Tq + i] = l_row > 0.0f ? m_row + logf(l_row) : -INFINITY;
  }
}

template <typename T, int D>
void launch_flash(const T* q, const T* k, const T* v, T* o, float* lse, const Geometry& g) {
  constexpr size_t smem = flash_smem_bytes<D>();
  static bool configured = false;  // per instantiation; the attribute is per-device-function
  if (!configured) {
    CUDA_CHECK(cudaFuncSetAttribute(
        attn_fwd_flash<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    configured = true;
  }
  MAMMOTH_CHECK(g.B * g.Hq <= 65535) << "[attention] batch*heads " << g.B * g.Hq << " > 65535";
  const dim3 grid(static_cast<unsigned>(ceil_div(g.Tq, kBr)), static_cast<unsigned>(g.B * g.Hq));
  attn_fwd_flash<T, D><<<grid, kWarps * 32, smem, stream()>>>(q, k, v, o, lse, dev(g));
  CUDA_CHECK_LAUNCH("attention (flash)");
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Calls f.template operator()<kPerLane>() with the smallest lane width that covers D.
template <typename F>
void with_per_lane(int64_t D, F&& f) {
  MAMMOTH_CHECK(D > 0 && D <= 256) << "[attention] head dim " << D << " is outside 1..256";
  if (D <= 32) return f.template operator()<1>();
  if (D <= 64) return f.template operator()<2>();
  if (D <= 128) return f.template operator()<4>();
  return f.template operator()<8>();
}

constexpr int kRowWarps = 4;

template <typename T>
void attention_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                      const void* params) {
  const Geometry g(in, *static_cast<const AttentionParams*>(params), 3);
  const int64_t rows = g.B * g.Hq * g.Tq;
  if (rows == 0) return;
  const T* q = in[0].ptr<const T>();
  const T* k = in[1].ptr<const T>();
  const T* v = in[2].ptr<const T>();
  T* o = out[0].ptr<T>();
  float* lse = out[1].ptr<float>();
  MAMMOTH_CHECK(out[1].dtype == DType::kF32) << "[attention] lse must be f32";
  if constexpr (!std::is_same_v<T, float>) {
    const bool ok = aligned16(q) && aligned16(k) && aligned16(v) && g.Tk > 0;
    if (ok && g.D == 64) return launch_flash<T, 64>(q, k, v, o, lse, g);
    if (ok && g.D == 128) return launch_flash<T, 128>(q, k, v, o, lse, g);
    if (ok && g.D == 32) return launch_flash<T, 32>(q, k, v, o, lse, g);
    if (ok && g.D == 96) return launch_flash<T, 96>(q, k, v, o, lse, g);
  }
  with_per_lane(g.D, [&]<int kPerLane>() {
    attn_fwd_rows<T, kPerLane>
        <<<static_cast<unsigned>(ceil_div(rows, kRowWarps)), kRowWarps * 32, 0, stream()>>>(
            q, k, v, o, lse, dev(g));
    CUDA_CHECK_LAUNCH("attention");
  });
}

// inputs: dout, q, k, v, out, lse, [key_mask]; outputs: dq, dk, dv.
template <typename T>
void attention_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                               const void* params) {
  const Geometry g(in.subspan(1), *static_cast<const AttentionParams*>(params), 5);
  const int64_t qrows = g.B * g.Hq * g.Tq, krows = g.B * g.Hk * g.Tk;
  const T* dout = in[0].ptr<const T>();
  const T* q = in[1].ptr<const T>();
  const T* k = in[2].ptr<const T>();
  const T* v = in[3].ptr<const T>();
  const T* o = in[4].ptr<const T>();
  const float* lse = in[5].ptr<const float>();
  T* dq = out[0].ptr<T>();
  T* dk = out[1].ptr<T>();
  T* dv = out[2].ptr<T>();
  memory::cuda::DeviceBuffer delta(static_cast<size_t>(std::max<int64_t>(qrows, 1)) *
                                   sizeof(float));
  if (qrows > 0) {
    attn_delta<T>
        <<<static_cast<unsigned>(ceil_div(qrows, kRowWarps)), kRowWarps * 32, 0, stream()>>>(
            dout, o, delta.as<float>(), qrows, g.D);
    CUDA_CHECK_LAUNCH("attention_backward delta");
  }
  with_per_lane(g.D, [&]<int kPerLane>() {
    if (qrows > 0) {
      attn_bwd_dq_rows<T, kPerLane>
          <<<static_cast<unsigned>(ceil_div(qrows, kRowWarps)), kRowWarps * 32, 0, stream()>>>(
              dout, q, k, v, lse, delta.as<float>(), dq, dev(g));
      CUDA_CHECK_LAUNCH("attention_backward dq");
    }
    if (krows > 0) {
      attn_bwd_dkdv_rows<T, kPerLane>
          <<<static_cast<unsigned>(ceil_div(krows, kRowWarps)), kRowWarps * 32, 0, stream()>>>(
              dout, q, k, v, lse, delta.as<float>(), dk, dv, dev(g));
      CUDA_CHECK_LAUNCH("attention_backward dk dv");
    }
  });
}

}  // namespace

void register_attention(Registry& r) {
  MAMMOTH_CUDA_REG3(r, attention, attention_kernel);
  MAMMOTH_CUDA_REG3(r, attention_backward, attention_backward_kernel);
}

}  // namespace mammoth::kernels::cuda
