// Mixture-of-experts ops: the grouped GEMM over rows sorted by expert, and the weighted
// scatter-add of expert outputs back to their tokens (models/mixtral). The permutation into
// expert order is index_select (its backward, index_add, is the un-permutation of gradients).
#include "engine/ops/common.h"

namespace mammoth::engine {

using kernels::Kernel;

Tensor grouped_matmul(const Tensor& x_in, const std::vector<int64_t>& offsets,
                      const std::vector<Tensor>& weights) {
  check_defined(x_in, "grouped_matmul", "x");
  detail::check_floating("grouped_matmul", x_in);
  MAMMOTH_CHECK(!weights.empty()) << "[grouped_matmul] needs at least one weight";
  MAMMOTH_CHECK(x_in.dim() == 2) << "[grouped_matmul] x must be [M, K], got "
                                 << shape_str(x_in.shape());
  const int64_t E = static_cast<int64_t>(weights.size());
  MAMMOTH_CHECK(static_cast<int64_t>(offsets.size()) == E + 1)
      << "[grouped_matmul] " << E << " weights need " << E + 1 << " offsets, got "
      << offsets.size();
  const int64_t M = x_in.size(0), K = x_in.size(1), N = weights[0].size(0);
  for (int64_t e = 0; e < E; ++e) {
    const Tensor& w = weights[e];
    check_defined(w, "grouped_matmul", "weight");
    detail::check_same("grouped_matmul", {x_in, w});
    MAMMOTH_CHECK(w.dim() == 2 && w.size(0) == N && w.size(1) == K)
        << "[grouped_matmul] weight " << e << " must be [" << N << ", " << K << "], got "
        << shape_str(w.shape());
  }
  MAMMOTH_CHECK(offsets.front() == 0 && offsets.back() == M)
      << "[grouped_matmul] offsets must run from 0 to " << M << ", got " << offsets.front()
      << " .. " << offsets.back();
  const Tensor x = x_in.contiguous();
  std::vector<Tensor> ws;
  for (const Tensor& w : weights) ws.push_back(w.contiguous());
  const Tensor off = Tensor::from_ints(offsets, {E + 1});
  Tensor y = Tensor::empty({M, N}, x.dtype(), x.device());
  std::vector<Tensor> in = {x, off};
  in.insert(in.end(), ws.begin(), ws.end());
  detail::launch_range(x, Kernel::grouped_matmul, in, std::vector<Tensor>{y});
  std::vector<Tensor> inputs = {x_in};
  inputs.insert(inputs.end(), weights.begin(), weights.end());
  if (needs_grad(inputs)) {
    record("grouped_matmul", inputs, {&y}, [x, off, ws](const std::vector<Tensor>& g) {
      std::vector<Tensor> bin = {g[0].contiguous(), x, off};
      bin.insert(bin.end(), ws.begin(), ws.end());
      std::vector<Tensor> grads = {Tensor::empty(x.shape(), x.dtype(), x.device())};
      for (const Tensor& w : ws) grads.push_back(Tensor::empty(w.shape(), w.dtype(), w.device()));
      detail::launch_range(x, Kernel::grouped_matmul_backward, bin, grads);
      return grads;
    });
  }
  return y;
}

Tensor moe_combine(const Tensor& y_in, const Tensor& rows_in, const Tensor& weights_in,
                   int64_t tokens) {
  check_defined(y_in, "moe_combine", "y");
  check_defined(rows_in, "moe_combine", "rows");
  check_defined(weights_in, "moe_combine", "weights");
  detail::check_floating("moe_combine", y_in);
  detail::check_dtype("moe_combine", "rows", rows_in, DType::kI64);
  detail::check_same("moe_combine", {y_in, weights_in});
  MAMMOTH_CHECK(y_in.dim() == 2) << "[moe_combine] y must be [M, C], got "
                                 << shape_str(y_in.shape());
  const int64_t M = y_in.size(0), C = y_in.size(1);
  MAMMOTH_CHECK(rows_in.dim() == 1 && rows_in.size(0) == M && weights_in.dim() == 1 &&
                weights_in.size(0) == M)
      << "[moe_combine] rows " << shape_str(rows_in.shape()) << " and weights "
      << shape_str(weights_in.shape()) << " must be [" << M << "]";
  MAMMOTH_CHECK(tokens >= 0) << "[moe_combine] negative token count " << tokens;
  const Tensor y = y_in.contiguous(), rows = rows_in.contiguous(), w = weights_in.contiguous();
  Tensor out = Tensor::empty({tokens, C}, y.dtype(), y.device());
  detail::launch(Kernel::moe_combine, {y, rows, w}, {out});
  if (needs_grad({y_in, weights_in})) {
    record("moe_combine", {y_in, weights_in}, {&out}, [y, rows, w](const std::vector<Tensor>& g) {
      Tensor dy = Tensor::empty(y.shape(), y.dtype(), y.device());
      Tensor dw = Tensor::empty(w.shape(), w.dtype(), w.device());
      detail::launch(Kernel::moe_combine_backward, {g[0].contiguous(), y, rows, w}, {dy, dw});
      return std::vector<Tensor>{dy, dw};
    });
  }
  return out;
}

}  // namespace mammoth::engine
