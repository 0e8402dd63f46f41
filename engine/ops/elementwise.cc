// Elementwise ops: binary maps with broadcasting, unary maps, scalar maps, where, cast.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/ops/common.h"

namespace mammoth::engine {

using kernels::Kernel;

namespace detail {

void check_same(const char* op, std::initializer_list<Tensor> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    MAMMOTH_CHECK(t.defined()) << "[" << op << "] an argument is an undefined tensor";
    if (first == nullptr) {
      first = &t;
      continue;
    }
    MAMMOTH_CHECK(t.dtype() == first->dtype())
        << "[" << op << "] dtype mismatch: " << dtype_name(first->dtype()) << " vs "
        << dtype_name(t.dtype());
    MAMMOTH_CHECK(t.device() == first->device())
        << "[" << op << "] device mismatch: " << first->device() << " vs " << t.device();
  }
}

void check_floating(const char* op, const Tensor& t) {
  MAMMOTH_CHECK(is_floating(t.dtype()))
      << "[" << op << "] needs a floating-point tensor, got " << dtype_name(t.dtype());
}

void check_dtype(const char* op, const char* arg, const Tensor& t, DType expected) {
  MAMMOTH_CHECK(t.dtype() == expected) << "[" << op << "] " << arg << " must be "
                                       << dtype_name(expected) << ", got " << dtype_name(t.dtype());
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    MAMMOTH_CHECK(da == db || da == 1 || db == 1)
        << "[" << op << "] shapes " << shape_str(a) << " and " << shape_str(b)
        << " cannot be broadcast together";
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

// Appends printf-style text to a fixed buffer; `full` once something did not fit.
struct ArgWriter {
  char* out;
  size_t cap;
  size_t n = 0;
  bool full = false;
  template <typename... A>
  void put(const char* fmt, A... a) {
    if (full) return;
    const int w = std::snprintf(out + n, cap - n, fmt, a...);
    if (w < 0 || static_cast<size_t>(w) >= cap - n) {
      full = true;
      out[n] = '\0';  // the cut member is dropped whole
      return;
    }
    n += static_cast<size_t>(w);
  }
  void shape(const char* key, const kernels::TensorArg& t) {
    const size_t mark = n;
    put(",\"%s\":[", key);
    for (int d = 0; d < t.ndim; ++d) put(d ? ",%lld" : "%lld", static_cast<long long>(t.shape[d]));
    put("%s", "]");
    if (full) out[n = mark] = '\0';
  }
};

}  // namespace

namespace {

// Query-key pairs attention computes: Tq x Tk, less what the causal mask and window hide (the key
// mask is data, left in).
double visible_pairs(int64_t tq, int64_t tk, const kernels::AttentionParams& p) {
  double pairs = 0;
  for (int64_t i = 0; i < tq; ++i) {
    const kernels::KeyRange keys = kernels::visible_keys(p.causal, p.window, i, tq, tk);
    pairs += static_cast<double>(keys.end - keys.begin);
  }
  return pairs;
}

}  // namespace

void describe_launch(kernels::Kernel kernel, const Tensor& key,
                     const std::vector<kernels::TensorArg>& in,
                     const std::vector<kernels::TensorArg>& out, const void* params, char* args) {
  int64_t bytes = 0;
  for (const auto* list : {&in, &out})
    for (const kernels::TensorArg& t : *list)
      if (t.data) bytes += t.numel() * static_cast<int64_t>(dtype_size(t.dtype));
  ArgWriter w{args, profile::Scope::kArgs};
  w.put("\"dtype\":\"%s\",\"device\":\"%s\",\"bytes\":%lld", dtype_name(key.dtype()),
        key.device().is_cpu() ? "cpu" : "cuda", static_cast<long long>(bytes));
  double flops = 0;
  using kernels::Kernel;
  if ((kernel == Kernel::matmul || kernel == Kernel::grouped_matmul) && !in.empty() &&
      !out.empty() && in[0].ndim > 0) {
    flops = 2.0 * static_cast<double>(out[0].numel()) *
            static_cast<double>(in[0].shape[in[0].ndim - 1]);
  } else if (kernel == Kernel::grouped_matmul_backward && in.size() > 1 && in[1].ndim > 0) {
    flops = 4.0 * static_cast<double>(in[0].numel()) *  // dx and every dw: 2 M N K each
            static_cast<double>(in[1].shape[in[1].ndim - 1]);
  } else if ((kernel == Kernel::attention || kernel == Kernel::attention_backward) &&
             params != nullptr) {
    // q [B, Hq, Tq, D] and k [B, Hk, Tk, D]; the backward's inputs start with dout.
    const size_t q = kernel == Kernel::attention ? 0 : 1;
    if (in.size() > q + 1 && in[q].ndim == 4 && in[q + 1].ndim == 4) {
      const auto& p = *static_cast<const kernels::AttentionParams*>(params);
      const double heads = static_cast<double>(in[q].shape[0] * in[q].shape[1]);
      const double per_pair = 2.0 * static_cast<double>(in[q].shape[3]);  // one D-long dot
      // Forward: Q K^T and P V; backward: Q K^T again, dO V^T, P^T dO, dS K and dS^T Q.
      const double products = kernel == Kernel::attention ? 2.0 : 5.0;
      flops = products * per_pair * heads * visible_pairs(in[q].shape[2], in[q + 1].shape[2], p);
    }
  }
  if (flops > 0) w.put(",\"flops\":%.0f", flops);
  if (profile::t_backward) w.put("%s", ",\"backward\":true");
  thread_local const char* last_module = nullptr;
  for (const kernels::TensorArg& t : in) {
    const char* m = t.data ? profile::param_module(t.data) : nullptr;
    if (m != nullptr) {
      last_module = m;
      break;
    }
  }
  if (last_module != nullptr) w.put(",\"module\":\"%s\"", last_module);
  if (!in.empty() && in[0].data) w.shape("in", in[0]);
  if (!out.empty()) w.shape("out", out[0]);
}

}  // namespace detail

namespace {

Tensor binary(Kernel kernel, const char* name, const Tensor& a, const Tensor& b) {
  detail::check_same(name, {a, b});
  detail::check_floating(name, a);
  const Shape shape = detail::broadcast_shapes(name, a.shape(), b.shape());
  Tensor y = Tensor::empty(shape, a.dtype(), a.device());
  {
    NoGradGuard ng;
    detail::launch(kernel, {a.expand(shape), b.expand(shape)}, {y});
  }
  return y;
}

Tensor unary(Kernel kernel, const Tensor& x, const void* params = nullptr) {
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  detail::launch(kernel, {x}, {y}, params);
  return y;
}

// For ops whose backward is dy * f'(x) computed by a dedicated kernel.
Tensor activation(Kernel fwd, Kernel bwd, const char* name, const Tensor& x) {
  check_defined(x, name, "x");
  detail::check_floating(name, x);
  Tensor y = unary(fwd, x);
  if (needs_grad({x})) {
    record(name, {x}, {&y}, [bwd, x = x.detach()](const std::vector<Tensor>& g) {
      Tensor dx = detail::grad_buffer(g[0], x);
      detail::launch(bwd, {g[0].expand(x.shape()), x}, {dx});
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor y = binary(Kernel::add, "add", a, b);
  if (needs_grad({a, b})) {
    record("add", {a, b}, {&y}, [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{sum_to_shape(g[0], sa), sum_to_shape(g[0], sb)};
    });
  }
  return y;
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor y = binary(Kernel::sub, "sub", a, b);
  if (needs_grad({a, b})) {
    record("sub", {a, b}, {&y}, [sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{sum_to_shape(g[0], sa), sum_to_shape(neg(g[0]), sb)};
    });
  }
  return y;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor y = binary(Kernel::mul, "mul", a, b);
  if (needs_grad({a, b})) {
    const bool ga = a.requires_grad(), gb = b.requires_grad();
    record("mul", {a, b}, {&y},
           [a = a.detach(), b = b.detach(), ga, gb](const std::vector<Tensor>& g) {
             return std::vector<Tensor>{ga ? sum_to_shape(mul(g[0], b), a.shape()) : Tensor(),
                                        gb ? sum_to_shape(mul(g[0], a), b.shape()) : Tensor()};
           });
  }
  return y;
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor y = binary(Kernel::div, "div", a, b);
  if (needs_grad({a, b})) {
    const bool gb = b.requires_grad();
    record("div", {a, b}, {&y}, [a = a.detach(), b = b.detach(), gb](const std::vector<Tensor>& g) {
      Tensor ga = div(g[0], b);
      Tensor gbv = gb ? sum_to_shape(neg(mul(ga, div(a, b))), b.shape()) : Tensor();
      return std::vector<Tensor>{sum_to_shape(ga, a.shape()), gbv};
    });
  }
  return y;
}

Tensor neg(const Tensor& x) {
  check_defined(x, "neg", "x");
  Tensor y = unary(Kernel::neg, x);
  if (needs_grad({x})) {
    record("neg", {x}, {&y},
           [](const std::vector<Tensor>& g) { return std::vector<Tensor>{neg(g[0])}; });
  }
  return y;
}

// Ops whose derivative is cheapest from the output y.
Tensor exp(const Tensor& x) {
  check_defined(x, "exp", "x");
  Tensor y = unary(Kernel::exp, x);
  if (needs_grad({x})) {
    record("exp", {x}, {&y}, [y = y.detach()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{mul(g[0], y)};
    });
  }
  return y;
}

Tensor log(const Tensor& x) {
  check_defined(x, "log", "x");
  Tensor y = unary(Kernel::log, x);
  if (needs_grad({x})) {
    record("log", {x}, {&y}, [x = x.detach()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{div(g[0], x)};
    });
  }
  return y;
}

Tensor sqrt(const Tensor& x) {
  check_defined(x, "sqrt", "x");
  Tensor y = unary(Kernel::sqrt, x);
  if (needs_grad({x})) {
    record("sqrt", {x}, {&y}, [y = y.detach()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{div(mul_scalar(g[0], 0.5), y)};
    });
  }
  return y;
}

Tensor rsqrt(const Tensor& x) {
  check_defined(x, "rsqrt", "x");
  Tensor y = unary(Kernel::rsqrt, x);
  if (needs_grad({x})) {
    record("rsqrt", {x}, {&y}, [y = y.detach()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{mul(mul_scalar(g[0], -0.5), pow_scalar(y, 3.0))};
    });
  }
  return y;
}

Tensor tanh(const Tensor& x) {
  check_defined(x, "tanh", "x");
  Tensor y = unary(Kernel::tanh, x);
  if (needs_grad({x})) {
    record("tanh", {x}, {&y}, [y = y.detach()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{mul(g[0], add_scalar(neg(mul(y, y)), 1.0))};
    });
  }
  return y;
}

Tensor relu(const Tensor& x) { return activation(Kernel::relu, Kernel::relu_backward, "relu", x); }
Tensor gelu(const Tensor& x) { return activation(Kernel::gelu, Kernel::gelu_backward, "gelu", x); }
Tensor gelu_tanh(const Tensor& x) {
  return activation(Kernel::gelu_tanh, Kernel::gelu_tanh_backward, "gelu_tanh", x);
}
Tensor silu(const Tensor& x) { return activation(Kernel::silu, Kernel::silu_backward, "silu", x); }

Tensor add_scalar(const Tensor& x, double c) {
  check_defined(x, "add_scalar", "x");
  const kernels::ScalarParams p{c};
  Tensor y = unary(Kernel::add_scalar, x, &p);
  if (needs_grad({x})) {
    record("add_scalar", {x}, {&y},
           [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  }
  return y;
}

Tensor mul_scalar(const Tensor& x, double c) {
  check_defined(x, "mul_scalar", "x");
  const kernels::ScalarParams p{c};
  Tensor y = unary(Kernel::mul_scalar, x, &p);
  if (needs_grad({x})) {
    record("mul_scalar", {x}, {&y},
           [c](const std::vector<Tensor>& g) { return std::vector<Tensor>{mul_scalar(g[0], c)}; });
  }
  return y;
}

Tensor pow_scalar(const Tensor& x, double e) {
  check_defined(x, "pow_scalar", "x");
  const kernels::ScalarParams p{e};
  Tensor y = unary(Kernel::pow_scalar, x, &p);
  if (needs_grad({x})) {
    record("pow_scalar", {x}, {&y}, [x = x.detach(), e](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{mul(g[0], mul_scalar(pow_scalar(x, e - 1.0), e))};
    });
  }
  return y;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined(cond, "where", "cond");
  detail::check_dtype("where", "cond", cond, DType::kBool);
  detail::check_same("where", {a, b});
  MAMMOTH_CHECK(cond.device() == a.device())
      << "[where] cond is on " << cond.device() << " but values are on " << a.device();
  const Shape shape = detail::broadcast_shapes(
      "where", cond.shape(), detail::broadcast_shapes("where", a.shape(), b.shape()));
  Tensor y = Tensor::empty(shape, a.dtype(), a.device());
  {
    NoGradGuard ng;
    detail::launch_for(a, Kernel::where, {cond.expand(shape), a.expand(shape), b.expand(shape)},
                       {y});
  }
  if (needs_grad({a, b})) {
    record("where", {a, b}, {&y},
           [c = cond.detach(), sa = a.shape(), sb = b.shape()](const std::vector<Tensor>& g) {
             Tensor zero = Tensor::zeros({}, g[0].dtype(), g[0].device());
             return std::vector<Tensor>{sum_to_shape(where(c, g[0], zero), sa),
                                        sum_to_shape(where(c, zero, g[0]), sb)};
           });
  }
  return y;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  check_defined(x, "masked_fill", "x");
  check_defined(mask, "masked_fill", "mask");
  detail::check_dtype("masked_fill", "mask", mask, DType::kBool);
  Tensor fill = Tensor::full({}, value, x.dtype(), x.device());
  const Shape shape = detail::broadcast_shapes("masked_fill", x.shape(), mask.shape());
  Tensor y = Tensor::empty(shape, x.dtype(), x.device());
  {
    NoGradGuard ng;
    detail::launch_for(x, Kernel::where, {mask.expand(shape), fill.expand(shape), x.expand(shape)},
                       {y});
  }
  if (needs_grad({x})) {
    record("masked_fill", {x}, {&y},
           [m = mask.detach(), sx = x.shape()](const std::vector<Tensor>& g) {
             Tensor zero = Tensor::zeros({}, g[0].dtype(), g[0].device());
             return std::vector<Tensor>{sum_to_shape(where(m, zero, g[0]), sx)};
           });
  }
  return y;
}

Tensor cast(const Tensor& x, DType dtype) {
  check_defined(x, "cast", "x");
  if (x.dtype() == dtype) return x;
  Tensor y = Tensor::empty(x.shape(), dtype, x.device());
  detail::make_resident(x, false);
  kernels::launch(Kernel::copy, x.device().type, dtype, std::vector{x.arg()}, std::vector{y.arg()},
                  nullptr);
  if (needs_grad({x}) && is_floating(dtype)) {
    record("cast", {x}, {&y}, [from = x.dtype()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{cast(g[0], from)};
    });
  }
  return y;
}

void copy_(const Tensor& dst, const Tensor& src) {
  check_defined(dst, "copy_", "dst");
  check_defined(src, "copy_", "src");
  MAMMOTH_CHECK(dst.device() == src.device())
      << "[copy_] cross-device copy " << src.device() << " -> " << dst.device()
      << " goes through to_device()";
  NoGradGuard ng;
  const Tensor s = src.expand(dst.shape());
  detail::make_resident(s, false);
  detail::make_resident(dst, true);
  kernels::launch(Kernel::copy, dst.device().type, dst.dtype(), std::vector{s.arg()},
                  std::vector{dst.arg()}, nullptr);
}

void fill_(const Tensor& dst, double value) {
  check_defined(dst, "fill_", "dst");
  const kernels::ScalarParams p{value};
  detail::make_resident(dst, true);
  kernels::launch(Kernel::fill, dst.device().type, dst.dtype(), {}, std::vector{dst.arg()}, &p);
}

double max_abs(const Tensor& x) {
  double m = 0;
  for (double v : x.to_vector()) m = std::max(m, std::fabs(v));
  return m;
}

bool all_finite(const Tensor& x) {
  for (double v : x.to_vector()) {
    if (!std::isfinite(v)) return false;
  }
  return true;
}

}  // namespace mammoth::engine
