// Shared by the CUDA kernel files: dtype conversions, launch helpers, warp/block reductions,
// strided indexing for broadcasting, and a device-side error flag for argument checks that
// only the device can make (out-of-range indices and targets).
//
// Every kernel computes in float for f32/bf16/f16 storage (bf16/f16 are rounded to nearest
// even only when stored), launches on memory::cuda::current_stream(), and returns at once for
// empty tensors (a zero-sized grid is a launch error).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "base/error.h"
#include "kernels/kernel.h"
#include "kernels/registry.h"
#include "memory/cuda/caching_allocator.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/device.h"

namespace mammoth::kernels::cuda {

using bf16_t = __nv_bfloat16;
using f16_t = __half;

inline cudaStream_t stream() { return memory::cuda::current_stream(); }

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over n items: enough to fill the device, never more than needed.
inline unsigned grid_for(int64_t n, int threads) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(ceil_div(n, threads), 65536)));
}

// ---- conversions --------------------------------------------------------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(double x) { return static_cast<float>(x); }
__device__ __forceinline__ float to_float(bf16_t x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(f16_t x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ bf16_t from_float<bf16_t>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ f16_t from_float<f16_t>(float x) {
  return __float2half_rn(x);
}

// The storage type of a DType (for the float kernels registered here).
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kF32;
}
template <>
constexpr DType dtype_of<bf16_t>() {
  return DType::kBF16;
}
template <>
constexpr DType dtype_of<f16_t>() {
  return DType::kF16;
}

// Registers fn<float>, fn<bf16_t>, fn<f16_t> for kernel K on CUDA.
#define MAMMOTH_CUDA_REG3(r, K, fn)                                  \
  do {                                                               \
    (r).add(Kernel::K, DeviceType::kCUDA, DType::kF32, fn<float>);   \
    (r).add(Kernel::K, DeviceType::kCUDA, DType::kBF16, fn<bf16_t>); \
    (r).add(Kernel::K, DeviceType::kCUDA, DType::kF16, fn<f16_t>);   \
  } while (0)

// ---- reductions ---------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. Safe to call repeatedly: the leading barrier protects the scratch from the last use.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v) {
  __shared__ float scratch[32];
  v = kMax ? warp_max(v) : warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const float identity = kMax ? -INFINITY : 0.0f;
    float w = lane < nwarps ? scratch[lane] : identity;
    w = kMax ? warp_max(w) : warp_sum(w);
    if (lane == 0) scratch[0] = w;
  }
  __syncthreads();
  return scratch[0];
}
__device__ __forceinline__ float block_sum(float v) { return block_reduce<false>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<true>(v); }

// Threads per block for one block per row of n elements: a multiple of 32, at most 1024.
inline int row_threads(int64_t n, int max_threads = 1024) {
  int t = 32;
  while (t < max_threads && t < n) t *= 2;
  return t;
}

// ---- strided indexing ---------------------------------------------------------------------
// N operands viewed in operand 0's shape (broadcast operands have stride 0). Dims that are
// contiguous for every operand are merged on the host, as the CPU's StridedLoop does.
template <int N>
struct Indexer {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  __device__ __forceinline__ void offsets(int64_t linear, int64_t* off) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t q = linear / shape[d];
      const int64_t r = linear - q * shape[d];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += r * strides[k][d];
      linear = q;
    }
  }
  bool contiguous() const {
    if (ndim != 1) return false;
    for (int k = 0; k < N; ++k) {
      if (strides[k][0] != 1) return false;
    }
    return true;
  }
};

template <int N>
Indexer<N> make_indexer(const std::array<const TensorArg*, N>& ops) {
  Indexer<N> ix;
  const TensorArg& ref = *ops[0];
  for (int d = 0; d < ref.ndim; ++d) {
    if (ref.shape[d] == 1) continue;
    bool merge = ix.ndim > 0;
    for (int k = 0; merge && k < N; ++k) {
      if (ix.strides[k][ix.ndim - 1] != ops[k]->strides[d] * ref.shape[d]) merge = false;
    }
    if (merge) {
      ix.shape[ix.ndim - 1] *= ref.shape[d];
      for (int k = 0; k < N; ++k) ix.strides[k][ix.ndim - 1] = ops[k]->strides[d];
    } else {
      ix.shape[ix.ndim] = ref.shape[d];
      for (int k = 0; k < N; ++k) ix.strides[k][ix.ndim] = ops[k]->strides[d];
      ++ix.ndim;
    }
  }
  if (ix.ndim == 0) {
    ix.shape[0] = 1;
    for (int k = 0; k < N; ++k) ix.strides[k][0] = 1;
    ix.ndim = 1;
  }
  return ix;
}

// ---- device-side argument errors ----------------------------------------------------------
// Kernels record the first bad (position, value) with atomicMin on the position; check()
// copies it back (synchronising the stream) and throws the op's message.
struct DeviceError {
  unsigned long long* pos;  // first bad position, or ~0
  long long* value;
  __device__ __forceinline__ void report(int64_t position, int64_t bad) const {
    const unsigned long long p = static_cast<unsigned long long>(position);
    if (atomicMin(pos, p) > p) *value = bad;  // racy between equal positions only: same value
  }
};

class ErrorFlag {
 public:
  ErrorFlag() : buf_(2 * sizeof(int64_t)) {
    CUDA_CHECK(cudaMemsetAsync(buf_.get(), 0xff, 2 * sizeof(int64_t), stream()));
  }
  DeviceError device() const { return {buf_.as<unsigned long long>(), buf_.as<long long>() + 1}; }
  // Returns true (and the position and value) when a kernel reported an error.
  bool failed(int64_t* position, int64_t* value) const {
    long long host[2];
    CUDA_CHECK(cudaMemcpyAsync(host, buf_.get(), sizeof(host), cudaMemcpyDeviceToHost, stream()));
    CUDA_CHECK(cudaStreamSynchronize(stream()));
    if (static_cast<unsigned long long>(host[0]) == ~0ull) return false;
    *position = host[0];
    *value = host[1];
    return true;
  }

 private:
  memory::cuda::DeviceBuffer buf_;
};

// Registration entry points of the kernel files.
void register_elementwise(Registry& r);
void register_reduce(Registry& r);
void register_matmul(Registry& r);
void register_nn(Registry& r);
void register_index(Registry& r);
void register_attention(Registry& r);
void register_optim(Registry& r);
void register_moe(Registry& r);

}  // namespace mammoth::kernels::cuda
