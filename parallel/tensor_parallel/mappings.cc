#include "parallel/tensor_parallel/mappings.h"

#include <vector>

#include "base/fault.h"
#include "engine/autograd.h"
#include "engine/ops.h"

namespace mammoth::parallel {

using engine::Tensor;

namespace {

// Tag of ring_shift's point-to-point messages (kept apart from other users of send/recv).
constexpr int kRingTag = 7301;

int64_t split_size(const Tensor& x, Communicator& g, int64_t dim, const char* op) {
  const int64_t n = x.size(dim);
  MAMMOTH_CHECK(n % g.size() == 0)
      << "[" << op << "] size " << n << " of dim " << dim << " of " << engine::shape_str(x.shape())
      << " does not divide by group '" << g.name() << "' size " << g.size();
  return n / g.size();
}

// Records the single-input single-output backward `fn` when x needs one. A collective's
// backward is itself collective, so an output that did not reach the loss on this rank
// (undefined gradient) still takes part, with zeros: skipping it would hang the other ranks.
Tensor with_grad(const Tensor& x, Tensor y, engine::BackwardFn fn) {
  if (engine::needs_grad({x})) {
    engine::record("collective", {x}, {&y},
                   [fn = std::move(fn), shape = y.shape(), dtype = y.dtype(),
                    device = y.device()](const std::vector<Tensor>& gy) {
                     if (gy[0].defined()) return fn(gy);
                     return fn({Tensor::zeros(shape, dtype, device)});
                   });
  }
  return y;
}

}  // namespace

namespace comm_ops {

Tensor all_reduce(const Tensor& x, Communicator& g, ReduceOp op) {
  Tensor y = x.detach().contiguous().clone();
  if (g.size() > 1) g.all_reduce(y, op);
  return y;
}

Tensor slice_mine(const Tensor& x, Communicator& g, int64_t dim) {
  dim = engine::normalize_dim(dim, x.dim(), "scatter_to_group");
  const int64_t n = split_size(x, g, dim, "scatter_to_group");
  return x.detach().slice(dim, g.rank() * n, (g.rank() + 1) * n).contiguous();
}

Tensor all_gather(const Tensor& x, Communicator& g, int64_t dim) {
  dim = engine::normalize_dim(dim, x.dim(), "all_gather");
  if (g.size() == 1) return x.detach().contiguous();
  // Bring `dim` to the front so that each rank's block is contiguous in the flat buffer.
  Tensor xt = x.detach().transpose(0, dim).contiguous();
  engine::Shape out_shape = xt.shape();
  out_shape[0] *= g.size();
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  g.all_gather(xt, out);
  return out.transpose(0, dim).contiguous();
}

Tensor reduce_scatter(const Tensor& x, Communicator& g, int64_t dim) {
  dim = engine::normalize_dim(dim, x.dim(), "reduce_scatter");
  const int64_t n = split_size(x, g, dim, "reduce_scatter");
  if (g.size() == 1) return x.detach().contiguous();
  Tensor xt = x.detach().transpose(0, dim).contiguous();
  engine::Shape out_shape = xt.shape();
  out_shape[0] = n;
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  g.reduce_scatter(xt, out, ReduceOp::kSum);
  return out.transpose(0, dim).contiguous();
}

Tensor all_to_all(const Tensor& x, Communicator& g, int64_t scatter_dim, int64_t gather_dim) {
  scatter_dim = engine::normalize_dim(scatter_dim, x.dim(), "all_to_all");
  gather_dim = engine::normalize_dim(gather_dim, x.dim(), "all_to_all");
  const int64_t n = split_size(x, g, scatter_dim, "all_to_all");
  const int p = g.size();
  Tensor xd = x.detach();
  if (p == 1) return xd.contiguous();
  // Block j (the j-th slice along scatter_dim) goes to rank j: lay the blocks out one after
  // the other, each contiguous in its own shape.
  std::vector<Tensor> blocks;
  for (int j = 0; j < p; ++j) blocks.push_back(xd.slice(scatter_dim, j * n, (j + 1) * n));
  engine::Shape bshape = blocks[0].shape();
  const int64_t bnumel = engine::shape_numel(bshape);
  Tensor send = Tensor::empty({p * bnumel}, x.dtype(), x.device());
  for (int j = 0; j < p; ++j) {
    engine::copy_(send.slice(0, j * bnumel, (j + 1) * bnumel).view(bshape), blocks[j]);
  }
  Tensor recv = Tensor::empty({p * bnumel}, x.dtype(), x.device());
  g.all_to_all(send, recv);
  std::vector<Tensor> got;
  for (int i = 0; i < p; ++i)
    got.push_back(recv.slice(0, i * bnumel, (i + 1) * bnumel).view(bshape));
  engine::NoGradGuard ng;
  return engine::concat(got, gather_dim);
}

Tensor shift(const Tensor& x, Communicator& g, int offset) {
  const int p = g.size();
  Tensor xc = x.detach().contiguous();
  const int to = ((g.rank() + offset) % p + p) % p;
  const int from = ((g.rank() - offset) % p + p) % p;
  if (to == g.rank()) return xc.clone();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  auto r = g.irecv(y, from, kRingTag);
  auto s = g.isend(xc, to, kRingTag);
  s->wait();
  r->wait();
  return y;
}

}  // namespace comm_ops

Tensor copy_to_group(const Tensor& x, Communicator& group) {
  Communicator* g = &group;
  return with_grad(x, x.detach(), [g](const std::vector<Tensor>& gy) {
    fault::point("backward");  // tp's gradient reduction (MAMMOTH_FAULT)
    return std::vector<Tensor>{comm_ops::all_reduce(gy[0], *g)};
  });
}

Tensor reduce_from_group(const Tensor& x, Communicator& group) {
  return with_grad(x, comm_ops::all_reduce(x, group),
                   [](const std::vector<Tensor>& gy) { return std::vector<Tensor>{gy[0]}; });
}

Tensor scatter_to_group(const Tensor& x, Communicator& group, int64_t dim) {
  Communicator* g = &group;
  dim = engine::normalize_dim(dim, x.dim(), "scatter_to_group");
  return with_grad(x, comm_ops::slice_mine(x, group, dim), [g, dim](const std::vector<Tensor>& gy) {
    return std::vector<Tensor>{comm_ops::all_gather(gy[0], *g, dim)};
  });
}

Tensor gather_from_group(const Tensor& x, Communicator& group, int64_t dim) {
  Communicator* g = &group;
  dim = engine::normalize_dim(dim, x.dim(), "gather_from_group");
  return with_grad(x, comm_ops::all_gather(x, group, dim), [g, dim](const std::vector<Tensor>& gy) {
    return std::vector<Tensor>{comm_ops::slice_mine(gy[0], *g, dim)};
  });
}

Tensor reduce_scatter_to_group(const Tensor& x, Communicator& group, int64_t dim) {
  Communicator* g = &group;
  dim = engine::normalize_dim(dim, x.dim(), "reduce_scatter_to_group");
  return with_grad(x, comm_ops::reduce_scatter(x, group, dim),
                   [g, dim](const std::vector<Tensor>& gy) {
                     return std::vector<Tensor>{comm_ops::all_gather(gy[0], *g, dim)};
                   });
}

Tensor all_gather_from_group(const Tensor& x, Communicator& group, int64_t dim) {
  Communicator* g = &group;
  dim = engine::normalize_dim(dim, x.dim(), "all_gather_from_group");
  return with_grad(x, comm_ops::all_gather(x, group, dim), [g, dim](const std::vector<Tensor>& gy) {
    return std::vector<Tensor>{comm_ops::reduce_scatter(gy[0], *g, dim)};
  });
}

Tensor all_to_all_group(const Tensor& x, Communicator& group, int64_t scatter_dim,
                        int64_t gather_dim) {
  Communicator* g = &group;
  scatter_dim = engine::normalize_dim(scatter_dim, x.dim(), "all_to_all_group");
  gather_dim = engine::normalize_dim(gather_dim, x.dim(), "all_to_all_group");
  return with_grad(
      x, comm_ops::all_to_all(x, group, scatter_dim, gather_dim),
      [g, scatter_dim, gather_dim](const std::vector<Tensor>& gy) {
        return std::vector<Tensor>{comm_ops::all_to_all(gy[0], *g, gather_dim, scatter_dim)};
      });
}

Tensor ring_shift(const Tensor& x, Communicator& group, int offset) {
  Communicator* g = &group;
  return with_grad(x, comm_ops::shift(x, group, offset),
                   [g, offset](const std::vector<Tensor>& gy) {
                     return std::vector<Tensor>{comm_ops::shift(gy[0], *g, -offset)};
                   });
}

}  // namespace mammoth::parallel
