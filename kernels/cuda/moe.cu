// CUDA kernels of the mixture-of-experts layer (models/mixtral), with kernels/cpu/moe.cc's
// semantics: the grouped GEMM over rows sorted by expert, and the weighted scatter-add that
// returns expert outputs to their tokens.
//
// The grouped GEMM reads the group boundaries back to the host (one small synchronising copy of
// E + 1 offsets) and runs one cuBLASLt GEMM per non-empty group: the groups' sizes change every
// step, and the launch needs them. The scatter-add has no float atomics, so each output row sums
// its contributions in row order: the rows are sorted by token (stable radix sort) and one thread
// per (run, column) adds its run up, as index_add does.
#include <cub/device/device_radix_sort.cuh>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/moe_offsets.h"

namespace mammoth::kernels::cuda {
namespace {

// The offsets [E+1] on the host, checked as the CPU kernel checks them.
std::vector<int64_t> read_offsets(const char* op, const TensorArg& offsets, int64_t groups,
                                  int64_t M) {
  MAMMOTH_CHECK(offsets.dtype == DType::kI64 && offsets.numel() == groups + 1)
      << "[" << op << "] offsets must be i64 [" << groups + 1 << "], got " << offsets.numel()
      << " entries";
  std::vector<int64_t> v(static_cast<size_t>(groups + 1));
  CUDA_CHECK(cudaMemcpyAsync(v.data(), offsets.data, v.size() * sizeof(int64_t),
                             cudaMemcpyDeviceToHost, stream()));
  CUDA_CHECK(cudaStreamSynchronize(stream()));
  check_moe_offsets(op, v, groups, M);
  return v;
}

// C [M, N] = op(A) @ op(B) in T, row-major; an empty inner dimension writes zeros.
template <typename T>
void product(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, bool trans_a, const T* B,
             int64_t ldb, bool trans_b, T* C) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    CUDA_CHECK(cudaMemsetAsync(C, 0, static_cast<size_t>(M * N) * sizeof(T), stream()));
    return;
  }
  GemmArgs g;
  g.dtype = dtype_of<T>();
  g.M = M;
  g.N = N;
  g.K = K;
  g.A = A;
  g.lda = lda;
  g.trans_a = trans_a;
  g.B = B;
  g.ldb = ldb;
  g.trans_b = trans_b;
  g.C = C;
  g.ldc = N;
  gemm(g);
}

template <typename T>
void grouped_matmul_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                           const void*) {
  const TensorArg& x = in[0];
  const int64_t M = x.shape[0], K = x.shape[1], N = out[0].shape[1];
  const int64_t E = static_cast<int64_t>(in.size()) - 2;
  const std::vector<int64_t> o = read_offsets("grouped_matmul", in[1], E, M);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = o[e], rows = o[e + 1] - o[e];
    // y_e [rows, N] = x_e [rows, K] @ w_e^T (w_e [N, K])
    product<T>(rows, N, K, x.ptr<const T>() + r0 * K, K, false, in[2 + e].ptr<const T>(), K, true,
               out[0].ptr<T>() + r0 * N);
  }
}

template <typename T>
void grouped_matmul_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                                    const void*) {
  const TensorArg &dy = in[0], &x = in[1];
  const int64_t M = x.shape[0], K = x.shape[1], N = dy.shape[1];
  const int64_t E = static_cast<int64_t>(in.size()) - 3;
  const std::vector<int64_t> o = read_offsets("grouped_matmul_backward", in[2], E, M);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = o[e], rows = o[e + 1] - o[e];
    const T* dy_e = dy.ptr<const T>() + r0 * N;
    // dx_e [rows, K] = dy_e [rows, N] @ w_e [N, K]
    product<T>(rows, K, N, dy_e, N, false, in[3 + e].ptr<const T>(), K, false,
               out[0].ptr<T>() + r0 * K);
    // dw_e [N, K] = dy_e^T [N, rows] @ x_e [rows, K]; an expert with no rows gets zeros.
    product<T>(N, K, rows, dy_e, N, true, x.ptr<const T>() + r0 * K, K, false, out[1 + e].ptr<T>());
  }
}

__global__ void check_rows(const int64_t* __restrict__ rows, int64_t M, int64_t T,
                           DeviceError err) {
  for (int64_t m = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; m < M;
       m += int64_t{gridDim.x} * blockDim.x) {
    if (rows[m] < 0 || rows[m] >= T) err.report(m, rows[m]);
  }
}

void rows_in_range(const char* op, const int64_t* rows, int64_t M, int64_t T) {
  ErrorFlag flag;
  check_rows<<<grid_for(M, 256), 256, 0, stream()>>>(rows, M, T, flag.device());
  CUDA_CHECK_LAUNCH(op);
  int64_t pos = 0, v = 0;
  if (flag.failed(&pos, &v)) {
    MAMMOTH_THROW() << "[" << op << "] row " << pos << " names token " << v << " of " << T;
  }
}

__global__ void iota_rows(int64_t* v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    v[i] = i;
  }
}

constexpr int kColThreads = 64, kPosThreads = 4;

// Thread (p, c): when sorted position p starts a run of rows of one token, it sums
// weight * y over the run's rows in row order and writes the token's output element.
template <typename T>
__global__ void combine_runs(const T* __restrict__ y, const T* __restrict__ w,
                             const int64_t* __restrict__ tokens, const int64_t* __restrict__ src,
                             T* __restrict__ out, int64_t M, int64_t C) {
  const int64_t c = blockIdx.x * int64_t{kColThreads} + threadIdx.x;
  if (c >= C) return;
  for (int64_t p = blockIdx.y * int64_t{kPosThreads} + threadIdx.y; p < M;
       p += int64_t{gridDim.y} * kPosThreads) {
    const int64_t t = tokens[p];
    if (p > 0 && tokens[p - 1] == t) continue;
    float acc = 0.0f;
    for (int64_t q = p; q < M && tokens[q] == t; ++q) {
      const int64_t m = src[q];
      acc += to_float(w[m]) * to_float(y[m * C + c]);
    }
    out[t * C + c] = from_float<T>(acc);
  }
}

template <typename T>
void moe_combine_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                        const void*) {
  const TensorArg& y = in[0];
  const int64_t M = y.shape[0], C = y.shape[1], Tk = out[0].shape[0];
  CUDA_CHECK(cudaMemsetAsync(out[0].data, 0, static_cast<size_t>(Tk * C) * sizeof(T), stream()));
  if (M == 0 || C == 0) return;
  const int64_t* rows = in[1].ptr<const int64_t>();
  rows_in_range("moe_combine", rows, M, Tk);
  MAMMOTH_CHECK(M < (int64_t{1} << 31)) << "[moe_combine] " << M << " rows: at most 2^31 - 1";
  memory::cuda::DeviceBuffer tokens(M * sizeof(int64_t)), src_in(M * sizeof(int64_t)),
      src(M * sizeof(int64_t));
  iota_rows<<<grid_for(M, 256), 256, 0, stream()>>>(src_in.as<int64_t>(), M);
  CUDA_CHECK_LAUNCH("moe_combine iota");
  int end_bit = 1;
  while (end_bit < 63 && (int64_t{1} << end_bit) < Tk) ++end_bit;
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, rows, tokens.as<int64_t>(),
                                             src_in.as<int64_t>(), src.as<int64_t>(),
                                             static_cast<int>(M), 0, end_bit, stream()));
  memory::cuda::DeviceBuffer temp(std::max<size_t>(temp_bytes, 1));
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, rows, tokens.as<int64_t>(),
                                             src_in.as<int64_t>(), src.as<int64_t>(),
                                             static_cast<int>(M), 0, end_bit, stream()));
  const dim3 block(kColThreads, kPosThreads);
  const dim3 grid(static_cast<unsigned>(ceil_div(C, kColThreads)),
                  static_cast<unsigned>(std::min<int64_t>(ceil_div(M, kPosThreads), 4096)));
  combine_runs<T><<<grid, block, 0, stream()>>>(y.ptr<const T>(), in[2].ptr<const T>(),
                                                tokens.as<int64_t>(), src.as<int64_t>(),
                                                out[0].ptr<T>(), M, C);
  CUDA_CHECK_LAUNCH("moe_combine");
}

// Block m: dy[m, :] = w[m] * dout[rows[m], :] and dw[m] = dout[rows[m], :] . y[m, :].
template <typename T>
__global__ void combine_backward_rows(const T* __restrict__ dout, const T* __restrict__ y,
                                      const int64_t* __restrict__ rows, const T* __restrict__ w,
                                      T* __restrict__ dy, T* __restrict__ dw, int64_t C) {
  const int64_t m = blockIdx.x;
  const T* g = dout + rows[m] * C;
  const float wm = to_float(w[m]);
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float gc = to_float(g[c]);
    dy[m * C + c] = from_float<T>(wm * gc);
    dot += gc * to_float(y[m * C + c]);
  }
  dot = block_sum(dot);
  if (threadIdx.x == 0) dw[m] = from_float<T>(dot);
}

template <typename T>
void moe_combine_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                                 const void*) {
  const TensorArg &dout = in[0], &y = in[1];
  const int64_t M = y.shape[0], C = y.shape[1], Tk = dout.shape[0];
  if (M == 0) return;
  const int64_t* rows = in[2].ptr<const int64_t>();
  rows_in_range("moe_combine_backward", rows, M, Tk);
  MAMMOTH_CHECK(M < (int64_t{1} << 31))
      << "[moe_combine_backward] " << M << " rows: at most 2^31 - 1";
  combine_backward_rows<T><<<static_cast<unsigned>(M), row_threads(C), 0, stream()>>>(
      dout.ptr<const T>(), y.ptr<const T>(), rows, in[3].ptr<const T>(), out[0].ptr<T>(),
      out[1].ptr<T>(), C);
  CUDA_CHECK_LAUNCH("moe_combine_backward");
}

}  // namespace

void register_moe(Registry& r) {
  MAMMOTH_CUDA_REG3(r, grouped_matmul, grouped_matmul_kernel);
  MAMMOTH_CUDA_REG3(r, grouped_matmul_backward, grouped_matmul_backward_kernel);
  MAMMOTH_CUDA_REG3(r, moe_combine, moe_combine_kernel);
  MAMMOTH_CUDA_REG3(r, moe_combine_backward, moe_combine_backward_kernel);
}

}  // namespace mammoth::kernels::cuda
