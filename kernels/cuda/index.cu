// CUDA indexing kernels on [A, R, C] views: index_select / index_add (embedding forward and
// its deterministic backward) and gather / scatter_add. Same semantics as kernels/cpu/index.cc.
//
// No float atomics anywhere, so every accumulation has a fixed order:
// - index_add sorts the indices (stable radix sort, CUB), then each run of equal indices is
//   summed in index order by one thread per column and added to its destination row;
// - scatter_add gives each (a, c) column to one thread, which walks i in order.
// Out-of-range indices are reported by the kernels and raised on the host (this synchronises).
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"

namespace mammoth::kernels::cuda {
namespace {

void raise_index_error(const ErrorFlag& flag, const char* op, int64_t R) {
  int64_t pos = 0, v = 0;
  if (flag.failed(&pos, &v)) {
    MAMMOTH_THROW() << "[" << op << "] index " << v << " (at position " << pos
                    << ") is out of range for a dim of size " << R;
  }
}

__global__ void check_indices(const int64_t* __restrict__ idx, int64_t n, int64_t R,
                              DeviceError err) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t v = idx[i];
    if (v < 0 || v >= R) err.report(i, v);
  }
}

template <typename T>
__global__ void index_select_rows(const T* __restrict__ x, const int64_t* __restrict__ idx,
                                  T* __restrict__ y, int64_t A, int64_t R, int64_t I, int64_t C) {
  const int64_t total = A * I * C;
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = e % C, ai = e / C;
    const int64_t a = ai / I, i = ai % I;
    y[e] = x[(a * R + idx[i]) * C + c];
  }
}

template <typename T>
void index_select_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                         const void*) {
  const TensorArg& x = in[0];
  const int64_t A = x.shape[0], R = x.shape[1], C = x.shape[2], I = in[1].numel();
  if (I == 0) return;
  ErrorFlag flag;
  check_indices<<<grid_for(I, 256), 256, 0, stream()>>>(in[1].ptr<const int64_t>(), I, R,
                                                        flag.device());
  CUDA_CHECK_LAUNCH("index_select check");
  raise_index_error(flag, "index_select", R);
  if (A * C == 0) return;
  index_select_rows<T><<<grid_for(A * I * C, 256), 256, 0, stream()>>>(
      x.ptr<const T>(), in[1].ptr<const int64_t>(), out[0].ptr<T>(), A, R, I, C);
  CUDA_CHECK_LAUNCH("index_select");
}

__global__ void iota(int64_t* v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    v[i] = i;
  }
}

// Thread (p, c): if sorted position p starts a run of equal keys, it sums dy over the run's
// source rows (ascending i: the radix sort is stable) and adds the sum to dx[a, key, c].
constexpr int kColThreads = 64, kPosThreads = 4;

template <typename T>
__global__ void index_add_runs(const T* __restrict__ dy, const int64_t* __restrict__ keys,
                               const int64_t* __restrict__ src, T* __restrict__ dx, int64_t R,
                               int64_t I, int64_t C) {
  const int64_t c = blockIdx.x * int64_t{kColThreads} + threadIdx.x;
  const int64_t a = blockIdx.z;
  if (c >= C) return;
  for (int64_t p = blockIdx.y * int64_t{kPosThreads} + threadIdx.y; p < I;
       p += int64_t{gridDim.y} * kPosThreads) {
    const int64_t key = keys[p];
    if (p > 0 && keys[p - 1] == key) continue;
    float acc = 0.0f;
    for (int64_t q = p; q < I && keys[q] == key; ++q) acc += to_float(dy[(a * I + src[q]) * C + c]);
    T* d = dx + (a * R + key) * C + c;
    *d = from_float<T>(to_float(*d) + acc);
  }
}

template <typename T>
void index_add_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  const TensorArg& dx = out[0];
  const int64_t A = dx.shape[0], R = dx.shape[1], C = dx.shape[2], I = in[1].numel();
  if (I == 0) return;
  const int64_t* idx = in[1].ptr<const int64_t>();
  ErrorFlag flag;
  check_indices<<<grid_for(I, 256), 256, 0, stream()>>>(idx, I, R, flag.device());
  CUDA_CHECK_LAUNCH("index_add check");
  raise_index_error(flag, "index_add", R);
  if (A * C == 0) return;
  MAMMOTH_CHECK(I < (int64_t{1} << 31)) << "[index_add] " << I << " indices: at most 2^31 - 1";

  memory::cuda::DeviceBuffer keys(I * sizeof(int64_t)), src_in(I * sizeof(int64_t)),
      src(I * sizeof(int64_t));
  iota<<<grid_for(I, 256), 256, 0, stream()>>>(src_in.as<int64_t>(), I);
  CUDA_CHECK_LAUNCH("iota");
  int end_bit = 1;
  while (end_bit < 63 && (int64_t{1} << end_bit) < R) ++end_bit;
  size_t temp_bytes = 0;
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, idx, keys.as<int64_t>(),
                                             src_in.as<int64_t>(), src.as<int64_t>(),
                                             static_cast<int>(I), 0, end_bit, stream()));
  memory::cuda::DeviceBuffer temp(std::max<size_t>(temp_bytes, 1));
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, idx, keys.as<int64_t>(),
                                             src_in.as<int64_t>(), src.as<int64_t>(),
                                             static_cast<int>(I), 0, end_bit, stream()));
  const dim3 block(kColThreads, kPosThreads);
  const dim3 grid(static_cast<unsigned>(ceil_div(C, kColThreads)),
                  static_cast<unsigned>(std::min<int64_t>(ceil_div(I, kPosThreads), 4096)),
                  static_cast<unsigned>(A));
  MAMMOTH_CHECK(A <= 65535) << "[index_add] outer dim " << A << " exceeds 65535";
  index_add_runs<T><<<grid, block, 0, stream()>>>(in[0].ptr<const T>(), keys.as<int64_t>(),
                                                  src.as<int64_t>(), dx.ptr<T>(), R, I, C);
  CUDA_CHECK_LAUNCH("index_add");
}

template <typename T>
__global__ void gather_elems(const T* __restrict__ x, const int64_t* __restrict__ idx,
                             T* __restrict__ y, int64_t R, int64_t I, int64_t C, int64_t total,
                             DeviceError err) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < total;
       e += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = e % C, a = e / (I * C);
    const int64_t r = idx[e];
    if (r < 0 || r >= R) {
      err.report(e, r);
      continue;
    }
    y[e] = x[(a * R + r) * C + c];
  }
}

template <typename T>
void gather_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  const TensorArg& x = in[0];
  const int64_t A = x.shape[0], R = x.shape[1], C = x.shape[2], I = in[1].shape[1];
  const int64_t total = A * I * C;
  if (total == 0) return;
  ErrorFlag flag;
  gather_elems<T><<<grid_for(total, 256), 256, 0, stream()>>>(
      x.ptr<const T>(), in[1].ptr<const int64_t>(), out[0].ptr<T>(), R, I, C, total, flag.device());
  CUDA_CHECK_LAUNCH("gather");
  raise_index_error(flag, "gather", R);
}

template <typename T>
__global__ void scatter_add_columns(const T* __restrict__ dy, const int64_t* __restrict__ idx,
                                    T* __restrict__ dx, int64_t A, int64_t R, int64_t I, int64_t C,
                                    DeviceError err) {
  for (int64_t ac = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; ac < A * C;
       ac += int64_t{gridDim.x} * blockDim.x) {
    const int64_t a = ac / C, c = ac % C;
    for (int64_t i = 0; i < I; ++i) {
      const int64_t e = (a * I + i) * C + c;
      const int64_t r = idx[e];
      if (r < 0 || r >= R) {
        err.report(e, r);
        continue;
      }
      T* d = dx + (a * R + r) * C + c;
      *d = from_float<T>(to_float(*d) + to_float(dy[e]));
    }
  }
}

template <typename T>
void scatter_add_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                        const void*) {
  const TensorArg& dx = out[0];
  const int64_t A = dx.shape[0], R = dx.shape[1], C = dx.shape[2], I = in[1].shape[1];
  if (A * C * I == 0) return;
  ErrorFlag flag;
  scatter_add_columns<T><<<grid_for(A * C, 128), 128, 0, stream()>>>(
      in[0].ptr<const T>(), in[1].ptr<const int64_t>(), dx.ptr<T>(), A, R, I, C, flag.device());
  CUDA_CHECK_LAUNCH("scatter_add");
  raise_index_error(flag, "scatter_add", R);
}

}  // namespace

void register_index(Registry& r) {
  MAMMOTH_CUDA_REG3(r, index_select, index_select_kernel);
  MAMMOTH_CUDA_REG3(r, index_add, index_add_kernel);
  MAMMOTH_CUDA_REG3(r, gather, gather_kernel);
  MAMMOTH_CUDA_REG3(r, scatter_add, scatter_add_kernel);
}

}  // namespace mammoth::kernels::cuda
