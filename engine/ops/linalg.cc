// matmul and linear. Batch dims broadcast; transposed views reach the kernel without a copy
// because the kernel reads transposes from strides.
#include "engine/autocast.h"
#include "engine/ops/common.h"

namespace mammoth::engine {

using kernels::Kernel;

namespace {

// A view of t ([batch..., R, C], batch broadcast to `batch`) as [Bt, R, C] for the kernel,
// copying only when the batch dims cannot be merged into one stride or no unit stride exists.
Tensor as_batched(const Tensor& t, const Shape& batch) {
  Shape full = batch;
  full.push_back(t.size(-2));
  full.push_back(t.size(-1));
  const Tensor e = t.expand(full);
  const int64_t nb = static_cast<int64_t>(batch.size());
  const int64_t rs = e.strides()[nb], cs = e.strides()[nb + 1];
  const bool unit = cs == 1 || rs == 1 || e.size(-1) == 1 || e.size(-2) == 1;
  // The batch dims merge when their strides are all 0 (broadcast) or form one row-major run.
  bool mergeable = true, all_zero = true;
  int64_t bstride = 0, expected = -1;
  for (int64_t d = nb - 1; d >= 0; --d) {
    if (e.shape()[d] == 1) continue;
    if (e.strides()[d] != 0) all_zero = false;
    if (expected < 0) {
      bstride = e.strides()[d];
      expected = bstride * e.shape()[d];
    } else if (e.strides()[d] == expected) {
      expected *= e.shape()[d];
    } else {
      mergeable = false;
    }
  }
  const Shape shape3 = {shape_numel(batch), t.size(-2), t.size(-1)};
  if (!unit || !(mergeable || all_zero)) return e.contiguous().view(shape3);
  return e.as_strided(shape3, {all_zero ? 0 : bstride, rs, cs}, e.offset());
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_defined(a, "matmul", "a");
  check_defined(b, "matmul", "b");
  detail::check_same("matmul", {a, b});
  detail::check_floating("matmul", a);
  MAMMOTH_CHECK(a.dim() >= 2 && b.dim() >= 2)
      << "[matmul] needs at least 2-d operands, got " << shape_str(a.shape()) << " x "
      << shape_str(b.shape());
  MAMMOTH_CHECK(a.size(-1) == b.size(-2))
      << "[matmul] inner dimensions differ: " << shape_str(a.shape()) << " x "
      << shape_str(b.shape());
  // [..., M, K] @ [K, N]: fold the batch into M (one large GEMM instead of many small).
  if (b.dim() == 2 && a.dim() > 2) {
    Shape out_shape(a.shape().begin(), a.shape().end() - 1);
    out_shape.push_back(b.size(1));
    return matmul(a.reshape({-1, a.size(-1)}), b).view(out_shape);
  }
  const Shape batch =
      detail::broadcast_shapes("matmul", Shape(a.shape().begin(), a.shape().end() - 2),
                               Shape(b.shape().begin(), b.shape().end() - 2));
  const int64_t M = a.size(-2), N = b.size(-1);
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor y = Tensor::empty(out_shape, a.dtype(), a.device());
  {
    NoGradGuard ng;
    kernels::MatmulParams p;
    if (a.dtype() == DType::kF32) p.compute = autocast_matmul_compute();
    detail::launch(Kernel::matmul, {as_batched(a, batch), as_batched(b, batch)},
                   {y.view({shape_numel(batch), M, N})}, &p);
  }
  if (needs_grad({a, b})) {
    const bool ga = a.requires_grad(), gb = b.requires_grad();
    record("matmul", {a, b}, {&y},
           [a = a.detach(), b = b.detach(), ga, gb](const std::vector<Tensor>& g) {
             Tensor da, db;
             if (ga) da = sum_to_shape(matmul(g[0], b.transpose(-1, -2)), a.shape());
             if (gb) db = sum_to_shape(matmul(a.transpose(-1, -2), g[0]), b.shape());
             return std::vector<Tensor>{da, db};
           });
  }
  return y;
}

// One GEMM launch: c [M, N] = alpha * op(a) op(b) + beta * c for 2-D views (transposes read
// from strides), with the thread's autocast mode.
void gemm2d(const Tensor& a, const Tensor& b, const Tensor& c, double beta) {
  kernels::MatmulParams p;
  p.beta = beta;
  if (a.dtype() == DType::kF32) p.compute = autocast_matmul_compute();
  const Shape empty;
  detail::launch(Kernel::matmul, {as_batched(a, empty), as_batched(b, empty)},
                 {c.view({1, c.size(0), c.size(1)})}, &p);
}

// y = x W^T + b as its own op, so that every product runs in the layout it is stored in:
//   forward  y [M, out] = b (broadcast rows), then += x [M, in] @ W^T   (W [out, in], NT)
//   backward dx [M, in] = dy @ W (NN);  dW [out, in] = dy^T @ x (TN);  db = dy's column sums
// (sum_rows: a GEMV 1^T dy would pack all of dy for one row of output, and under bf16 autocast
// round dy to bf16 first)
// Composing matmul with a transposed view instead would produce dW transposed and copy it.
Tensor linear(const Tensor& x_in, const Tensor& w_arg, const Tensor& b_arg) {
  check_defined(x_in, "linear", "x");
  check_defined(w_arg, "linear", "weight");
  const Tensor w = detail::widen_weight(w_arg, x_in);
  const Tensor b = detail::widen_weight(b_arg, x_in);
  detail::check_same("linear", {x_in, w});
  detail::check_floating("linear", x_in);
  MAMMOTH_CHECK(w.dim() == 2 && x_in.dim() >= 1 && x_in.size(-1) == w.size(1))
      << "[linear] input features " << shape_str(x_in.shape()) << " do not match weight "
      << shape_str(w.shape()) << " ([out, in])";
  if (b.defined()) {
    detail::check_same("linear", {x_in, b});
    MAMMOTH_CHECK(b.dim() == 1 && b.size(0) == w.size(0))
        << "[linear] bias " << shape_str(b.shape()) << " does not match weight "
        << shape_str(w.shape());
  }
  const int64_t in = w.size(1), out = w.size(0);
  Tensor x;
  {
    NoGradGuard ng;
    x = x_in.reshape({-1, in});
  }
  const int64_t M = x.size(0);
  Shape out_shape = x_in.shape();
  out_shape.back() = out;
  Tensor y = Tensor::empty({M, out}, x.dtype(), x.device());
  {
    NoGradGuard ng;
    if (b.defined()) copy_(y, b.expand({M, out}));
    gemm2d(x, w.transpose(0, 1), y, b.defined() ? 1.0 : 0.0);
  }
  y = y.view(out_shape);
  if (needs_grad({x_in, w, b})) {
    const bool gx = x_in.requires_grad(), gw = w.requires_grad(),
               gb = b.defined() && b.requires_grad();
    // A parameter's weight gradient may be deferred (zero-bubble pipelines, autograd.h).
    const Tensor w_leaf = gw && w.is_leaf() ? w : Tensor();
    record("linear", {x_in, w, b}, {&y},
           [x = x.detach(), w = w.detach(), w_leaf, gx, gw, gb, in_shape = x_in.shape(), M, in,
            out](const std::vector<Tensor>& g) {
             const Tensor dy = g[0].reshape({M, out});
             Tensor dx, dw, db;
             if (gx) {
               dx = Tensor::empty({M, in}, dy.dtype(), dy.device());
               gemm2d(dy, w, dx, 0.0);
               dx = dx.view(in_shape);
             }
             if (gw && w_leaf.defined() && deferred_weight_grads() != nullptr) {
               deferred_weight_grads()->push([dy, x, w_leaf, out, in] {
                 Tensor dw_later = Tensor::empty({out, in}, dy.dtype(), dy.device());
                 gemm2d(dy.transpose(0, 1), x, dw_later, 0.0);
                 accumulate_grad(w_leaf, dw_later);
               });
             } else if (gw) {
               dw = Tensor::empty({out, in}, dy.dtype(), dy.device());
               gemm2d(dy.transpose(0, 1), x, dw, 0.0);
             }
             if (gb) {
               db = Tensor::empty({out}, dy.dtype(), dy.device());
               detail::launch(Kernel::sum_rows, {dy.contiguous()}, {db});
             }
             return std::vector<Tensor>{dx, dw, db};
           });
  }
  return y;
}

}  // namespace mammoth::engine
