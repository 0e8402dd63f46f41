// CUDA kernels over the last dim of [M, N] rows: softmax, log_softmax (and backwards),
// layer_norm and rms_norm (fused forward, fused backward with deterministic weight gradients),
// fused cross-entropy (no softmax tensor is materialised), dropout with the CPU's Philox stream
// (identical masks), and rotary embedding. Same semantics as kernels/cpu/nn.cc.
//
// Row statistics (mean, rstd, lse, loss) are written in the dtype of the output buffer the
// caller passes (f32, or the input dtype as the CPU kernels do), and read back the same way.
#include <cmath>

#include "base/philox.h"
#include "kernels/cuda/common.cuh"
#include "kernels/params.h"

namespace mammoth::kernels::cuda {
namespace {

__device__ __forceinline__ float load_any(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::kBF16:
      return __bfloat162float(static_cast<const bf16_t*>(p)[i]);
    case DType::kF16:
      return __half2float(static_cast<const f16_t*>(p)[i]);
    case DType::kF64:
      return static_cast<float>(static_cast<const double*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}
__device__ __forceinline__ void store_any(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kBF16:
      static_cast<bf16_t*>(p)[i] = __float2bfloat16_rn(v);
      return;
    case DType::kF16:
      static_cast<f16_t*>(p)[i] = __float2half_rn(v);
      return;
    case DType::kF64:
      static_cast<double*>(p)[i] = v;
      return;
    default:
      static_cast<float*>(p)[i] = v;
      return;
  }
}

void check_stat_dtype(const char* op, const TensorArg& t) {
  MAMMOTH_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16 || t.dtype == DType::kF16)
      << "[" << op << "] statistics buffer has dtype " << dtype_name(t.dtype)
      << "; expected f32 or the input's float dtype";
}

int64_t rows_of(const TensorArg& t) {
  const int64_t n = t.ndim == 0 ? 1 : t.size(-1);
  return n == 0 ? 0 : t.numel() / n;
}

// ---- softmax family -----------------------------------------------------------------------
template <typename T, bool kLog>
__global__ void softmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t N) {
  const T* xr = x + blockIdx.x * N;
  T* yr = y + blockIdx.x * N;
  float mx = -INFINITY;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) mx = fmaxf(mx, to_float(xr[n]));
  mx = block_max(mx);
  float sum = 0.0f;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) sum += expf(to_float(xr[n]) - mx);
  sum = block_sum(sum);
  if (kLog) {
    const float lse = mx + logf(sum);
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x)
      yr[n] = from_float<T>(to_float(xr[n]) - lse);
  } else {
    const float inv = 1.0f / sum;
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
      yr[n] = from_float<T>(expf(to_float(xr[n]) - mx) * inv);
    }
  }
}

template <typename T, bool kLog>
__global__ void softmax_backward_rows(const T* __restrict__ dy, const T* __restrict__ y,
                                      T* __restrict__ dx, int64_t N) {
  const int64_t base = blockIdx.x * N;
  float acc = 0.0f;  // softmax: sum(dy * y); log_softmax: sum(dy)
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    acc += kLog ? to_float(dy[base + n]) : to_float(dy[base + n]) * to_float(y[base + n]);
  }
  acc = block_sum(acc);
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    const float g = to_float(dy[base + n]), yv = to_float(y[base + n]);
    dx[base + n] = from_float<T>(kLog ? g - expf(yv) * acc : yv * (g - acc));
  }
}

template <typename T, bool kLog>
void softmax_impl(std::span<const TensorArg> in, std::span<const TensorArg> out) {
  const int64_t N = in[0].size(-1), M = rows_of(in[0]);
  if (M == 0 || N == 0) return;
  softmax_rows<T, kLog><<<static_cast<unsigned>(M), row_threads(N, 512), 0, stream()>>>(
      in[0].ptr<const T>(), out[0].ptr<T>(), N);
  CUDA_CHECK_LAUNCH("softmax");
}

template <typename T, bool kLog>
void softmax_backward_impl(std::span<const TensorArg> in, std::span<const TensorArg> out) {
  const int64_t N = in[0].size(-1), M = rows_of(in[0]);
  if (M == 0 || N == 0) return;
  softmax_backward_rows<T, kLog><<<static_cast<unsigned>(M), row_threads(N, 512), 0, stream()>>>(
      in[0].ptr<const T>(), in[1].ptr<const T>(), out[0].ptr<T>(), N);
  CUDA_CHECK_LAUNCH("softmax_backward");
}

template <typename T>
void softmax_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  softmax_impl<T, false>(in, out);
}
template <typename T>
void log_softmax_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                        const void*) {
  softmax_impl<T, true>(in, out);
}
template <typename T>
void softmax_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                             const void*) {
  softmax_backward_impl<T, false>(in, out);
}
template <typename T>
void log_softmax_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                                 const void*) {
  softmax_backward_impl<T, true>(in, out);
}

// ---- layer_norm / rms_norm forward ---------------------------------------------------------
// One block per row. Rows of up to blockDim * kCache elements stay in registers between the
// statistics and the output pass; longer rows are re-read (from L1/L2).
constexpr int kCache = 8;

template <typename T, bool kRms, bool kCached>
__global__ void norm_forward_rows(const T* __restrict__ x, const T* __restrict__ w,
                                  const T* __restrict__ b, T* __restrict__ y, void* mean,
                                  void* rstd, DType stat_t, int64_t N, float eps) {
  const int64_t base = blockIdx.x * N;
  float cache[kCached ? kCache : 1];
  float s = 0.0f;
  if (kCached) {
#pragma unroll
    for (int k = 0; k < kCache; ++k) {
      const int64_t n = threadIdx.x + int64_t{k} * blockDim.x;
      cache[k] = n < N ? to_float(x[base + n]) : 0.0f;
      s += kRms ? cache[k] * cache[k] : cache[k];
    }
  } else {
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
      const float v = to_float(x[base + n]);
      s += kRms ? v * v : v;
    }
  }
  s = block_sum(s);
  float mu = 0.0f, rs;
  if (kRms) {
    rs = rsqrtf(s / static_cast<float>(N) + eps);
  } else {
    mu = s / static_cast<float>(N);
    float v2 = 0.0f;  // two-pass variance: no cancellation for rows with a large mean
    if (kCached) {
#pragma unroll
      for (int k = 0; k < kCache; ++k) {
        const int64_t n = threadIdx.x + int64_t{k} * blockDim.x;
        const float d = cache[k] - mu;
        v2 += n < N ? d * d : 0.0f;
      }
    } else {
      for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
        const float d = to_float(x[base + n]) - mu;
        v2 += d * d;
      }
    }
    v2 = block_sum(v2);
    rs = rsqrtf(v2 / static_cast<float>(N) + eps);
  }
  if (threadIdx.x == 0) {
    if (!kRms) store_any(mean, stat_t, blockIdx.x, mu);
    store_any(rstd, stat_t, blockIdx.x, rs);
  }
  auto out = [&](int64_t n, float v) {
    const float xhat = (v - mu) * rs;
    const float r = kRms ? xhat * to_float(w[n]) : xhat * to_float(w[n]) + to_float(b[n]);
    y[base + n] = from_float<T>(r);
  };
  if (kCached) {
#pragma unroll
    for (int k = 0; k < kCache; ++k) {
      const int64_t n = threadIdx.x + int64_t{k} * blockDim.x;
      if (n < N) out(n, cache[k]);
    }
  } else {
    for (int64_t n = threadIdx.x; n < N; n += blockDim.x) out(n, to_float(x[base + n]));
  }
}

template <typename T, bool kRms>
void norm_forward(const TensorArg& x, const T* w, const T* b, const TensorArg& y, void* mean,
                  const TensorArg& rstd, double eps) {
  const int64_t N = x.size(-1), M = rows_of(x);
  if (M == 0 || N == 0) return;
  check_stat_dtype(kRms ? "rms_norm" : "layer_norm", rstd);
  const unsigned grid = static_cast<unsigned>(M);
  if (N <= 1024 * kCache) {
    const int threads = row_threads(ceil_div(N, kCache), 1024);
    norm_forward_rows<T, kRms, true>
        <<<grid, threads, 0, stream()>>>(x.ptr<const T>(), w, b, y.ptr<T>(), mean, rstd.data,
                                         rstd.dtype, N, static_cast<float>(eps));
  } else {
    norm_forward_rows<T, kRms, false>
        <<<grid, 1024, 0, stream()>>>(x.ptr<const T>(), w, b, y.ptr<T>(), mean, rstd.data,
                                      rstd.dtype, N, static_cast<float>(eps));
  }
  CUDA_CHECK_LAUNCH(kRms ? "rms_norm" : "layer_norm");
}

template <typename T>
void layer_norm_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                       const void* params) {
  const double eps = static_cast<const NormParams*>(params)->eps;
  MAMMOTH_CHECK(out[1].dtype == out[2].dtype) << "[layer_norm] mean and rstd dtypes differ";
  norm_forward<T, false>(in[0], in[1].ptr<const T>(), in[2].ptr<const T>(), out[0], out[1].data,
                         out[2], eps);
}

template <typename T>
void rms_norm_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                     const void* params) {
  const double eps = static_cast<const NormParams*>(params)->eps;
  norm_forward<T, true>(in[0], in[1].ptr<const T>(), nullptr, out[0], nullptr, out[1], eps);
}

// ---- layer_norm / rms_norm backward --------------------------------------------------------
template <typename T, bool kRms>
__global__ void norm_backward_rows(const T* __restrict__ dy, const T* __restrict__ x,
                                   const T* __restrict__ w, const void* mean, const void* rstd,
                                   DType stat_t, T* __restrict__ dx, int64_t N) {
  const int64_t m = blockIdx.x, base = m * N;
  const float mu = kRms ? 0.0f : load_any(mean, stat_t, m);
  const float rs = load_any(rstd, stat_t, m);
  float s1 = 0.0f, s2 = 0.0f;  // sum(dxhat), sum(dxhat * xhat)
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    const float xhat = (to_float(x[base + n]) - mu) * rs;
    const float dxhat = to_float(dy[base + n]) * to_float(w[n]);
    s1 += dxhat;
    s2 += dxhat * xhat;
  }
  if (!kRms) s1 = block_sum(s1);
  s2 = block_sum(s2);
  s1 /= static_cast<float>(N);
  s2 /= static_cast<float>(N);
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) {
    const float xhat = (to_float(x[base + n]) - mu) * rs;
    const float dxhat = to_float(dy[base + n]) * to_float(w[n]);
    dx[base + n] = from_float<T>(kRms ? rs * (dxhat - xhat * s2) : rs * (dxhat - s1 - xhat * s2));
  }
}

// Weight gradients without atomics: block (bx, by) sums rows [by*rows_per, ...) of 32
// columns into partial[by]; a second kernel adds the partials in order. Deterministic.
constexpr int kColTile = 32, kRowLanes = 8;

template <typename T, bool kRms>
__global__ void norm_weight_partial(const T* __restrict__ dy, const T* __restrict__ x,
                                    const void* mean, const void* rstd, DType stat_t, int64_t M,
                                    int64_t N, int64_t rows_per, float* __restrict__ partial) {
  __shared__ float sw[kRowLanes][kColTile + 1];
  __shared__ float sb[kRowLanes][kColTile + 1];
  const int64_t n = blockIdx.x * int64_t{kColTile} + threadIdx.x;
  const int64_t r0 = blockIdx.y * rows_per, r1 = min(M, r0 + rows_per);
  float gw = 0.0f, gb = 0.0f;
  if (n < N) {
    for (int64_t m = r0 + threadIdx.y; m < r1; m += kRowLanes) {
      const float mu = kRms ? 0.0f : load_any(mean, stat_t, m);
      const float xhat = (to_float(x[m * N + n]) - mu) * load_any(rstd, stat_t, m);
      const float g = to_float(dy[m * N + n]);
      gw += g * xhat;
      gb += g;
    }
  }
  sw[threadIdx.y][threadIdx.x] = gw;
  sb[threadIdx.y][threadIdx.x] = gb;
  __syncthreads();
  if (threadIdx.y == 0 && n < N) {
    for (int k = 1; k < kRowLanes; ++k) {
      gw += sw[k][threadIdx.x];
      gb += sb[k][threadIdx.x];
    }
    const int64_t groups = kRms ? 1 : 2;
    partial[(blockIdx.y * groups) * N + n] = gw;
    if (!kRms) partial[(blockIdx.y * groups + 1) * N + n] = gb;
  }
}

template <typename T>
__global__ void sum_partials(const float* __restrict__ partial, int64_t blocks, int64_t groups,
                             int64_t N, T* __restrict__ g0, T* __restrict__ g1) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < groups * N;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t g = i / N, n = i % N;
    float s = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) s += partial[(b * groups + g) * N + n];
    (g == 0 ? g0 : g1)[n] = from_float<T>(s);
  }
}

template <typename T, bool kRms>
void norm_backward(std::span<const TensorArg> in, std::span<const TensorArg> out) {
  const TensorArg& x = in[1];
  const int64_t N = x.size(-1), M = rows_of(x);
  if (N == 0) return;
  const void* mean = kRms ? nullptr : in[3].data;
  const TensorArg& rstd = kRms ? in[3] : in[4];
  check_stat_dtype(kRms ? "rms_norm_backward" : "layer_norm_backward", rstd);
  T* gw = out[1].ptr<T>();
  T* gb = kRms ? nullptr : out[2].ptr<T>();
  const int64_t groups = kRms ? 1 : 2;
  if (M == 0) {  // no rows: the weight gradients are zero
    CUDA_CHECK(cudaMemsetAsync(gw, 0, N * sizeof(T), stream()));
    if (gb != nullptr) CUDA_CHECK(cudaMemsetAsync(gb, 0, N * sizeof(T), stream()));
    return;
  }
  norm_backward_rows<T, kRms><<<static_cast<unsigned>(M), row_threads(N, 512), 0, stream()>>>(
      in[0].ptr<const T>(), x.ptr<const T>(), in[2].ptr<const T>(), mean, rstd.data, rstd.dtype,
      out[0].ptr<T>(), N);
  CUDA_CHECK_LAUNCH("norm_backward_rows");
  const int64_t col_tiles = ceil_div(N, kColTile);
  // Enough row blocks to fill the device (~4 blocks per SM over the column tiles), each at
  // least 16 rows so the partial buffer stays small.
  const int64_t row_blocks =
      std::max<int64_t>(1, std::min<int64_t>(ceil_div(M, 16), ceil_div(4 * 132, col_tiles)));
  const int64_t rows_per = ceil_div(M, row_blocks);
  const int64_t blocks = ceil_div(M, rows_per);
  memory::cuda::DeviceBuffer partial(static_cast<size_t>(blocks * groups * N) * sizeof(float));
  norm_weight_partial<T, kRms>
      <<<dim3(static_cast<unsigned>(col_tiles), static_cast<unsigned>(blocks)),
         dim3(kColTile, kRowLanes), 0, stream()>>>(in[0].ptr<const T>(), x.ptr<const T>(), mean,
                                                   rstd.data, rstd.dtype, M, N, rows_per,
                                                   partial.as<float>());
  CUDA_CHECK_LAUNCH("norm_weight_partial");
  sum_partials<T><<<grid_for(groups * N, 256), 256, 0, stream()>>>(partial.as<float>(), blocks,
                                                                   groups, N, gw, gb);
  CUDA_CHECK_LAUNCH("sum_partials");
}

template <typename T>
void layer_norm_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                                const void*) {
  norm_backward<T, false>(in, out);
}
template <typename T>
void rms_norm_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                              const void*) {
  norm_backward<T, true>(in, out);
}

// ---- cross-entropy -------------------------------------------------------------------------
// Online log-sum-exp: each thread keeps (max, sum of exp(x - max)); pairs merge exactly.
__device__ __forceinline__ void lse_merge(float& m, float& s, float om, float os) {
  if (om == -INFINITY) return;
  if (m == -INFINITY) {
    m = om;
    s = os;
    return;
  }
  const float nm = fmaxf(m, om);
  s = s * expf(m - nm) + os * expf(om - nm);
  m = nm;
}

template <typename T>
__global__ void cross_entropy_rows(const T* __restrict__ x, const int64_t* __restrict__ target,
                                   void* loss, DType loss_t, void* lse_out, DType lse_t, int64_t V,
                                   int64_t ignore_index, float smoothing, DeviceError err) {
  const int64_t m = blockIdx.x;
  const T* xr = x + m * V;
  float mx = -INFINITY, se = 0.0f, sx = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float xv = to_float(xr[v]);
    sx += xv;
    if (xv > mx) {
      se = (mx == -INFINITY ? 0.0f : se * expf(mx - xv)) + 1.0f;
      mx = xv;
    } else if (xv != -INFINITY) {
      se += expf(xv - mx);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(0xffffffffu, mx, o);
    const float os = __shfl_xor_sync(0xffffffffu, se, o);
    lse_merge(mx, se, om, os);
  }
  __shared__ float sm[32], ss[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sm[warp] = mx;
    ss[warp] = se;
  }
  sx = block_sum(sx);  // its barriers also publish sm/ss
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) lse_merge(mx, se, sm[w], ss[w]);
    const float lse = mx + logf(se);
    store_any(lse_out, lse_t, m, lse);
    const int64_t t = target[m];
    float l = 0.0f;
    if (t != ignore_index) {
      if (t < 0 || t >= V) {
        err.report(m, t);
        l = NAN;
      } else {
        l = (1.0f - smoothing) * (lse - to_float(xr[t])) +
            smoothing * (lse - sx / static_cast<float>(V));
      }
    }
    store_any(loss, loss_t, m, l);
  }
}

template <typename T>
__global__ void cross_entropy_backward_rows(const void* dloss, DType dloss_t,
                                            const T* __restrict__ x,
                                            const int64_t* __restrict__ target, const void* lse,
                                            DType lse_t, T* __restrict__ dx, int64_t V,
                                            int64_t ignore_index, float smoothing,
                                            DeviceError err) {
  const int64_t m = blockIdx.x;
  const int64_t t = target[m];
  T* dr = dx + m * V;
  if (t == ignore_index) {
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) dr[v] = from_float<T>(0.0f);
    return;
  }
  if (t < 0 || t >= V) {
    if (threadIdx.x == 0) err.report(m, t);
    return;
  }
  const float g = load_any(dloss, dloss_t, m), l = load_any(lse, lse_t, m);
  const float smooth = smoothing / static_cast<float>(V);
  const T* xr = x + m * V;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float d = g * (expf(to_float(xr[v]) - l) - smooth);
    if (v == t) d -= g * (1.0f - smoothing);
    dr[v] = from_float<T>(d);
  }
}

void throw_target_error(const ErrorFlag& flag, int64_t V) {
  int64_t row = 0, t = 0;
  if (flag.failed(&row, &t)) {
    MAMMOTH_THROW() << "[cross_entropy] target " << t << " at row " << row
                    << " is out of range for " << V << " classes";
  }
}

template <typename T>
void cross_entropy_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                          const void* params) {
  const auto* p = static_cast<const CrossEntropyParams*>(params);
  const int64_t V = in[0].size(-1), M = rows_of(in[0]);
  if (M == 0) return;
  MAMMOTH_CHECK(V > 0) << "[cross_entropy] zero classes";
  check_stat_dtype("cross_entropy", out[0]);
  check_stat_dtype("cross_entropy", out[1]);
  ErrorFlag flag;
  cross_entropy_rows<T><<<static_cast<unsigned>(M), row_threads(V, 1024), 0, stream()>>>(
      in[0].ptr<const T>(), in[1].ptr<const int64_t>(), out[0].data, out[0].dtype, out[1].data,
      out[1].dtype, V, p->ignore_index, static_cast<float>(p->label_smoothing), flag.device());
  CUDA_CHECK_LAUNCH("cross_entropy");
  throw_target_error(flag, V);
}

template <typename T>
void cross_entropy_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                                   const void* params) {
  const auto* p = static_cast<const CrossEntropyParams*>(params);
  const int64_t V = in[1].size(-1), M = rows_of(in[1]);
  if (M == 0 || V == 0) return;
  check_stat_dtype("cross_entropy_backward", in[0]);
  check_stat_dtype("cross_entropy_backward", in[3]);
  ErrorFlag flag;
  cross_entropy_backward_rows<T><<<static_cast<unsigned>(M), row_threads(V, 1024), 0, stream()>>>(
      in[0].data, in[0].dtype, in[1].ptr<const T>(), in[2].ptr<const int64_t>(), in[3].data,
      in[3].dtype, out[0].ptr<T>(), V, p->ignore_index, static_cast<float>(p->label_smoothing),
      flag.device());
  CUDA_CHECK_LAUNCH("cross_entropy_backward");
  throw_target_error(flag, V);
}

// ---- dropout -------------------------------------------------------------------------------
// Thread c draws Philox counter (offset + c) and serves elements 4c .. 4c+3: the CPU's stream.
template <typename T>
__global__ void dropout_chunks(const T* __restrict__ x, T* __restrict__ y,
                               uint8_t* __restrict__ mask, int64_t n, uint64_t seed,
                               uint64_t offset, float threshold, float scale) {
  const int64_t chunks = (n + 3) / 4;
  for (int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; c < chunks;
       c += int64_t{gridDim.x} * blockDim.x) {
    const PhiloxOut r = philox4x32(offset + static_cast<uint64_t>(c), 0, seed);
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t i = c * 4 + lane;
      if (i >= n) break;
      const bool keep = philox_uniform(r.v[lane]) >= threshold;
      mask[i] = keep;
      y[i] = keep ? from_float<T>(to_float(x[i]) * scale) : from_float<T>(0.0f);
    }
  }
}

template <typename T>
void dropout_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                    const void* params) {
  const auto* p = static_cast<const DropoutParams*>(params);
  const int64_t n = in[0].numel();
  if (n == 0) return;
  const float scale = p->p < 1.0 ? static_cast<float>(1.0 / (1.0 - p->p)) : 0.0f;
  dropout_chunks<T><<<grid_for((n + 3) / 4, 256), 256, 0, stream()>>>(
      in[0].ptr<const T>(), out[0].ptr<T>(), out[1].ptr<uint8_t>(), n, p->seed, p->offset,
      static_cast<float>(p->p), scale);
  CUDA_CHECK_LAUNCH("dropout");
}

// ---- rotary embedding ----------------------------------------------------------------------
// Thread (row, i): i < half rotates the pair (i, i + half); i >= rot copies the pass-through dim.
// Angles are computed as the CPU does (inv_freq rounded to float, then double cos/sin).
template <typename T>
__global__ void rope_pairs(const T* __restrict__ x, T* __restrict__ y, int64_t rows, int64_t Tn,
                           int64_t H, int64_t D, int64_t rot, double base,
                           const float* __restrict__ table, int64_t pos0, double sign) {
  const int64_t half = rot / 2;
  const int64_t total = rows * D;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = e / D, i = e % D;
    const T* xr = x + row * D;
    T* yr = y + row * D;
    if (i >= rot) {
      yr[i] = xr[i];
    } else if (i < half) {
      const int64_t t = (row / H) % Tn;
      const double pos = static_cast<double>(pos0 + t);
      const float inv_freq =
          table != nullptr ? table[i]
                           : static_cast<float>(1.0 / pow(base, static_cast<double>(2 * i) / rot));
      const double ang = pos * static_cast<double>(inv_freq);
      const float cs = static_cast<float>(cos(ang)), sn = static_cast<float>(sign * sin(ang));
      const float a = to_float(xr[i]), b = to_float(xr[i + half]);
      yr[i] = from_float<T>(a * cs - b * sn);
      yr[i + half] = from_float<T>(b * cs + a * sn);
    }
  }
}

template <typename T>
void rope_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                 const void* params) {
  const auto* p = static_cast<const RopeParams*>(params);
  const TensorArg& xa = in[0];
  const int64_t B = xa.shape[0], Tn = xa.shape[1], H = xa.shape[2], D = xa.shape[3];
  const int64_t rot = p->rotary_dim > 0 ? p->rotary_dim : D;
  MAMMOTH_CHECK(rot % 2 == 0 && rot <= D)
      << "[rope] rotary dim " << rot << " must be even and at most the head dim " << D;
  // An explicit table (in[1], f32 [rot / 2] on the device: scaled rope) replaces base.
  const float* table = in.size() > 1 && in[1].data != nullptr ? in[1].ptr<const float>() : nullptr;
  MAMMOTH_CHECK(table == nullptr || in[1].numel() == rot / 2)
      << "[rope] inv_freq has " << in[1].numel() << " entries, need rotary dim / 2 = " << rot / 2;
  const int64_t rows = B * Tn * H;
  if (rows * D == 0) return;
  rope_pairs<T><<<grid_for(rows * D, 256), 256, 0, stream()>>>(
      xa.ptr<const T>(), out[0].ptr<T>(), rows, Tn, H, D, rot, p->base, table, p->position_offset,
      p->inverse ? -1.0 : 1.0);
  CUDA_CHECK_LAUNCH("rope");
}

}  // namespace

void register_nn(Registry& r) {
  MAMMOTH_CUDA_REG3(r, softmax, softmax_kernel);
  MAMMOTH_CUDA_REG3(r, softmax_backward, softmax_backward_kernel);
  MAMMOTH_CUDA_REG3(r, log_softmax, log_softmax_kernel);
  MAMMOTH_CUDA_REG3(r, log_softmax_backward, log_softmax_backward_kernel);
  MAMMOTH_CUDA_REG3(r, layer_norm, layer_norm_kernel);
  MAMMOTH_CUDA_REG3(r, layer_norm_backward, layer_norm_backward_kernel);
  MAMMOTH_CUDA_REG3(r, rms_norm, rms_norm_kernel);
  MAMMOTH_CUDA_REG3(r, rms_norm_backward, rms_norm_backward_kernel);
  MAMMOTH_CUDA_REG3(r, cross_entropy, cross_entropy_kernel);
  MAMMOTH_CUDA_REG3(r, cross_entropy_backward, cross_entropy_backward_kernel);
  MAMMOTH_CUDA_REG3(r, dropout, dropout_kernel);
  MAMMOTH_CUDA_REG3(r, rope, rope_kernel);
}

}  // namespace mammoth::kernels::cuda
