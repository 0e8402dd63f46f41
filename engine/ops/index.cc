// Joining, splitting and indexing: concat, split, embedding, index_select, gather.
#include <unordered_map>
#include <vector>

#include "engine/ops/common.h"

namespace mammoth::engine {

using kernels::Kernel;

namespace {

// Sizes of the dims before `dim` (A), at it (R) and after it (C).
struct ARC {
  int64_t A = 1, R = 1, C = 1;
};
ARC arc(const Shape& s, int64_t dim) {
  ARC r;
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    if (d < dim)
      r.A *= s[d];
    else if (d == dim)
      r.R = s[d];
    else
      r.C *= s[d];
  }
  return r;
}

void check_index_tensor(const char* op, const Tensor& index) {
  check_defined(index, op, "index");
  detail::check_dtype(op, "index", index, DType::kI64);
}

// into[0, ids[i]] += rows[0, i], with the rows of a repeated id summed first (in order, from
// zero) and added once: bitwise the sums of index_add into a zero table added to `into`, so a
// gradient is the same whichever way it accumulates (autograd's add_into_leaf_grad or not).
void add_rows_once(const Tensor& rows, const Tensor& ids, const Tensor& into) {
  const int64_t I = ids.numel();
  const auto* id = static_cast<const int64_t*>(ids.raw_data());
  std::unordered_map<int64_t, int64_t> slot;
  std::vector<int64_t> unique, inverse(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    const auto [it, fresh] = slot.try_emplace(id[i], static_cast<int64_t>(unique.size()));
    if (fresh) unique.push_back(id[i]);
    inverse[static_cast<size_t>(i)] = it->second;
  }
  const int64_t U = static_cast<int64_t>(unique.size());
  Tensor summed = Tensor::zeros({1, U, rows.size(2)}, rows.dtype(), rows.device());
  detail::launch(Kernel::index_add, {rows, Tensor::from_ints(inverse, {I})}, {summed});
  detail::launch(Kernel::index_add, {summed, Tensor::from_ints(unique, {U})}, {into});
}

}  // namespace

Tensor concat(const std::vector<Tensor>& tensors, int64_t dim) {
  MAMMOTH_CHECK(!tensors.empty()) << "[concat] needs at least one tensor";
  const Tensor& first = tensors[0];
  check_defined(first, "concat", "tensors[0]");
  const int64_t d = normalize_dim(dim, first.dim(), "concat");
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    detail::check_same("concat", {first, t});
    bool match = t.dim() == first.dim();
    for (int64_t k = 0; match && k < t.dim(); ++k) match = k == d || t.size(k) == first.size(k);
    MAMMOTH_CHECK(match) << "[concat] tensor " << i << " of shape " << shape_str(t.shape())
                         << " does not match " << shape_str(first.shape()) << " outside dim " << d;
    out_shape[d] += t.size(d);
  }
  Tensor y = Tensor::empty(out_shape, first.dtype(), first.device());
  std::vector<int64_t> sizes;
  int64_t start = 0;
  for (const Tensor& t : tensors) {
    copy_(y.slice(d, start, start + t.size(d)), t);
    start += t.size(d);
    sizes.push_back(t.size(d));
  }
  if (needs_grad(tensors)) {
    record("concat", tensors, {&y}, [sizes, d](const std::vector<Tensor>& g) {
      std::vector<Tensor> out;
      int64_t s = 0;
      for (int64_t n : sizes) {
        out.push_back(g[0].slice(d, s, s + n));
        s += n;
      }
      return out;
    });
  }
  return y;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  check_defined(x, "split", "x");
  const int64_t d = normalize_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t n : sizes) {
    MAMMOTH_CHECK(n >= 0) << "[split] negative size " << n;
    total += n;
  }
  MAMMOTH_CHECK(total == x.size(d)) << "[split] sizes sum to " << total << " but dim " << d
                                    << " of shape " << shape_str(x.shape()) << " has " << x.size(d);
  std::vector<Tensor> outs;
  {
    NoGradGuard ng;
    int64_t s = 0;
    for (int64_t n : sizes) {
      outs.push_back(x.slice(d, s, s + n));
      s += n;
    }
  }
  if (needs_grad({x})) {
    std::vector<Tensor*> ptrs;
    for (Tensor& t : outs) ptrs.push_back(&t);
    record("split", {x}, ptrs,
           [sizes, d, shape = x.shape(), dt = x.dtype(),
            dev = x.device()](const std::vector<Tensor>& g) {
             Tensor dx = Tensor::zeros(shape, dt, dev);
             int64_t s = 0;
             for (size_t i = 0; i < sizes.size(); ++i) {
               if (g[i].defined()) copy_(dx.slice(d, s, s + sizes[i]), g[i]);
               s += sizes[i];
             }
             return std::vector<Tensor>{dx};
           });
  }
  return outs;
}

Tensor index_select(const Tensor& x_in, int64_t dim, const Tensor& index) {
  check_defined(x_in, "index_select", "x");
  check_index_tensor("index_select", index);
  detail::check_floating("index_select", x_in);
  MAMMOTH_CHECK(index.dim() == 1) << "[index_select] index must be 1-d, got shape "
                                  << shape_str(index.shape());
  const int64_t d = normalize_dim(dim, x_in.dim(), "index_select");
  const Tensor x = x_in.contiguous();
  const ARC s = arc(x.shape(), d);
  const int64_t I = index.size(0);
  Shape out_shape = x.shape();
  out_shape[d] = I;
  Tensor y = Tensor::empty(out_shape, x.dtype(), x.device());
  const Tensor idx = index.contiguous();
  detail::launch(Kernel::index_select, {x.view({s.A, s.R, s.C}), idx}, {y.view({s.A, I, s.C})});
  if (needs_grad({x})) {
    record("index_select", {x}, {&y},
           [idx, s, I, shape = x.shape(), dt = x.dtype()](const std::vector<Tensor>& g) {
             Tensor dx = Tensor::zeros(shape, dt, g[0].device());
             detail::launch(Kernel::index_add, {g[0].contiguous().view({s.A, I, s.C}), idx},
                            {dx.view({s.A, s.R, s.C})});
             return std::vector<Tensor>{dx};
           });
  }
  return y;
}

Tensor embedding(const Tensor& ids, const Tensor& weight) {
  check_defined(weight, "embedding", "weight");
  check_index_tensor("embedding", ids);
  MAMMOTH_CHECK(weight.dim() == 2)
      << "[embedding] weight must be [num_embeddings, dim], got " << shape_str(weight.shape());
  Tensor flat = ids.reshape({-1});
  Tensor rows;
  {
    NoGradGuard ng;
    rows = index_select(weight, 0, flat);
  }
  Shape out_shape = ids.shape();
  out_shape.push_back(weight.size(1));
  Tensor y = rows.view(out_shape);
  if (needs_grad({weight})) {
    // The closure holds the weight only to find its gradient (a parameter lives anyway).
    record("embedding", {weight}, {&y},
           [flat = flat.contiguous(), weight, wshape = weight.shape(),
            dt = weight.dtype()](const std::vector<Tensor>& g) {
             const int64_t I = flat.size(0);
             const Tensor rows = g[0].contiguous().view({1, I, wshape[1]});
             if (add_into_leaf_grad(weight, [&](const Tensor& grad) {
                   add_rows_once(rows, flat, grad.view({1, wshape[0], wshape[1]}));
                 })) {
               return std::vector<Tensor>{Tensor()};
             }
             Tensor dw = Tensor::zeros(wshape, dt, g[0].device());
             detail::launch(Kernel::index_add, {rows, flat}, {dw.view({1, wshape[0], wshape[1]})});
             return std::vector<Tensor>{dw};
           });
  }
  // A 16-bit table's rows widen to f32 (detail::widen_weight), the cast carrying the gradient.
  if (weight.dtype() == DType::kBF16 || weight.dtype() == DType::kF16) return cast(y, DType::kF32);
  return y;
}

Tensor gather(const Tensor& x_in, int64_t dim, const Tensor& index) {
  check_defined(x_in, "gather", "x");
  check_index_tensor("gather", index);
  detail::check_floating("gather", x_in);
  const int64_t d = normalize_dim(dim, x_in.dim(), "gather");
  MAMMOTH_CHECK(index.dim() == x_in.dim())
      << "[gather] index of shape " << shape_str(index.shape()) << " must have as many dims as x "
      << shape_str(x_in.shape());
  for (int64_t k = 0; k < x_in.dim(); ++k) {
    MAMMOTH_CHECK(k == d || index.size(k) == x_in.size(k))
        << "[gather] index shape " << shape_str(index.shape()) << " must match x "
        << shape_str(x_in.shape()) << " outside dim " << d;
  }
  const Tensor x = x_in.contiguous();
  const Tensor idx = index.contiguous();
  const ARC s = arc(x.shape(), d);
  const int64_t I = idx.size(d);
  Tensor y = Tensor::empty(idx.shape(), x.dtype(), x.device());
  detail::launch(Kernel::gather, {x.view({s.A, s.R, s.C}), idx.view({s.A, I, s.C})},
                 {y.view({s.A, I, s.C})});
  if (needs_grad({x})) {
    record("gather", {x}, {&y},
           [idx, s, I, shape = x.shape(), dt = x.dtype()](const std::vector<Tensor>& g) {
             Tensor dx = Tensor::zeros(shape, dt, g[0].device());
             detail::launch(Kernel::scatter_add,
                            {g[0].contiguous().view({s.A, I, s.C}), idx.view({s.A, I, s.C})},
                            {dx.view({s.A, s.R, s.C})});
             return std::vector<Tensor>{dx};
           });
  }
  return y;
}

}  // namespace mammoth::engine
