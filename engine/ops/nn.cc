// Neural-network ops with fused kernels: softmax family, norms, cross-entropy, dropout,
// rotary embedding and attention.
#include <cmath>

#include "engine/ops/common.h"

namespace mammoth::engine {

using kernels::Kernel;

namespace {

// Runs a last-dim kernel on `dim` by moving it last (a no-op for dim = -1).
template <typename F>
Tensor along_dim(const Tensor& x, int64_t dim, const char* op, F&& f) {
  const int64_t d = normalize_dim(dim, x.dim(), op);
  if (d == x.dim() - 1) return f(x.contiguous());
  return f(x.transpose(d, -1).contiguous()).transpose(d, -1);
}

Tensor softmax_like(const Tensor& x, int64_t dim, const char* name, Kernel fwd, Kernel bwd) {
  check_defined(x, name, "x");
  detail::check_floating(name, x);
  MAMMOTH_CHECK(x.dim() >= 1) << "[" << name << "] needs at least one dim";
  return along_dim(x, dim, name, [&](const Tensor& xc) {
    Tensor y = Tensor::empty(xc.shape(), xc.dtype(), xc.device());
    detail::launch(fwd, {xc}, {y});
    if (needs_grad({xc})) {
      record(name, {xc}, {&y}, [bwd, y = y.detach()](const std::vector<Tensor>& g) {
        Tensor dx = detail::grad_buffer(g[0], y);
        detail::launch(bwd, {g[0].contiguous(), y}, {dx});
        return std::vector<Tensor>{dx};
      });
    }
    return y;
  });
}

void check_norm_weight(const char* op, const char* arg, const Tensor& x, const Tensor& w) {
  check_defined(w, op, arg);
  detail::check_same(op, {x, w});
  MAMMOTH_CHECK(w.dim() == 1 && w.size(0) == x.size(-1))
      << "[" << op << "] " << arg << " of shape " << shape_str(w.shape())
      << " does not match the last dim of input " << shape_str(x.shape());
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_like(x, dim, "softmax", Kernel::softmax, Kernel::softmax_backward);
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_like(x, dim, "log_softmax", Kernel::log_softmax, Kernel::log_softmax_backward);
}

Tensor layer_norm(const Tensor& x_in, const Tensor& w_arg, const Tensor& b_arg, double eps) {
  check_defined(x_in, "layer_norm", "x");
  const Tensor w = detail::widen_weight(w_arg, x_in);
  const Tensor b = detail::widen_weight(b_arg, x_in);
  detail::check_floating("layer_norm", x_in);
  check_norm_weight("layer_norm", "weight", x_in, w);
  check_norm_weight("layer_norm", "bias", x_in, b);
  const Tensor x = x_in.contiguous();
  const int64_t M = x.numel() / std::max<int64_t>(x.size(-1), 1);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mu = Tensor::empty({M}, x.dtype(), x.device());
  Tensor rstd = Tensor::empty({M}, x.dtype(), x.device());
  const kernels::NormParams p{eps};
  detail::launch(Kernel::layer_norm, {x.contiguous(), w.contiguous(), b.contiguous()},
                 {y, mu, rstd}, &p);
  if (needs_grad({x, w, b})) {
    record("layer_norm", {x, w, b}, {&y},
           [x = x.detach(), w = w.detach(), mu, rstd](const std::vector<Tensor>& g) {
             Tensor dx = detail::grad_buffer(g[0], x);
             Tensor dw = Tensor::empty(w.shape(), w.dtype(), w.device());
             Tensor db = Tensor::empty(w.shape(), w.dtype(), w.device());
             detail::launch(Kernel::layer_norm_backward,
                            {g[0].contiguous(), x, w.contiguous(), mu, rstd}, {dx, dw, db});
             return std::vector<Tensor>{dx, dw, db};
           });
  }
  return y;
}

Tensor rms_norm(const Tensor& x_in, const Tensor& w_arg, double eps) {
  check_defined(x_in, "rms_norm", "x");
  const Tensor w = detail::widen_weight(w_arg, x_in);
  detail::check_floating("rms_norm", x_in);
  check_norm_weight("rms_norm", "weight", x_in, w);
  const Tensor x = x_in.contiguous();
  const int64_t M = x.numel() / std::max<int64_t>(x.size(-1), 1);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor rstd = Tensor::empty({M}, x.dtype(), x.device());
  const kernels::NormParams p{eps};
  detail::launch(Kernel::rms_norm, {x, w.contiguous()}, {y, rstd}, &p);
  if (needs_grad({x, w})) {
    record("rms_norm", {x, w}, {&y},
           [x = x.detach(), w = w.detach(), rstd](const std::vector<Tensor>& g) {
             Tensor dx = detail::grad_buffer(g[0], x);
             Tensor dw = Tensor::empty(w.shape(), w.dtype(), w.device());
             detail::launch(Kernel::rms_norm_backward, {g[0].contiguous(), x, w.contiguous(), rstd},
                            {dx, dw});
             return std::vector<Tensor>{dx, dw};
           });
  }
  return y;
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& targets_in,
                     const CrossEntropyOptions& options) {
  check_defined(logits_in, "cross_entropy", "logits");
  check_defined(targets_in, "cross_entropy", "targets");
  detail::check_floating("cross_entropy", logits_in);
  detail::check_dtype("cross_entropy", "targets", targets_in, DType::kI64);
  Shape expect(logits_in.shape().begin(), logits_in.shape().end() - 1);
  MAMMOTH_CHECK(targets_in.shape() == expect)
      << "[cross_entropy] targets of shape " << shape_str(targets_in.shape())
      << " do not match logits " << shape_str(logits_in.shape()) << " (expected "
      << shape_str(expect) << ")";
  MAMMOTH_CHECK(options.label_smoothing >= 0.0 && options.label_smoothing <= 1.0)
      << "[cross_entropy] label_smoothing must be in [0, 1], got " << options.label_smoothing;
  const int64_t V = logits_in.size(-1);
  const Tensor logits = logits_in.contiguous().view({-1, V});
  const Tensor targets = targets_in.contiguous().view({-1});
  const int64_t M = logits.size(0);
  Tensor loss_rows = Tensor::empty({M}, logits.dtype(), logits.device());
  Tensor lse = Tensor::empty({M}, logits.dtype(), logits.device());
  const kernels::CrossEntropyParams p{options.ignore_index, options.label_smoothing};
  detail::launch(Kernel::cross_entropy, {logits, targets}, {loss_rows, lse}, &p);
  int64_t count = 0;
  for (int64_t t : targets.to_int_vector()) count += t != options.ignore_index;
  Tensor loss;
  {
    NoGradGuard ng;
    // PyTorch's mean over zero valid rows is NaN; keep that (0/0) so it is visible.
    loss = mul_scalar(sum(loss_rows), count > 0 ? 1.0 / static_cast<double>(count) : NAN);
  }
  if (needs_grad({logits_in})) {
    record(
        "cross_entropy", {logits_in}, {&loss},
        [logits = logits.detach(), targets, lse, p, count,
         shape = logits_in.shape()](const std::vector<Tensor>& g) {
          const int64_t M = logits.size(0);
          Tensor dloss = mul_scalar(g[0].reshape({1}).expand({M}).contiguous(),
                                    count > 0 ? 1.0 / static_cast<double>(count) : 0.0);
          // Over the saved logits where this node alone holds them (it runs once; the model
          // usually drops its logits): the largest activation of a language model's step.
          const Tensor dx = detail::grad_buffer(logits, logits);
          detail::launch(Kernel::cross_entropy_backward, {dloss, logits, targets, lse}, {dx}, &p);
          return std::vector<Tensor>{dx.view(shape)};
        });
  }
  return loss;
}

Tensor dropout(const Tensor& x_in, double p, uint64_t seed, uint64_t offset, bool training) {
  check_defined(x_in, "dropout", "x");
  MAMMOTH_CHECK(p >= 0.0 && p <= 1.0) << "[dropout] p must be in [0, 1], got " << p;
  if (!training || p == 0.0) return x_in;
  detail::check_floating("dropout", x_in);
  const Tensor x = x_in.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  Tensor mask = Tensor::empty(x.shape(), DType::kU8, x.device());
  const kernels::DropoutParams params{p, seed, offset};
  detail::launch(Kernel::dropout, {x}, {y, mask}, &params);
  if (needs_grad({x})) {
    record("dropout", {x}, {&y}, [mask, p](const std::vector<Tensor>& g) {
      Tensor m = cast(mask, g[0].dtype());
      return std::vector<Tensor>{mul(g[0], mul_scalar(m, p < 1.0 ? 1.0 / (1.0 - p) : 0.0))};
    });
  }
  return y;
}

Tensor rope(const Tensor& x_in, double base, int64_t position_offset, int64_t rotary_dim,
            const Tensor& inv_freq_in) {
  check_defined(x_in, "rope", "x");
  detail::check_floating("rope", x_in);
  MAMMOTH_CHECK(x_in.dim() == 4) << "[rope] expects x of shape [B, T, H, D], got "
                                 << shape_str(x_in.shape());
  const Tensor inv_freq = inv_freq_in.defined() ? inv_freq_in.contiguous() : Tensor();
  MAMMOTH_CHECK(!inv_freq.defined() || (inv_freq.dim() == 1 && inv_freq.dtype() == DType::kF32 &&
                                        inv_freq.device() == x_in.device()))
      << "[rope] inv_freq must be f32 [rotary_dim / 2] on x's device, got "
      << dtype_name(inv_freq.dtype()) << " " << shape_str(inv_freq.shape());
  const Tensor x = x_in.contiguous();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  const kernels::RopeParams p{base, position_offset, rotary_dim, false};
  detail::launch(Kernel::rope, {x, inv_freq}, {y}, &p);
  if (needs_grad({x})) {
    record("rope", {x}, {&y}, [p, inv_freq](const std::vector<Tensor>& g) {
      kernels::RopeParams inv = p;
      inv.inverse = true;
      const Tensor gc = g[0].contiguous();
      Tensor dx = Tensor::empty(gc.shape(), gc.dtype(), gc.device());
      detail::launch(Kernel::rope, {gc, inv_freq}, {dx}, &inv);
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

Tensor attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                 const AttentionOptions& options) {
  check_defined(q_in, "attention", "q");
  check_defined(k_in, "attention", "k");
  check_defined(v_in, "attention", "v");
  detail::check_same("attention", {q_in, k_in, v_in});
  detail::check_floating("attention", q_in);
  MAMMOTH_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4)
      << "[attention] expects q, k, v of shape [B, H, T, D], got " << shape_str(q_in.shape())
      << ", " << shape_str(k_in.shape()) << ", " << shape_str(v_in.shape());
  MAMMOTH_CHECK(k_in.shape() == v_in.shape()) << "[attention] k " << shape_str(k_in.shape())
                                              << " and v " << shape_str(v_in.shape()) << " differ";
  MAMMOTH_CHECK(q_in.size(0) == k_in.size(0) && q_in.size(3) == k_in.size(3))
      << "[attention] q " << shape_str(q_in.shape()) << " and k " << shape_str(k_in.shape())
      << " differ in batch or head dim";
  MAMMOTH_CHECK(k_in.size(1) > 0 && q_in.size(1) % k_in.size(1) == 0)
      << "[attention] query heads " << q_in.size(1) << " must be a multiple of key heads "
      << k_in.size(1);
  const bool has_mask = options.key_mask.defined();
  if (has_mask) {
    detail::check_dtype("attention", "key_mask", options.key_mask, DType::kBool);
    MAMMOTH_CHECK(options.key_mask.shape() == Shape({k_in.size(0), k_in.size(2)}))
        << "[attention] key_mask must be [B, Tk] = " << shape_str({k_in.size(0), k_in.size(2)})
        << ", got " << shape_str(options.key_mask.shape());
  }
  const Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  const Tensor mask = has_mask ? options.key_mask.contiguous() : Tensor();
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());
  Tensor lse = Tensor::empty({q.size(0), q.size(1), q.size(2)}, DType::kF32, q.device());
  MAMMOTH_CHECK(options.window >= 0 && (options.window == 0 || options.causal))
      << "[attention] a sliding window (" << options.window
      << ") needs causal attention and must be positive";
  const kernels::AttentionParams p{options.scale, options.causal, has_mask, options.window};
  detail::launch(Kernel::attention, {q, k, v, mask}, {out, lse}, &p);
  if (needs_grad({q, k, v})) {
    record("attention", {q, k, v}, {&out},
           [q = q.detach(), k = k.detach(), v = v.detach(), o = out.detach(), lse, mask,
            p](const std::vector<Tensor>& g) {
             Tensor dq = Tensor::empty(q.shape(), q.dtype(), q.device());
             Tensor dk = Tensor::empty(k.shape(), k.dtype(), k.device());
             Tensor dv = Tensor::empty(v.shape(), v.dtype(), v.device());
             detail::launch(Kernel::attention_backward, {g[0].contiguous(), q, k, v, o, lse, mask},
                            {dq, dk, dv}, &p);
             return std::vector<Tensor>{dq, dk, dv};
           });
  }
  return out;
}

}  // namespace mammoth::engine
