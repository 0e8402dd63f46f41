// Reductions: the reduced dims are permuted to the end and made contiguous, so the kernels
// only ever reduce the last dim of an [M, R] matrix.
#include <algorithm>
#include <numeric>

#include "engine/ops/common.h"

namespace mammoth::engine {

using kernels::Kernel;

namespace {

struct ReducePlan {
  std::vector<int64_t> perm;  // kept dims first, then reduced dims
  Shape kept_shape;           // result shape without keepdim
  Shape keepdim_shape;        // result shape with reduced dims as 1
  int64_t M = 1, R = 1;
};

ReducePlan plan_reduce(const Tensor& x, const std::vector<int64_t>& dims_in, const char* op) {
  const int64_t nd = x.dim();
  std::vector<bool> reduced(static_cast<size_t>(nd), dims_in.empty());
  for (int64_t d : dims_in) {
    const int64_t n = normalize_dim(d, nd, op);
    MAMMOTH_CHECK(!reduced[n]) << "[" << op << "] dim " << d << " listed twice";
    reduced[n] = true;
  }
  ReducePlan p;
  for (int64_t d = 0; d < nd; ++d) {
    if (!reduced[d]) {
      p.perm.push_back(d);
      p.kept_shape.push_back(x.shape()[d]);
      p.M *= x.shape()[d];
    }
    p.keepdim_shape.push_back(reduced[d] ? 1 : x.shape()[d]);
  }
  for (int64_t d = 0; d < nd; ++d) {
    if (reduced[d]) {
      p.perm.push_back(d);
      p.R *= x.shape()[d];
    }
  }
  return p;
}

Tensor as_rows(const Tensor& x, const ReducePlan& p) {
  return x.permute(p.perm).contiguous().view({p.M, p.R});
}

}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined(x, "sum", "x");
  detail::check_floating("sum", x);
  const ReducePlan p = plan_reduce(x, dims, "sum");
  Tensor y = Tensor::empty({p.M}, x.dtype(), x.device());
  {
    NoGradGuard ng;
    detail::launch(Kernel::sum_last, {as_rows(x, p)}, {y});
  }
  y = y.view(keepdim ? p.keepdim_shape : p.kept_shape);
  if (needs_grad({x})) {
    record("sum", {x}, {&y}, [p, in_shape = x.shape()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].reshape(p.keepdim_shape).expand(in_shape)};
    });
  }
  return y;
}

Tensor sum_squares(const Tensor& x) {
  check_defined(x, "sum_squares", "x");
  detail::check_floating("sum_squares", x);
  Tensor y = Tensor::empty({1}, x.dtype(), x.device());
  {
    NoGradGuard ng;
    detail::launch(Kernel::sum_sq_last, {x.contiguous().view({1, x.numel()})}, {y});
  }
  y = y.view({});
  if (needs_grad({x})) {
    record("sum_squares", {x}, {&y}, [x](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{mul(x, g[0].expand(x.shape())) * 2.0};
    });
  }
  return y;
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  check_defined(x, "mean", "x");
  detail::check_floating("mean", x);
  const ReducePlan p = plan_reduce(x, dims, "mean");
  MAMMOTH_CHECK(p.R > 0) << "[mean] reducing over zero elements of shape " << shape_str(x.shape());
  Tensor y;
  {
    NoGradGuard ng;
    y = mul_scalar(sum(x, dims, keepdim), 1.0 / static_cast<double>(p.R));
  }
  if (needs_grad({x})) {
    record("mean", {x}, {&y}, [p, in_shape = x.shape()](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{mul_scalar(g[0], 1.0 / static_cast<double>(p.R))
                                     .reshape(p.keepdim_shape)
                                     .expand(in_shape)};
    });
  }
  return y;
}

Tensor max(const Tensor& x, int64_t dim, bool keepdim) {
  check_defined(x, "max", "x");
  detail::check_floating("max", x);
  const ReducePlan p = plan_reduce(x, {dim}, "max");
  MAMMOTH_CHECK(p.R > 0) << "[max] reducing over an empty dim of shape " << shape_str(x.shape());
  Tensor values = Tensor::empty({p.M}, x.dtype(), x.device());
  Tensor indices = Tensor::empty({p.M}, DType::kI64, x.device());
  {
    NoGradGuard ng;
    detail::launch(Kernel::max_last, {as_rows(x, p)}, {values, indices});
  }
  Tensor y = values.view(keepdim ? p.keepdim_shape : p.kept_shape);
  if (needs_grad({x})) {
    record("max", {x}, {&y},
           [p, indices, in_shape = x.shape(), dt = x.dtype()](const std::vector<Tensor>& g) {
             // Scatter the gradient to the arg-max of each row, then undo the permutation.
             Tensor rows = Tensor::zeros({p.M, p.R, 1}, dt, g[0].device());
             detail::launch(Kernel::scatter_add,
                            {g[0].contiguous().view({p.M, 1, 1}), indices.view({p.M, 1, 1})},
                            {rows});
             Shape permuted;
             for (int64_t d : p.perm) permuted.push_back(in_shape[d]);
             std::vector<int64_t> inverse(p.perm.size());
             for (size_t i = 0; i < p.perm.size(); ++i)
               inverse[p.perm[i]] = static_cast<int64_t>(i);
             return std::vector<Tensor>{rows.view(permuted).permute(inverse)};
           });
  }
  return y;
}

Tensor sum_to_shape(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  MAMMOTH_CHECK(lead >= 0) << "[sum_to_shape] cannot reduce " << shape_str(x.shape()) << " to "
                           << shape_str(shape);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && x.shape()[d] != 1)) dims.push_back(d);
  }
  if (dims.empty()) return x.reshape(shape);
  return sum(x, dims, true).reshape(shape);
}

}  // namespace mammoth::engine
