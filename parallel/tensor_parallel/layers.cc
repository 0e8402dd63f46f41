#include "parallel/tensor_parallel/layers.h"

#include <algorithm>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mammoth::parallel {

using engine::Tensor;

int64_t padded_size(int64_t size, int parts, int p) {
  const int64_t unit = static_cast<int64_t>(parts) * p;
  return (size + unit - 1) / unit * unit;
}

ShardSpec make_shard_spec(int64_t dim, int64_t size, int parts, int p) {
  MAMMOTH_CHECK(parts >= 1 && size % parts == 0)
      << "[make_shard_spec] size " << size << " is not " << parts << " equal segments";
  ShardSpec s;
  s.dim = dim;
  s.parts = parts;
  s.size = size;
  // Only the last segment may be padded, so a fused weight pads each segment: round the
  // segment size up to a multiple of p.
  const int64_t seg = size / parts;
  s.padded = padded_size(seg, 1, p) * parts;
  return s;
}

Tensor shard_tensor(const Tensor& full, const ShardSpec& spec, int rank, int p) {
  if (!spec.sharded()) return full.detach().contiguous().clone();
  MAMMOTH_CHECK(full.size(spec.dim) == spec.size)
      << "[shard_tensor] tensor " << engine::shape_str(full.shape()) << " has "
      << full.size(spec.dim) << " rows along dim " << spec.dim << ", the spec says " << spec.size;
  const int64_t seg = spec.size / spec.parts, pseg = spec.padded / spec.parts, piece = pseg / p;
  engine::Shape shape = full.shape();
  shape[spec.dim] = piece * spec.parts;
  Tensor out = Tensor::zeros(shape, full.dtype(), full.device());
  for (int s = 0; s < spec.parts; ++s) {
    const int64_t lo = rank * piece, hi = std::min<int64_t>((rank + 1) * piece, seg);
    if (hi <= lo) continue;
    engine::copy_(out.slice(spec.dim, s * piece, s * piece + (hi - lo)),
                  full.detach().slice(spec.dim, s * seg + lo, s * seg + hi));
  }
  return out;
}

Tensor unshard_tensor(const Tensor& shard, const ShardSpec& spec, Communicator& group) {
  if (!spec.sharded()) return shard.detach().contiguous().clone();
  const int p = group.size();
  const int64_t seg = spec.size / spec.parts, piece = spec.padded / spec.parts / p;
  Tensor all = comm_ops::all_gather(shard, group, spec.dim);  // rank-major: [p][parts][piece]
  std::vector<Tensor> segments;
  engine::NoGradGuard ng;
  for (int s = 0; s < spec.parts; ++s) {
    std::vector<Tensor> pieces;
    for (int r = 0; r < p; ++r) {
      const int64_t at = (static_cast<int64_t>(r) * spec.parts + s) * piece;
      pieces.push_back(all.slice(spec.dim, at, at + piece));
    }
    segments.push_back(engine::concat(pieces, spec.dim).slice(spec.dim, 0, seg));
  }
  return engine::concat(segments, spec.dim).contiguous();
}

std::vector<FlatRun> shard_flat_runs(const ShardSpec& spec, const engine::Shape& shard_shape,
                                     int rank, int p, int64_t lo, int64_t hi) {
  int64_t numel = 1;
  for (int64_t d : shard_shape) numel *= d;
  MAMMOTH_CHECK(0 <= lo && lo <= hi && hi <= numel)
      << "[shard_flat_runs] range [" << lo << ", " << hi << ") outside a shard of " << numel
      << " elements";
  std::vector<FlatRun> runs;
  auto add = [&](int64_t global, int64_t local, int64_t length) {
    const int64_t a = std::max(lo, local), b = std::min(hi, local + length);
    if (a < b) runs.push_back({global + (a - local), a, b - a});
  };
  if (!spec.sharded()) {
    add(0, 0, numel);
    return runs;
  }
  const size_t dim = static_cast<size_t>(spec.dim);
  MAMMOTH_CHECK(dim < shard_shape.size())
      << "[shard_flat_runs] split dim " << spec.dim << " of a " << shard_shape.size() << "-d shard";
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < dim; ++d) outer *= shard_shape[d];
  for (size_t d = dim + 1; d < shard_shape.size(); ++d) inner *= shard_shape[d];
  const int64_t seg = spec.size / spec.parts, piece = spec.padded / spec.parts / p;
  MAMMOTH_CHECK(shard_shape[dim] == piece * spec.parts)
      << "[shard_flat_runs] shard has " << shard_shape[dim] << " rows along dim " << spec.dim
      << ", the spec gives " << piece * spec.parts;
  // Rows s*piece + j of the shard are rows s*seg + rank*piece + j of the full tensor while
  // rank*piece + j < seg (the rest is padding).
  const int64_t valid = std::clamp<int64_t>(seg - static_cast<int64_t>(rank) * piece, 0, piece);
  for (int64_t o = 0; o < outer; ++o) {
    for (int s = 0; s < spec.parts; ++s) {
      const int64_t local = (o * piece * spec.parts + s * piece) * inner;
      const int64_t global = (o * spec.size + s * seg + static_cast<int64_t>(rank) * piece) * inner;
      add(global, local, valid * inner);
    }
  }
  return runs;
}

// ---- ColumnParallelLinear ----

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, bool with_bias, DType dtype,
                                           Communicator& group, const Options& options)
    : Linear(in, make_shard_spec(0, out, options.parts, group.size()).padded / group.size(),
             with_bias, dtype),
      group_(group),
      options_(options),
      spec_(make_shard_spec(0, out, options.parts, group.size())) {
  MAMMOTH_CHECK(!options.gather_output || spec_.padded == spec_.size)
      << "[ColumnParallelLinear] gather_output needs out_features " << out
      << " divisible by tp size " << group.size();
}

Tensor ColumnParallelLinear::forward(const Tensor& x) const {
  Tensor xp =
      options_.sequence_parallel ? all_gather_from_group(x, group_, 1) : copy_to_group(x, group_);
  Tensor y = engine::linear(xp, weight, bias);
  if (delta) y = y + delta->forward(xp, training_);
  return options_.gather_output ? gather_from_group(y, group_, -1) : y;
}

void ColumnParallelLinear::load_from(const engine::nn::Linear& full) {
  engine::NoGradGuard ng;
  engine::copy_(weight, shard_tensor(full.weight, spec_, group_.rank(), group_.size()));
  if (bias.defined()) {
    ShardSpec bs = spec_;
    engine::copy_(bias, shard_tensor(full.bias, bs, group_.rank(), group_.size()));
  }
}

// ---- RowParallelLinear ----

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, bool with_bias, DType dtype,
                                     Communicator& group, const Options& options)
    : Linear(make_shard_spec(1, in, 1, group.size()).padded / group.size(), out, with_bias, dtype),
      group_(group),
      options_(options),
      spec_(make_shard_spec(1, in, 1, group.size())) {
  MAMMOTH_CHECK(spec_.padded == spec_.size)
      << "[RowParallelLinear] in_features " << in << " must divide by tp size " << group.size();
}

Tensor RowParallelLinear::forward(const Tensor& x) const {
  Tensor xp = options_.input_is_parallel ? x : scatter_to_group(x, group_, -1);
  Tensor partial = engine::linear(xp, weight);
  if (delta) partial = partial + delta->forward(xp, training_);
  Tensor y = options_.sequence_parallel ? reduce_scatter_to_group(partial, group_, 1)
                                        : reduce_from_group(partial, group_);
  return bias.defined() ? y + bias : y;
}

void RowParallelLinear::load_from(const engine::nn::Linear& full) {
  engine::NoGradGuard ng;
  engine::copy_(weight, shard_tensor(full.weight, spec_, group_.rank(), group_.size()));
  if (bias.defined()) engine::copy_(bias, full.bias);
}

// ---- VocabParallelEmbedding ----

VocabParallelEmbedding::VocabParallelEmbedding(int64_t vocab, int64_t dim, DType dtype,
                                               Communicator& group, bool sequence_parallel)
    : group_(group), sequence_parallel_(sequence_parallel) {
  spec_ = make_shard_spec(0, vocab, 1, group.size());
  const int64_t local = spec_.padded / group.size();
  start_ = group.rank() * local;
  weight = register_parameter("weight", Tensor::zeros({local, dim}, dtype));
}

Tensor VocabParallelEmbedding::forward_partial(const Tensor& ids) const {
  const int64_t local = weight.size(0);
  std::vector<int64_t> v = ids.to_int_vector();
  std::vector<double> keep(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const bool mine = v[i] >= start_ && v[i] < start_ + local;
    keep[i] = mine ? 1.0 : 0.0;
    v[i] = mine ? v[i] - start_ : 0;
  }
  engine::Shape kshape = ids.shape();
  kshape.push_back(1);
  Tensor e = engine::embedding(Tensor::from_ints(v, ids.shape()), weight);
  return e * Tensor::from_vector(keep, kshape, weight.dtype());
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) const {
  Tensor partial = forward_partial(ids);
  return sequence_parallel_ ? reduce_scatter_to_group(partial, group_, 1)
                            : reduce_from_group(partial, group_);
}

void VocabParallelEmbedding::load_from(const engine::nn::Embedding& full) {
  engine::NoGradGuard ng;
  engine::copy_(weight, shard_tensor(full.weight, spec_, group_.rank(), group_.size()));
}

// ---- vocab-parallel cross-entropy ----

Tensor vocab_parallel_cross_entropy(const Tensor& logits_local, const Tensor& targets,
                                    Communicator& group, int64_t vocab_start, int64_t vocab_size,
                                    int64_t ignore_index, int64_t* valid_count) {
  const int64_t vl = logits_local.size(-1);
  engine::Shape row_shape(logits_local.shape().begin(), logits_local.shape().end() - 1);
  MAMMOTH_CHECK(targets.shape() == row_shape)
      << "[vocab_parallel_cross_entropy] targets " << engine::shape_str(targets.shape())
      << " do not match logits " << engine::shape_str(logits_local.shape());
  Tensor logits = logits_local;
  if (vocab_start + vl > vocab_size) {  // padded vocabulary columns take no probability
    std::vector<double> pad(static_cast<size_t>(vl));
    for (int64_t j = 0; j < vl; ++j) pad[j] = vocab_start + j >= vocab_size ? 1.0 : 0.0;
    logits = engine::masked_fill(logits, Tensor::from_vector(pad, {vl}, DType::kBool), -1e30);
  }
  // The shift only keeps exp() in range; the loss does not depend on it, so no gradient.
  Tensor row_max;
  {
    engine::NoGradGuard ng;
    row_max = comm_ops::all_reduce(engine::max(logits.detach(), -1, true), group, ReduceOp::kMax);
  }
  Tensor shifted = logits - row_max;                                                   // [..., Vl]
  Tensor sum_exp = reduce_from_group(engine::sum(engine::exp(shifted), {-1}), group);  // [...]
  // The target's logit lives on one rank; the others contribute 0.
  std::vector<int64_t> t = targets.to_int_vector();
  std::vector<int64_t> idx(t.size());
  std::vector<double> mine(t.size()), valid(t.size());
  int64_t count = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    valid[i] = t[i] == ignore_index ? 0.0 : 1.0;
    count += t[i] == ignore_index ? 0 : 1;
    MAMMOTH_CHECK(t[i] == ignore_index || (t[i] >= 0 && t[i] < vocab_size))
        << "[vocab_parallel_cross_entropy] target " << t[i] << " outside vocabulary of "
        << vocab_size;
    const bool here = t[i] >= vocab_start && t[i] < vocab_start + vl;
    mine[i] = here ? 1.0 : 0.0;
    idx[i] = here ? t[i] - vocab_start : 0;
  }
  engine::Shape idx_shape = row_shape;
  idx_shape.push_back(1);
  Tensor picked = engine::gather(shifted, -1, Tensor::from_ints(idx, idx_shape)).squeeze(-1);
  picked = reduce_from_group(picked * Tensor::from_vector(mine, row_shape, logits.dtype()), group);
  if (valid_count != nullptr) *valid_count = count;
  return (engine::log(sum_exp) - picked) * Tensor::from_vector(valid, row_shape, logits.dtype());
}

}  // namespace mammoth::parallel
