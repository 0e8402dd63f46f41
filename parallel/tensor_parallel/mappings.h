// Differentiable communication for tensor and sequence parallelism: conjugate pairs.
//
// Megatron's idea: a sharded layer reads like its math when every crossing of a process
// boundary is an autograd op whose backward is the conjugate collective. Each pair below is
// (forward, backward); `group` is a Communicator (a DeviceMesh axis, usually tp or sp):
//
//   copy_to_group          identity            / all-reduce (sum)   entering a column-parallel
//   reduce_from_group      all-reduce (sum)    / identity           leaving a row-parallel
//   scatter_to_group       keep my slice (dim) / all-gather (dim)
//   gather_from_group      all-gather (dim)    / keep my slice (dim)
//   reduce_scatter_to_group reduce-scatter(dim)/ all-gather (dim)   Megatron SP, after row-par.
//   all_gather_from_group  all-gather (dim)    / reduce-scatter(dim) Megatron SP, before col-par.
//   all_to_all_group       all-to-all (scatter s, gather g) / all-to-all (scatter g, gather s)
//   ring_shift             send to rank+k, receive from rank-k / the reverse (ring attention)
//
// "Keep my slice" along dim d of size p*n is [rank*n, (rank+1)*n). Gathers concatenate the
// ranks' blocks along d in rank order. Sizes along the split dim must divide by the group size.
// All of them record the engine op "collective" (engine/op_list.h); a size-1 group makes each
// an identity. Every rank of the group must call the same mappings in the same order.
#pragma once

#include <cstdint>

#include "engine/tensor.h"
#include "parallel/comm/communicator.h"

namespace mammoth::parallel {

engine::Tensor copy_to_group(const engine::Tensor& x, Communicator& group);
engine::Tensor reduce_from_group(const engine::Tensor& x, Communicator& group);
engine::Tensor scatter_to_group(const engine::Tensor& x, Communicator& group, int64_t dim);
engine::Tensor gather_from_group(const engine::Tensor& x, Communicator& group, int64_t dim);
engine::Tensor reduce_scatter_to_group(const engine::Tensor& x, Communicator& group, int64_t dim);
engine::Tensor all_gather_from_group(const engine::Tensor& x, Communicator& group, int64_t dim);
// Splits x along scatter_dim into group.size() blocks, sends block j to rank j, and
// concatenates the blocks received (rank order) along gather_dim.
engine::Tensor all_to_all_group(const engine::Tensor& x, Communicator& group, int64_t scatter_dim,
                                int64_t gather_dim);
// Sends x to rank (r + offset) mod p and returns what rank (r - offset) mod p sent.
engine::Tensor ring_shift(const engine::Tensor& x, Communicator& group, int offset = 1);

// ---- the same data movement without autograd (the building blocks of the above) ----
namespace comm_ops {
engine::Tensor all_reduce(const engine::Tensor& x, Communicator& group,
                          ReduceOp op = ReduceOp::kSum);
engine::Tensor slice_mine(const engine::Tensor& x, Communicator& group, int64_t dim);
engine::Tensor all_gather(const engine::Tensor& x, Communicator& group, int64_t dim);
engine::Tensor reduce_scatter(const engine::Tensor& x, Communicator& group, int64_t dim);
engine::Tensor all_to_all(const engine::Tensor& x, Communicator& group, int64_t scatter_dim,
                          int64_t gather_dim);
engine::Tensor shift(const engine::Tensor& x, Communicator& group, int offset);
}  // namespace comm_ops

}  // namespace mammoth::parallel
