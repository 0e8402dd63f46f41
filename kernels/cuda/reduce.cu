// CUDA reductions over the last dim of a contiguous [M, R] view: sum_last, sum_sq_last and
// max_last, one block per row. Sums accumulate in float in a fixed tree order (deterministic);
// a few long rows (the grad norm reduces each gradient as one row) are split into fixed chunks
// whose float partials are added in double, so that they use the whole device.
#include "kernels/cuda/common.cuh"

namespace mammoth::kernels::cuda {
namespace {

// kSquares: the sum of squares (sum_sq_last) instead of the sum.
template <typename T, bool kSquares>
__global__ void sum_last_rows(const T* __restrict__ x, T* __restrict__ y, int64_t R) {
  const int64_t m = blockIdx.x;
  const T* row = x + m * R;
  float acc = 0.0f;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
    const float v = to_float(row[r]);
    acc += kSquares ? v * v : v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) y[m] = from_float<T>(acc);
}

// The split path: chunks of kChunk elements (the CPU kernel's block size too), each summed by
// one block into partial[m * chunks + c]; then one warp per row adds the row's partials in
// double, lane l taking chunks l, l + 32, ... and the lanes combined in a fixed tree.
constexpr int64_t kChunk = 16384;
constexpr int kChunkThreads = 256;

template <typename T, bool kSquares>
__global__ void sum_last_chunks(const T* __restrict__ x, float* __restrict__ partial, int64_t R,
                                int64_t chunks) {
  const int64_t m = blockIdx.y, c = blockIdx.x;
  const T* row = x + m * R;
  const int64_t end = min(R, (c + 1) * kChunk);
  float acc = 0.0f;
  for (int64_t r = c * kChunk + threadIdx.x; r < end; r += blockDim.x) {
    const float v = to_float(row[r]);
    acc += kSquares ? v * v : v;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) partial[m * chunks + c] = acc;
}

template <typename T>
__global__ void sum_partials(const float* __restrict__ partial, T* __restrict__ y, int64_t chunks) {
  const int64_t m = blockIdx.x;
  double acc = 0.0;
  for (int64_t c = threadIdx.x; c < chunks; c += 32) acc += partial[m * chunks + c];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x == 0) y[m] = from_float<T>(static_cast<float>(acc));
}

// One block per row fills the device from a few hundred rows on; fewer, long rows are split.
bool split_rows(int64_t M, int64_t R) { return M < 256 && R >= 4 * kChunk; }

template <typename T>
__global__ void zero_rows(T* y, int64_t M) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < M;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = from_float<T>(0.0f);
  }
}

template <typename T, bool kSquares>
void sum_rows_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out) {
  const int64_t R = in[0].ndim == 0 ? 1 : in[0].size(-1);
  const int64_t M = out[0].numel();
  if (M == 0) return;
  if (R == 0) {
    zero_rows<<<grid_for(M, 256), 256, 0, stream()>>>(out[0].ptr<T>(), M);
  } else if (split_rows(M, R)) {
    const int64_t chunks = ceil_div(R, kChunk);
    memory::cuda::DeviceBuffer partial(static_cast<size_t>(M * chunks) * sizeof(float));
    sum_last_chunks<T, kSquares>
        <<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(M)), kChunkThreads, 0,
           stream()>>>(in[0].ptr<const T>(), partial.as<float>(), R, chunks);
    CUDA_CHECK_LAUNCH(kSquares ? "sum_sq_last" : "sum_last");
    sum_partials<T><<<static_cast<unsigned>(M), 32, 0, stream()>>>(partial.as<const float>(),
                                                                   out[0].ptr<T>(), chunks);
  } else {
    // One block per row; the grid's x dimension holds 2^31-1 rows.
    sum_last_rows<T, kSquares><<<static_cast<unsigned>(M), row_threads(R, 512), 0, stream()>>>(
        in[0].ptr<const T>(), out[0].ptr<T>(), R);
  }
  CUDA_CHECK_LAUNCH(kSquares ? "sum_sq_last" : "sum_last");
}

template <typename T>
void sum_last_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  sum_rows_kernel<T, false>(in, out);
}

template <typename T>
void sum_sq_last_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                        const void*) {
  sum_rows_kernel<T, true>(in, out);
}

// Column sums of [R, N]: a thread per column, the rows in order in float (neighbouring threads
// read neighbouring columns, so each row's loads coalesce).
template <typename T>
__global__ void column_sums(const T* __restrict__ x, T* __restrict__ y, int64_t R, int64_t N) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < N;
       j += int64_t{gridDim.x} * blockDim.x) {
    float acc = 0.0f;
    for (int64_t r = 0; r < R; ++r) acc += to_float(x[r * N + j]);
    y[j] = from_float<T>(acc);
  }
}

// sum_rows (the kernel; sum_rows_kernel above sums each row for sum_last and sum_sq_last).
template <typename T>
void column_sums_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                        const void*) {
  const int64_t N = out[0].numel();
  if (N == 0) return;
  const int64_t R = in[0].numel() / N;
  constexpr int kThreads = 256;
  column_sums<<<grid_for(N, kThreads), kThreads, 0, stream()>>>(in[0].ptr<const T>(),
                                                                out[0].ptr<T>(), R, N);
  CUDA_CHECK_LAUNCH("sum_rows");
}

// (value, index) ordering of PyTorch's max: NaN beats numbers, then larger, then lower index.
__device__ __forceinline__ bool better(float v, int64_t i, float bv, int64_t bi) {
  const bool vn = v != v, bn = bv != bv;
  if (vn != bn) return vn;
  if (vn) return i < bi;
  if (v != bv) return v > bv;
  return i < bi;
}

template <typename T>
__global__ void max_last_rows(const T* __restrict__ x, T* __restrict__ y, int64_t* __restrict__ idx,
                              int64_t R) {
  const int64_t m = blockIdx.x;
  const T* row = x + m * R;
  float best = -INFINITY;
  int64_t best_i = INT64_MAX;
  for (int64_t r = threadIdx.x; r < R; r += blockDim.x) {
    const float v = to_float(row[r]);
    if (best_i == INT64_MAX || better(v, r, best, best_i)) {
      best = v;
      best_i = r;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (oi != INT64_MAX && (best_i == INT64_MAX || better(ov, oi, best, best_i))) {
      best = ov;
      best_i = oi;
    }
  }
  __shared__ float sv[32];
  __shared__ int64_t si[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
      if (si[w] != INT64_MAX && (best_i == INT64_MAX || better(sv[w], si[w], best, best_i))) {
        best = sv[w];
        best_i = si[w];
      }
    }
    y[m] = row[best_i];
    idx[m] = best_i;
  }
}

template <typename T>
void max_last_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  const int64_t R = in[0].size(-1);
  const int64_t M = out[0].numel();
  if (M == 0) return;
  MAMMOTH_CHECK(R > 0) << "[max_last] cannot take the max of an empty dim (" << M << " rows)";
  max_last_rows<<<static_cast<unsigned>(M), row_threads(R, 512), 0, stream()>>>(
      in[0].ptr<const T>(), out[0].ptr<T>(), out[1].ptr<int64_t>(), R);
  CUDA_CHECK_LAUNCH("max_last");
}

}  // namespace

void register_reduce(Registry& r) {
  MAMMOTH_CUDA_REG3(r, sum_last, sum_last_kernel);
  MAMMOTH_CUDA_REG3(r, max_last, max_last_kernel);
  MAMMOTH_CUDA_REG3(r, sum_sq_last, sum_sq_last_kernel);
  MAMMOTH_CUDA_REG3(r, sum_rows, column_sums_kernel);
}

}  // namespace mammoth::kernels::cuda
