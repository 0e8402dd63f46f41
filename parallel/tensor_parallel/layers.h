// Tensor-parallel layers (Megatron-LM 1D): column- and row-parallel linear, vocab-parallel
// embedding and the vocab-parallel cross-entropy, plus the shard arithmetic of their weights.
//
// Weights use nn.Linear's [out, in] layout, so "split A by columns" (Y = X A, A = W^T) means
// "split W by rows". A policy (models/policies) builds these from a single-device model's
// layers and copies each rank's shard in with shard_tensor(); unshard_tensor() is the inverse
// (checkpoints, parity tests). The parameter names stay the single-device ones ("weight",
// "bias"), so a sharded model's parameters are named exactly like the model it came from.
#pragma once

#include <cstdint>
#include <string>

#include "engine/nn/module.h"
#include "engine/tensor.h"
#include "parallel/comm/communicator.h"

namespace mammoth::parallel {

// How one parameter is split over a group of p ranks. dim < 0: replicated. Along `dim` the
// full tensor holds `parts` segments of `size / parts` rows each (e.g. GPT-2's fused q|k|v:
// parts = 3), every segment is zero-padded to `padded / parts` rows and cut into p equal
// pieces; rank r holds piece r of every segment, in segment order.
struct ShardSpec {
  int64_t dim = -1;
  int parts = 1;
  int64_t size = 0;    // full (unpadded) size along dim
  int64_t padded = 0;  // padded size along dim, a multiple of parts * p
  bool sharded() const { return dim >= 0; }
};

// The padded size of `size` rows in `parts` segments over p ranks (vocab padding).
int64_t padded_size(int64_t size, int parts, int p);
ShardSpec make_shard_spec(int64_t dim, int64_t size, int parts, int p);

// Rank `rank`'s shard of `full` (a copy, contiguous, no autograd).
engine::Tensor shard_tensor(const engine::Tensor& full, const ShardSpec& spec, int rank, int p);
// The full, unpadded tensor from this rank's shard (collective over `group`).
engine::Tensor unshard_tensor(const engine::Tensor& shard, const ShardSpec& spec,
                              Communicator& group);

// Where elements of a shard sit in the full tensor, both flattened row-major: `length`
// elements from shard index `local` are full-tensor elements from `global` on.
struct FlatRun {
  int64_t global = 0, local = 0, length = 0;
};
// The runs covering shard elements [lo, hi) of rank `rank`'s shard (shape `shard_shape`, as
// shard_tensor makes it), in shard order; padding elements belong to no run. This lets a rank
// read or write its shard as pieces of the full tensor without gathering it.
std::vector<FlatRun> shard_flat_runs(const ShardSpec& spec, const engine::Shape& shard_shape,
                                     int rank, int p, int64_t lo, int64_t hi);

// Y = X A + b with A = [A_1 ... A_p] split by output columns: rank r holds A_r (the rows
// [r*out/p, (r+1)*out/p) of W, or piece r of every segment for a fused weight) and b_r.
// The input X is replicated (copy_to_group: its gradient is all-reduced in backward), or, with
// sequence_parallel, sharded along the sequence (dim 1) and all-gathered first (Megatron SP:
// the gradient is reduce-scattered back). Output: Y_r [.., out/p], or all of Y with gather_output.
// An nn::Linear whose weight and bias are this rank's shard ([out/p, in], [out/p]); `delta`
// (LoRA's B split like W) is added to this rank's output from the (gathered) input.
class ColumnParallelLinear : public engine::nn::Linear {
 public:
  struct Options {
    bool gather_output = false;
    bool sequence_parallel = false;
    int parts = 1;  // fused segments along the output (3 for q|k|v)
  };
  ColumnParallelLinear(int64_t in_features, int64_t out_features, bool bias, DType dtype,
                       Communicator& group, const Options& options);
  engine::Tensor forward(const engine::Tensor& x) const override;
  // Copies this rank's shard of a single-device nn::Linear's weight [out, in] and bias.
  void load_from(const engine::nn::Linear& full);
  ShardSpec weight_spec() const { return spec_; }

 private:
  Communicator& group_;
  Options options_;
  ShardSpec spec_;
};

// Y = X A + b with A = [A_1; ...; A_p] split by input rows and X = [X_1 ... X_p] split by its
// last dim: Y = sum_r X_r A_r + b. Rank r holds A_r (columns [r*in/p, (r+1)*in/p) of W) and
// the whole b. The partial products are all-reduced (reduce_from_group), or, with
// sequence_parallel, reduce-scattered along the sequence (dim 1); b is added afterwards.
// input_is_parallel = false scatters a replicated X first.
// An nn::Linear whose weight is this rank's shard [out, in/p] and whose bias [out] is whole;
// `delta` (LoRA's A split like W) is added to this rank's partial product from its input shard
// [.., in/p], before the reduction, so the partial updates sum to the whole one.
class RowParallelLinear : public engine::nn::Linear {
 public:
  struct Options {
    bool input_is_parallel = true;
    bool sequence_parallel = false;
  };
  RowParallelLinear(int64_t in_features, int64_t out_features, bool bias, DType dtype,
                    Communicator& group, const Options& options);
  engine::Tensor forward(const engine::Tensor& x) const override;
  void load_from(const engine::nn::Linear& full);
  ShardSpec weight_spec() const { return spec_; }

 private:
  Communicator& group_;
  Options options_;
  ShardSpec spec_;
};

// Embedding whose table is split by rows (the vocabulary): rank r holds ids
// [r*Vp/p, (r+1)*Vp/p) of the vocabulary padded to Vp (a multiple of p; padded rows are zero
// and never looked up). An id outside a rank's range contributes zeros there, so the partial
// lookups sum to the full one: all-reduced, or reduce-scattered along the sequence under SP.
class VocabParallelEmbedding : public engine::nn::Module {
 public:
  VocabParallelEmbedding(int64_t vocab_size, int64_t dim, DType dtype, Communicator& group,
                         bool sequence_parallel = false);
  // ids i64 [B, T] -> [B, T, C] (or [B, T/p, C] with sequence_parallel).
  engine::Tensor forward(const engine::Tensor& ids) const;
  // The partial lookup of this rank's rows, before any reduction.
  engine::Tensor forward_partial(const engine::Tensor& ids) const;
  void load_from(const engine::nn::Embedding& full);
  int64_t vocab_start() const { return start_; }
  int64_t vocab_size() const { return spec_.size; }
  ShardSpec weight_spec() const { return spec_; }
  engine::Tensor weight;  // [Vp/p, C]

 private:
  Communicator& group_;
  bool sequence_parallel_;
  ShardSpec spec_;
  int64_t start_ = 0;
};

// Cross-entropy of logits split by vocabulary over `group` without ever gathering them:
// logits_local [..., Vp/p] holds columns [vocab_start, vocab_start + Vp/p) of the padded
// vocabulary; columns >= vocab_size are padding and take no probability. The row maximum and
// the sum of exponentials are all-reduced (max, sum) across the group, and so is the logit of
// the target (held by one rank). targets: i64 [...] global ids, ignore_index rows give 0.
// Returns the per-row losses [...] (identical on every rank of the group); with
// valid_count != nullptr, the number of non-ignored rows is stored there.
engine::Tensor vocab_parallel_cross_entropy(const engine::Tensor& logits_local,
                                            const engine::Tensor& targets, Communicator& group,
                                            int64_t vocab_start, int64_t vocab_size,
                                            int64_t ignore_index = -100,
                                            int64_t* valid_count = nullptr);

}  // namespace mammoth::parallel
