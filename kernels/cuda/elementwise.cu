// CUDA elementwise kernels: binary and unary maps with broadcasting, activation backwards,
// where, copy/cast between every dtype pair, and fill. Same semantics as
// kernels/cpu/elementwise.cc.
//
// Contiguous operands take a flat grid-stride loop (8 elements per thread, vector loads when
// aligned); anything else goes through Indexer, one div/mod per merged dim.
#include <cmath>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/params.h"

namespace mammoth::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2 = 0.7071067811865476f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kGeluC = 0.044715f;

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float gelu_tanh_f(float x) {
  const float u = kSqrt2OverPi * (x + kGeluC * x * x * x);
  return 0.5f * x * (1.0f + tanhf(u));
}
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float u = kSqrt2OverPi * (x + kGeluC * x * x * x);
  const float t = tanhf(u);
  return 0.5f * (1.0f + t) +
         0.5f * x * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluC * x * x);
}

#define MAMMOTH_BINARY_OP(NAME, EXPR)                                                    \
  struct NAME##_op {                                                                     \
    __device__ __forceinline__ float operator()(float a, float b) const { return EXPR; } \
  };
MAMMOTH_BINARY_OP(add, a + b)
MAMMOTH_BINARY_OP(sub, a - b)
MAMMOTH_BINARY_OP(mul, a* b)
MAMMOTH_BINARY_OP(div, a / b)
MAMMOTH_BINARY_OP(relu_backward, b > 0.0f ? a : 0.0f)
MAMMOTH_BINARY_OP(gelu_backward,
                  a*(0.5f * (1.0f + erff(b * kInvSqrt2)) + b * kInvSqrt2Pi * expf(-0.5f * b * b)))
MAMMOTH_BINARY_OP(gelu_tanh_backward, a* gelu_tanh_grad(b))
MAMMOTH_BINARY_OP(silu_backward, a* sigmoidf(b) * (1.0f + b * (1.0f - sigmoidf(b))))
#undef MAMMOTH_BINARY_OP

#define MAMMOTH_UNARY_OP(NAME, EXPR)                                            \
  struct NAME##_op {                                                            \
    float c = 0.0f;                                                             \
    __device__ __forceinline__ float operator()(float x) const { return EXPR; } \
  };
MAMMOTH_UNARY_OP(neg, -x)
MAMMOTH_UNARY_OP(exp, expf(x))
MAMMOTH_UNARY_OP(log, logf(x))
MAMMOTH_UNARY_OP(sqrt, sqrtf(x))
MAMMOTH_UNARY_OP(rsqrt, 1.0f / sqrtf(x))
MAMMOTH_UNARY_OP(tanh, tanhf(x))
MAMMOTH_UNARY_OP(relu, x > 0.0f ? x : 0.0f)
MAMMOTH_UNARY_OP(gelu, 0.5f * x * (1.0f + erff(x * kInvSqrt2)))
MAMMOTH_UNARY_OP(gelu_tanh, gelu_tanh_f(x))
MAMMOTH_UNARY_OP(silu, x* sigmoidf(x))
MAMMOTH_UNARY_OP(add_scalar, x + c)
MAMMOTH_UNARY_OP(mul_scalar, x* c)
MAMMOTH_UNARY_OP(pow_scalar, powf(x, c))
#undef MAMMOTH_UNARY_OP

// ---- maps ---------------------------------------------------------------------------------
template <typename T, typename Op>
__global__ void binary_contig(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                              int64_t n, Op op) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = from_float<T>(op(to_float(a[i]), to_float(b[i])));
  }
}

template <typename T, typename Op>
__global__ void binary_strided(const T* a, const T* b, T* y, int64_t n, Indexer<3> ix, Op op) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[3];
    ix.offsets(i, off);
    y[off[0]] = from_float<T>(op(to_float(a[off[1]]), to_float(b[off[2]])));
  }
}

template <typename T, typename Op>
__global__ void unary_contig(const T* __restrict__ x, T* __restrict__ y, int64_t n, Op op) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = from_float<T>(op(to_float(x[i])));
  }
}

template <typename T, typename Op>
__global__ void unary_strided(const T* x, T* y, int64_t n, Indexer<2> ix, Op op) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    y[off[0]] = from_float<T>(op(to_float(x[off[1]])));
  }
}

template <typename T, typename Op>
void binary_map(std::span<const TensorArg> in, std::span<const TensorArg> out, Op op) {
  const int64_t n = out[0].numel();
  if (n == 0) return;
  const Indexer<3> ix = make_indexer<3>({&out[0], &in[0], &in[1]});
  const T* a = in[0].ptr<const T>();
  const T* b = in[1].ptr<const T>();
  T* y = out[0].ptr<T>();
  if (ix.contiguous()) {
    binary_contig<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(a, b, y, n, op);
  } else {
    binary_strided<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(a, b, y, n, ix, op);
  }
  CUDA_CHECK_LAUNCH("binary_map");
}

template <typename T, typename Op>
void unary_map(std::span<const TensorArg> in, std::span<const TensorArg> out, Op op) {
  const int64_t n = out[0].numel();
  if (n == 0) return;
  const Indexer<2> ix = make_indexer<2>({&out[0], &in[0]});
  const T* x = in[0].ptr<const T>();
  T* y = out[0].ptr<T>();
  if (ix.contiguous()) {
    unary_contig<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, y, n, op);
  } else {
    unary_strided<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(x, y, n, ix, op);
  }
  CUDA_CHECK_LAUNCH("unary_map");
}

#define MAMMOTH_BINARY(NAME)                                                                       \
  template <typename T>                                                                            \
  void NAME##_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) { \
    binary_map<T>(in, out, NAME##_op{});                                                           \
  }
MAMMOTH_BINARY(add)
MAMMOTH_BINARY(sub)
MAMMOTH_BINARY(mul)
MAMMOTH_BINARY(div)
MAMMOTH_BINARY(relu_backward)
MAMMOTH_BINARY(gelu_backward)
MAMMOTH_BINARY(gelu_tanh_backward)
MAMMOTH_BINARY(silu_backward)
#undef MAMMOTH_BINARY

#define MAMMOTH_UNARY(NAME)                                                                        \
  template <typename T>                                                                            \
  void NAME##_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) { \
    unary_map<T>(in, out, NAME##_op{});                                                            \
  }
MAMMOTH_UNARY(neg)
MAMMOTH_UNARY(exp)
MAMMOTH_UNARY(log)
MAMMOTH_UNARY(sqrt)
MAMMOTH_UNARY(rsqrt)
MAMMOTH_UNARY(tanh)
MAMMOTH_UNARY(relu)
MAMMOTH_UNARY(gelu)
MAMMOTH_UNARY(gelu_tanh)
MAMMOTH_UNARY(silu)
#undef MAMMOTH_UNARY

#define MAMMOTH_SCALAR(NAME)                                                        \
  template <typename T>                                                             \
  void NAME##_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, \
                     const void* params) {                                          \
    NAME##_op op;                                                                   \
    op.c = static_cast<float>(static_cast<const ScalarParams*>(params)->value);     \
    unary_map<T>(in, out, op);                                                      \
  }
MAMMOTH_SCALAR(add_scalar)
MAMMOTH_SCALAR(mul_scalar)
MAMMOTH_SCALAR(pow_scalar)
#undef MAMMOTH_SCALAR

template <typename T>
__global__ void where_strided(const bool* c, const T* a, const T* b, T* y, int64_t n,
                              Indexer<4> ix) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[4];
    ix.offsets(i, off);
    y[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
  }
}

template <typename T>
void where_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  const int64_t n = out[0].numel();
  if (n == 0) return;
  const Indexer<4> ix = make_indexer<4>({&out[0], &in[0], &in[1], &in[2]});
  where_strided<T><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(
      in[0].ptr<const bool>(), in[1].ptr<const T>(), in[2].ptr<const T>(), out[0].ptr<T>(), n, ix);
  CUDA_CHECK_LAUNCH("where");
}

// ---- copy / cast --------------------------------------------------------------------------
// Generic element access by runtime dtype, through double as the CPU kernel does (except that
// float -> bf16/f16 rounds from float, which is what double -> float -> half does too).
__device__ __forceinline__ double load_as_double(const char* base, int64_t off, DType t) {
  switch (t) {
    case DType::kF32:
      return reinterpret_cast<const float*>(base)[off];
    case DType::kF64:
      return reinterpret_cast<const double*>(base)[off];
    case DType::kBF16:
      return __bfloat162float(reinterpret_cast<const bf16_t*>(base)[off]);
    case DType::kF16:
      return __half2float(reinterpret_cast<const f16_t*>(base)[off]);
    case DType::kI32:
      return reinterpret_cast<const int32_t*>(base)[off];
    case DType::kI64:
      return static_cast<double>(reinterpret_cast<const int64_t*>(base)[off]);
    case DType::kU8:
      return reinterpret_cast<const uint8_t*>(base)[off];
    case DType::kBool:
      return reinterpret_cast<const bool*>(base)[off] ? 1.0 : 0.0;
  }
  return 0.0;
}

__device__ __forceinline__ void store_from_double(char* base, int64_t off, DType t, double v) {
  switch (t) {
    case DType::kF32:
      reinterpret_cast<float*>(base)[off] = static_cast<float>(v);
      return;
    case DType::kF64:
      reinterpret_cast<double*>(base)[off] = v;
      return;
    case DType::kBF16:
      reinterpret_cast<bf16_t*>(base)[off] = __float2bfloat16_rn(static_cast<float>(v));
      return;
    case DType::kF16:
      reinterpret_cast<f16_t*>(base)[off] = __float2half_rn(static_cast<float>(v));
      return;
    case DType::kI32:
      reinterpret_cast<int32_t*>(base)[off] = static_cast<int32_t>(v);
      return;
    case DType::kI64:
      reinterpret_cast<int64_t*>(base)[off] = static_cast<int64_t>(v);
      return;
    case DType::kU8:
      reinterpret_cast<uint8_t*>(base)[off] = static_cast<uint8_t>(v);
      return;
    case DType::kBool:
      reinterpret_cast<bool*>(base)[off] = v != 0.0;
      return;
  }
}

__global__ void copy_generic(const char* x, DType xt, char* y, DType yt, int64_t n, Indexer<2> ix) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    store_from_double(y, off[0], yt, load_as_double(x, off[1], xt));
  }
}

// Same dtype: move the bits (exact for int64 and NaN payloads).
template <typename Word>
__global__ void copy_bits(const Word* x, Word* y, int64_t n, Indexer<2> ix) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    y[off[0]] = x[off[1]];
  }
}

// The float casts autocast does all the time.
template <typename Tin, typename Tout>
__global__ void cast_float(const Tin* x, Tout* y, int64_t n, Indexer<2> ix) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[2];
    ix.offsets(i, off);
    y[off[0]] = from_float<Tout>(to_float(x[off[1]]));
  }
}

template <typename Tin>
bool try_cast_float(const TensorArg& x, const TensorArg& y, int64_t n, const Indexer<2>& ix) {
  const unsigned g = grid_for(n, kThreads);
  switch (y.dtype) {
    case DType::kF32:
      cast_float<<<g, kThreads, 0, stream()>>>(x.ptr<const Tin>(), y.ptr<float>(), n, ix);
      return true;
    case DType::kBF16:
      cast_float<<<g, kThreads, 0, stream()>>>(x.ptr<const Tin>(), y.ptr<bf16_t>(), n, ix);
      return true;
    case DType::kF16:
      cast_float<<<g, kThreads, 0, stream()>>>(x.ptr<const Tin>(), y.ptr<f16_t>(), n, ix);
      return true;
    default:
      return false;
  }
}

void copy_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  const TensorArg& x = in[0];
  const TensorArg& y = out[0];
  const int64_t n = y.numel();
  if (n == 0) return;
  const Indexer<2> ix = make_indexer<2>({&y, &x});
  if (x.dtype == y.dtype && ix.contiguous()) {
    CUDA_CHECK(cudaMemcpyAsync(y.data, x.data, static_cast<size_t>(n) * dtype_size(x.dtype),
                               cudaMemcpyDeviceToDevice, stream()));
    return;
  }
  const unsigned g = grid_for(n, kThreads);
  if (x.dtype == y.dtype) {
    switch (dtype_size(x.dtype)) {
      case 1:
        copy_bits<<<g, kThreads, 0, stream()>>>(x.ptr<const uint8_t>(), y.ptr<uint8_t>(), n, ix);
        break;
      case 2:
        copy_bits<<<g, kThreads, 0, stream()>>>(x.ptr<const uint16_t>(), y.ptr<uint16_t>(), n, ix);
        break;
      case 4:
        copy_bits<<<g, kThreads, 0, stream()>>>(x.ptr<const uint32_t>(), y.ptr<uint32_t>(), n, ix);
        break;
      default:
        copy_bits<<<g, kThreads, 0, stream()>>>(x.ptr<const uint64_t>(), y.ptr<uint64_t>(), n, ix);
        break;
    }
    CUDA_CHECK_LAUNCH("copy");
    return;
  }
  bool done = false;
  if (x.dtype == DType::kF32) done = try_cast_float<float>(x, y, n, ix);
  if (x.dtype == DType::kBF16) done = try_cast_float<bf16_t>(x, y, n, ix);
  if (x.dtype == DType::kF16) done = try_cast_float<f16_t>(x, y, n, ix);
  if (!done) {
    copy_generic<<<g, kThreads, 0, stream()>>>(static_cast<const char*>(x.data), x.dtype,
                                               static_cast<char*>(y.data), y.dtype, n, ix);
  }
  CUDA_CHECK_LAUNCH("copy");
}

template <typename Word>
__global__ void fill_bits(Word* y, Word v, int64_t n, Indexer<1> ix) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    int64_t off[1];
    ix.offsets(i, off);
    y[off[0]] = v;
  }
}

void fill_kernel(std::span<const TensorArg>, std::span<const TensorArg> out, const void* params) {
  const double v = static_cast<const ScalarParams*>(params)->value;
  const TensorArg& y = out[0];
  const int64_t n = y.numel();
  if (n == 0) return;
  // The value's bit pattern, converted on the host exactly as the CPU kernel converts it.
  uint64_t bits = 0;
  switch (y.dtype) {
    case DType::kF32: {
      const float f = static_cast<float>(v);
      std::memcpy(&bits, &f, 4);
      break;
    }
    case DType::kF64:
      std::memcpy(&bits, &v, 8);
      break;
    case DType::kBF16:
      bits = float_to_bf16(static_cast<float>(v)).bits;
      break;
    case DType::kF16:
      bits = float_to_f16(static_cast<float>(v)).bits;
      break;
    case DType::kI32: {
      const int32_t i = static_cast<int32_t>(v);
      std::memcpy(&bits, &i, 4);
      break;
    }
    case DType::kI64: {
      const int64_t i = static_cast<int64_t>(v);
      std::memcpy(&bits, &i, 8);
      break;
    }
    case DType::kU8:
      bits = static_cast<uint8_t>(v);
      break;
    case DType::kBool:
      bits = v != 0.0 ? 1 : 0;
      break;
  }
  const Indexer<1> ix = make_indexer<1>({&y});
  const unsigned g = grid_for(n, kThreads);
  switch (dtype_size(y.dtype)) {
    case 1:
      fill_bits<<<g, kThreads, 0, stream()>>>(y.ptr<uint8_t>(), static_cast<uint8_t>(bits), n, ix);
      break;
    case 2:
      fill_bits<<<g, kThreads, 0, stream()>>>(y.ptr<uint16_t>(), static_cast<uint16_t>(bits), n,
                                              ix);
      break;
    case 4:
      fill_bits<<<g, kThreads, 0, stream()>>>(y.ptr<uint32_t>(), static_cast<uint32_t>(bits), n,
                                              ix);
      break;
    default:
      fill_bits<<<g, kThreads, 0, stream()>>>(y.ptr<uint64_t>(), bits, n, ix);
      break;
  }
  CUDA_CHECK_LAUNCH("fill");
}

}  // namespace

void register_elementwise(Registry& r) {
  for (DType t : kAllDTypes) {
    r.add(Kernel::copy, DeviceType::kCUDA, t, copy_kernel);
    r.add(Kernel::fill, DeviceType::kCUDA, t, fill_kernel);
  }
  MAMMOTH_CUDA_REG3(r, add, add_kernel);
  MAMMOTH_CUDA_REG3(r, sub, sub_kernel);
  MAMMOTH_CUDA_REG3(r, mul, mul_kernel);
  MAMMOTH_CUDA_REG3(r, div, div_kernel);
  MAMMOTH_CUDA_REG3(r, where, where_kernel);
  MAMMOTH_CUDA_REG3(r, neg, neg_kernel);
  MAMMOTH_CUDA_REG3(r, exp, exp_kernel);
  MAMMOTH_CUDA_REG3(r, log, log_kernel);
  MAMMOTH_CUDA_REG3(r, sqrt, sqrt_kernel);
  MAMMOTH_CUDA_REG3(r, rsqrt, rsqrt_kernel);
  MAMMOTH_CUDA_REG3(r, tanh, tanh_kernel);
  MAMMOTH_CUDA_REG3(r, relu, relu_kernel);
  MAMMOTH_CUDA_REG3(r, gelu, gelu_kernel);
  MAMMOTH_CUDA_REG3(r, gelu_tanh, gelu_tanh_kernel);
  MAMMOTH_CUDA_REG3(r, silu, silu_kernel);
  MAMMOTH_CUDA_REG3(r, add_scalar, add_scalar_kernel);
  MAMMOTH_CUDA_REG3(r, mul_scalar, mul_scalar_kernel);
  MAMMOTH_CUDA_REG3(r, pow_scalar, pow_scalar_kernel);
  MAMMOTH_CUDA_REG3(r, relu_backward, relu_backward_kernel);
  MAMMOTH_CUDA_REG3(r, gelu_backward, gelu_backward_kernel);
  MAMMOTH_CUDA_REG3(r, gelu_tanh_backward, gelu_tanh_backward_kernel);
  MAMMOTH_CUDA_REG3(r, silu_backward, silu_backward_kernel);
}

}  // namespace mammoth::kernels::cuda
