// CPU elementwise kernels: binary and unary maps, activation backwards, where, copy/cast, fill.
//
// Every map goes through StridedLoop, so broadcasting and non-contiguous inputs cost nothing
// extra to support; the all-contiguous case is a flat loop that the compiler vectorises. f32
// GELU (both forms) and SiLU runs of unit stride go to the vectorised kernels of fast.h
// instead, since the compiler cannot vectorise libm's erf/tanh/exp.
#include <cmath>
#include <type_traits>

#include "base/error.h"
#include "kernels/cpu/fast.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/register.h"
#include "kernels/params.h"

namespace mammoth::kernels::cpu {
namespace {

template <typename T, typename Op>
void binary_map(std::span<const TensorArg> in, std::span<const TensorArg> out, Op op) {
  const T* a = in[0].ptr<const T>();
  const T* b = in[1].ptr<const T>();
  T* y = out[0].ptr<T>();
  StridedLoop<3> loop({&out[0], &in[0], &in[1]});
  loop.run([&](int64_t n, const std::array<int64_t, 3>& o, const std::array<int64_t, 3>& s) {
    T* yp = y + o[0];
    const T* ap = a + o[1];
    const T* bp = b + o[2];
    if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
      for (int64_t i = 0; i < n; ++i) yp[i] = op(ap[i], bp[i]);
    } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {
      const T bv = *bp;
      for (int64_t i = 0; i < n; ++i) yp[i] = op(ap[i], bv);
    } else {
      for (int64_t i = 0; i < n; ++i) yp[i * s[0]] = op(ap[i * s[1]], bp[i * s[2]]);
    }
  });
}

template <typename T, typename Op>
void unary_map(std::span<const TensorArg> in, std::span<const TensorArg> out, Op op) {
  const T* x = in[0].ptr<const T>();
  T* y = out[0].ptr<T>();
  StridedLoop<2> loop({&out[0], &in[0]});
  loop.run([&](int64_t n, const std::array<int64_t, 2>& o, const std::array<int64_t, 2>& s) {
    T* yp = y + o[0];
    const T* xp = x + o[1];
    if (s[0] == 1 && s[1] == 1) {
      for (int64_t i = 0; i < n; ++i) yp[i] = op(xp[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) yp[i * s[0]] = op(xp[i * s[1]]);
    }
  });
}

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;
constexpr double kGeluC = 0.044715;

template <typename T>
T gelu_tanh_f(T x) {
  const T u = T(kSqrt2OverPi) * (x + T(kGeluC) * x * x * x);
  return T(0.5) * x * (T(1) + std::tanh(u));
}
template <typename T>
T gelu_tanh_grad(T x) {
  const T u = T(kSqrt2OverPi) * (x + T(kGeluC) * x * x * x);
  const T t = std::tanh(u);
  return T(0.5) * (T(1) + t) +
         T(0.5) * x * (T(1) - t * t) * T(kSqrt2OverPi) * (T(1) + T(3 * kGeluC) * x * x);
}
template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

#define MAMMOTH_BINARY(NAME, EXPR)                                                                 \
  template <typename T>                                                                            \
  void NAME##_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) { \
    binary_map<T>(in, out, [](T a, T b) { return EXPR; });                                         \
  }
MAMMOTH_BINARY(add, a + b)
MAMMOTH_BINARY(sub, a - b)
MAMMOTH_BINARY(mul, a* b)
MAMMOTH_BINARY(div, a / b)
MAMMOTH_BINARY(relu_backward, b > T(0) ? a : T(0))
#undef MAMMOTH_BINARY

#define MAMMOTH_UNARY(NAME, EXPR)                                                                  \
  template <typename T>                                                                            \
  void NAME##_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) { \
    unary_map<T>(in, out, [](T x) { return EXPR; });                                               \
  }
MAMMOTH_UNARY(neg, -x)
MAMMOTH_UNARY(log, std::log(x))
MAMMOTH_UNARY(sqrt, std::sqrt(x))
MAMMOTH_UNARY(rsqrt, T(1) / std::sqrt(x))
MAMMOTH_UNARY(tanh, std::tanh(x))
MAMMOTH_UNARY(relu, x > T(0) ? x : T(0))
#undef MAMMOTH_UNARY

// Unary map whose unit-stride f32 runs go to a vectorised kernel of fast.h.
template <typename T, typename Op>
void unary_map_fast(std::span<const TensorArg> in, std::span<const TensorArg> out, Op op,
                    void (*FastKernels::*fast)(const float*, float*, int64_t, bool)) {
  if constexpr (std::is_same_v<T, float>) {
    const float* x = in[0].ptr<const float>();
    float* y = out[0].ptr<float>();
    const auto run = fast_kernels().*fast;
    const bool stream = stream_output(out[0].numel() * 4);
    StridedLoop<2> loop({&out[0], &in[0]});
    loop.run([&](int64_t n, const std::array<int64_t, 2>& o, const std::array<int64_t, 2>& s) {
      if (s[0] == 1 && s[1] == 1) return run(x + o[1], y + o[0], n, stream);
      for (int64_t i = 0; i < n; ++i) y[o[0] + i * s[0]] = op(x[o[1] + i * s[1]]);
    });
  } else {
    unary_map<T>(in, out, op);
  }
}

// Activation backward (dy, x) -> dx, likewise.
template <typename T, typename Op>
void backward_map_fast(std::span<const TensorArg> in, std::span<const TensorArg> out, Op op,
                       void (*FastKernels::*fast)(const float*, const float*, float*, int64_t,
                                                  bool)) {
  if constexpr (std::is_same_v<T, float>) {
    const float* dy = in[0].ptr<const float>();
    const float* x = in[1].ptr<const float>();
    float* dx = out[0].ptr<float>();
    const auto run = fast_kernels().*fast;
    // dx written over dy (kernels/op_list.h) stores plainly: its lines were just read.
    const bool stream = stream_output(out[0].numel() * 4) && dx != dy;
    StridedLoop<3> loop({&out[0], &in[0], &in[1]});
    loop.run([&](int64_t n, const std::array<int64_t, 3>& o, const std::array<int64_t, 3>& s) {
      if (s[0] == 1 && s[1] == 1 && s[2] == 1)
        return run(dy + o[1], x + o[2], dx + o[0], n, stream);
      for (int64_t i = 0; i < n; ++i)
        dx[o[0] + i * s[0]] = op(dy[o[1] + i * s[1]], x[o[2] + i * s[2]]);
    });
  } else {
    binary_map<T>(in, out, op);
  }
}

#define MAMMOTH_FAST_UNARY(NAME, EXPR)                                                             \
  template <typename T>                                                                            \
  void NAME##_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) { \
    unary_map_fast<T>(                                                                             \
        in, out, [](T x) { return EXPR; }, &FastKernels::NAME);                                    \
  }
MAMMOTH_FAST_UNARY(gelu, T(0.5) * x * (T(1) + std::erf(x * T(kInvSqrt2))))
MAMMOTH_FAST_UNARY(gelu_tanh, gelu_tanh_f(x))
MAMMOTH_FAST_UNARY(silu, x* sigmoid(x))
#undef MAMMOTH_FAST_UNARY

// e^x: unit-stride f32 runs through the vector exp of fast.h (within 3 x 2^-24 relative of
// e^x over the whole float range, inf, 0 and NaN as libm gives them; fast_kernels_test), which
// is several times libm's scalar std::exp; softmax-like ops written from exp (ring attention's
// blocks, vocab-parallel cross-entropy) spend most of their time here. Not unary_map_fast: the
// vector exp's flag says its arguments are <= 0, not to stream the output.
template <typename T>
void exp_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  if constexpr (std::is_same_v<T, float>) {
    const float* x = in[0].ptr<const float>();
    float* y = out[0].ptr<float>();
    const auto vector_exp = fast_kernels().exp;
    StridedLoop<2> loop({&out[0], &in[0]});
    loop.run([&](int64_t n, const std::array<int64_t, 2>& o, const std::array<int64_t, 2>& s) {
      if (s[0] == 1 && s[1] == 1) return vector_exp(x + o[1], y + o[0], n, false);
      for (int64_t i = 0; i < n; ++i) y[o[0] + i * s[0]] = std::exp(x[o[1] + i * s[1]]);
    });
  } else {
    unary_map<T>(in, out, [](T x) { return std::exp(x); });
  }
}

#define MAMMOTH_FAST_BACKWARD(NAME, EXPR)                                                          \
  template <typename T>                                                                            \
  void NAME##_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) { \
    backward_map_fast<T>(                                                                          \
        in, out, [](T a, T b) { return EXPR; }, &FastKernels::NAME);                               \
  }
MAMMOTH_FAST_BACKWARD(gelu_backward, a*(T(0.5) * (T(1) + std::erf(b * T(kInvSqrt2))) +
                                        b * T(kInvSqrt2Pi) * std::exp(T(-0.5) * b * b)))
MAMMOTH_FAST_BACKWARD(gelu_tanh_backward, a* gelu_tanh_grad(b))
MAMMOTH_FAST_BACKWARD(silu_backward, a* sigmoid(b) * (T(1) + b * (T(1) - sigmoid(b))))
#undef MAMMOTH_FAST_BACKWARD

#define MAMMOTH_SCALAR(NAME, EXPR)                                                  \
  template <typename T>                                                             \
  void NAME##_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, \
                     const void* params) {                                          \
    const T c = static_cast<T>(static_cast<const ScalarParams*>(params)->value);    \
    unary_map<T>(in, out, [c](T x) { return EXPR; });                               \
  }
MAMMOTH_SCALAR(add_scalar, x + c)
MAMMOTH_SCALAR(mul_scalar, x* c)
MAMMOTH_SCALAR(pow_scalar, std::pow(x, c))
#undef MAMMOTH_SCALAR

template <typename T>
void where_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  const bool* c = in[0].ptr<const bool>();
  const T* a = in[1].ptr<const T>();
  const T* b = in[2].ptr<const T>();
  T* y = out[0].ptr<T>();
  StridedLoop<4> loop({&out[0], &in[0], &in[1], &in[2]});
  loop.run([&](int64_t n, const std::array<int64_t, 4>& o, const std::array<int64_t, 4>& s) {
    for (int64_t i = 0; i < n; ++i) {
      y[o[0] + i * s[0]] = c[o[1] + i * s[1]] ? a[o[2] + i * s[2]] : b[o[3] + i * s[3]];
    }
  });
}

// Conversion through the widest type that holds both ends exactly enough.
template <typename T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return bf16_to_float(v);
  } else if constexpr (std::is_same_v<T, f16>) {
    return f16_to_float(v);
  } else {
    return static_cast<double>(v);
  }
}
template <typename T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, bf16>) {
    return float_to_bf16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, f16>) {
    return float_to_f16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != 0.0;
  } else {
    return static_cast<T>(v);
  }
}

template <typename Tin, typename Tout>
void copy_typed(const TensorArg& x, const TensorArg& y) {
  const Tin* xp = x.ptr<const Tin>();
  Tout* yp = y.ptr<Tout>();
  StridedLoop<2> loop({&y, &x});
  loop.run([&](int64_t n, const std::array<int64_t, 2>& o, const std::array<int64_t, 2>& s) {
    if constexpr (std::is_same_v<Tin, Tout>) {
      if (s[0] == 1 && s[1] == 1) {
        std::copy(xp + o[1], xp + o[1] + n, yp + o[0]);
        return;
      }
      for (int64_t i = 0; i < n; ++i) yp[o[0] + i * s[0]] = xp[o[1] + i * s[1]];
    } else if constexpr (std::is_same_v<Tin, float> && std::is_same_v<Tout, bf16>) {
      for (int64_t i = 0; i < n; ++i) yp[o[0] + i * s[0]] = float_to_bf16(xp[o[1] + i * s[1]]);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        yp[o[0] + i * s[0]] = from_double<Tout>(to_double(xp[o[1] + i * s[1]]));
      }
    }
  });
}

template <typename Tin>
void copy_from(const TensorArg& x, const TensorArg& y) {
  switch (y.dtype) {
    case DType::kF32:
      return copy_typed<Tin, float>(x, y);
    case DType::kF64:
      return copy_typed<Tin, double>(x, y);
    case DType::kBF16:
      return copy_typed<Tin, bf16>(x, y);
    case DType::kF16:
      return copy_typed<Tin, f16>(x, y);
    case DType::kI32:
      return copy_typed<Tin, int32_t>(x, y);
    case DType::kI64:
      return copy_typed<Tin, int64_t>(x, y);
    case DType::kU8:
      return copy_typed<Tin, uint8_t>(x, y);
    case DType::kBool:
      return copy_typed<Tin, bool>(x, y);
  }
}

void copy_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  const TensorArg& x = in[0];
  const TensorArg& y = out[0];
  switch (x.dtype) {
    case DType::kF32:
      return copy_from<float>(x, y);
    case DType::kF64:
      return copy_from<double>(x, y);
    case DType::kBF16:
      return copy_from<bf16>(x, y);
    case DType::kF16:
      return copy_from<f16>(x, y);
    case DType::kI32:
      return copy_from<int32_t>(x, y);
    case DType::kI64:
      return copy_from<int64_t>(x, y);
    case DType::kU8:
      return copy_from<uint8_t>(x, y);
    case DType::kBool:
      return copy_from<bool>(x, y);
  }
}

template <typename T>
void fill_typed(const TensorArg& y, double value) {
  const T v = from_double<T>(value);
  T* yp = y.ptr<T>();
  StridedLoop<1> loop({&y});
  loop.run([&](int64_t n, const std::array<int64_t, 1>& o, const std::array<int64_t, 1>& s) {
    for (int64_t i = 0; i < n; ++i) yp[o[0] + i * s[0]] = v;
  });
}

void fill_kernel(std::span<const TensorArg>, std::span<const TensorArg> out, const void* params) {
  const double v = static_cast<const ScalarParams*>(params)->value;
  const TensorArg& y = out[0];
  switch (y.dtype) {
    case DType::kF32:
      return fill_typed<float>(y, v);
    case DType::kF64:
      return fill_typed<double>(y, v);
    case DType::kBF16:
      return fill_typed<bf16>(y, v);
    case DType::kF16:
      return fill_typed<f16>(y, v);
    case DType::kI32:
      return fill_typed<int32_t>(y, v);
    case DType::kI64:
      return fill_typed<int64_t>(y, v);
    case DType::kU8:
      return fill_typed<uint8_t>(y, v);
    case DType::kBool:
      return fill_typed<bool>(y, v);
  }
}

}  // namespace

void register_elementwise(Registry& r) {
  for (DType t : kAllDTypes) {
    r.add(Kernel::copy, DeviceType::kCPU, t, copy_kernel);
    r.add(Kernel::fill, DeviceType::kCPU, t, fill_kernel);
  }
#define MAMMOTH_REG(NAME) \
  add_float_kernels(r, Kernel::NAME, NAME##_kernel<float>, NAME##_kernel<double>);
  MAMMOTH_REG(add)
  MAMMOTH_REG(sub)
  MAMMOTH_REG(mul)
  MAMMOTH_REG(div)
  MAMMOTH_REG(where)
  MAMMOTH_REG(neg)
  MAMMOTH_REG(exp)
  MAMMOTH_REG(log)
  MAMMOTH_REG(sqrt)
  MAMMOTH_REG(rsqrt)
  MAMMOTH_REG(tanh)
  MAMMOTH_REG(relu)
  MAMMOTH_REG(gelu)
  MAMMOTH_REG(gelu_tanh)
  MAMMOTH_REG(silu)
  MAMMOTH_REG(add_scalar)
  MAMMOTH_REG(mul_scalar)
  MAMMOTH_REG(pow_scalar)
  MAMMOTH_REG(relu_backward)
  MAMMOTH_REG(gelu_backward)
  MAMMOTH_REG(gelu_tanh_backward)
  MAMMOTH_REG(silu_backward)
#undef MAMMOTH_REG
}

}  // namespace mammoth::kernels::cpu
