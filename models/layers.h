// The building blocks shared by the model families: a module list with numeric child names, a
// Linear with its own init scale, attention with optional dropout on the probabilities, and
// Layers, the factory a family's blocks are built from.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/module.h"
#include "engine/ops.h"
#include "engine/tensor.h"
#include "parallel/comm/communicator.h"

namespace mammoth::parallel {
class SequenceLayout;
}

namespace mammoth::models {

// Children named "0", "1", ... so parameters read "h.3.attn.c_attn.weight" as in HF.
template <typename M>
class ModuleList : public engine::nn::Module {
 public:
  std::shared_ptr<M> add(std::shared_ptr<M> m) {
    register_module(std::to_string(items_.size()), m);
    items_.push_back(m);
    return m;
  }
  size_t size() const { return items_.size(); }
  M& operator[](size_t i) const { return *items_[i]; }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

// nn.Linear whose weight is drawn from N(0, std) (GPT-2 scales residual projections by
// 1/sqrt(2 n_layer)); biases start at zero.
class ScaledLinear : public engine::nn::Linear {
 public:
  ScaledLinear(int64_t in, int64_t out, bool bias, DType dtype, double stddev)
      : Linear(in, out, bias, dtype), stddev_(stddev) {}

 protected:
  void init_own(uint64_t seed, const std::string& prefix) override;

 private:
  double stddev_;
};

// Scaled dot-product attention over q [B, Hq, Tq, D], k and v [B, Hk, Tk, D]. With dropout
// (p > 0 and training) the probabilities are materialised and dropped as in PyTorch's eager
// attention; otherwise the fused engine::attention runs.
engine::Tensor attend(const engine::Tensor& q, const engine::Tensor& k, const engine::Tensor& v,
                      const engine::AttentionOptions& options, double dropout_p, bool training);

// How the sequence is split (models/policies/policy.h describes the modes).
enum class SpMode { kNone, kSplitGather, kUlysses, kRing };
const char* sp_mode_name(SpMode mode);              // "none", "split_gather", "ulysses", "ring"
SpMode sp_mode_from_name(const std::string& name);  // throws naming the value

// What a block needs to know about the sequence layout of its input, made by the sharded model
// for each batch (ShardLayout::plan_sequence). Default: the whole sequence on one rank.
struct SeqContext {
  SpMode mode = SpMode::kNone;
  // Owned, not borrowed: a recomputed (activation-checkpointed) block runs again in backward.
  std::shared_ptr<const parallel::SequenceLayout> layout;  // ulysses / ring
  parallel::Communicator* sp = nullptr;                    // ulysses / ring
  // Global positions of the rows this rank holds, in order (>= T: padding); rotary families.
  std::shared_ptr<const std::vector<int64_t>> positions;
  // Encoders' padding mask under split_gather (with the layout's padding), Ulysses and ring:
  // bool [B, padded] over global positions, true = a real position.
  engine::Tensor key_mask;
};

// How Layers builds one linear layer (namespace level: a default argument cannot be a nested
// class with member initialisers).
struct LinearOptions {
  int parts = 1;          // fused segments along the output (q|k|v: 3), split each over tp
  double init_std = 0.0;  // > 0: weights N(0, init_std) (ScaledLinear); else nn::Linear's
};

// The layers a family's blocks are built from. The plan chooses them: Layers() gives the
// one-device layers (nn::Linear, local attention); Layers(tp, mode) the tensor-parallel ones
// (column / row parallel over the tp group, Megatron sequence parallelism under split_gather)
// and, through SeqContext, Ulysses or ring attention. A block written once against Layers is
// both the single-device block and its parallel form; it keeps n / tp() heads and widths.
class Layers {
 public:
  Layers() = default;
  Layers(parallel::Communicator& tp, SpMode mode);

  // Output features split over tp (their input replicated, or gathered along the sequence).
  std::shared_ptr<engine::nn::Linear> column(int64_t in, int64_t out, bool bias, DType dtype,
                                             const LinearOptions& options = {}) const;
  // Input features split over tp, the partial products summed (or reduce-scattered along the
  // sequence); the bias is whole.
  std::shared_ptr<engine::nn::Linear> row(int64_t in, int64_t out, bool bias, DType dtype,
                                          const LinearOptions& options = {}) const;
  // Scaled dot-product attention over this rank's heads, q [B, Hq, T, D], k and v [B, Hk, T, D]:
  // local (attend, with seq.key_mask), or Ulysses / ring over seq.sp (with seq.key_mask).
  // Attention dropout and a key mask in `options` under Ulysses / ring are refused by name.
  engine::Tensor attention(const engine::Tensor& q, const engine::Tensor& k,
                           const engine::Tensor& v, engine::AttentionOptions options,
                           double dropout, bool training, const SeqContext& seq) const;

  int tp() const { return tp_ ? tp_->size() : 1; }
  parallel::Communicator* tp_group() const { return tp_; }
  SpMode sp_mode() const { return mode_; }
  // n / tp(), refused naming `what` when it does not divide.
  int64_t split(int64_t n, const char* what) const;

 private:
  static std::shared_ptr<engine::nn::Linear> local(int64_t in, int64_t out, bool bias, DType dtype,
                                                   const LinearOptions& options);
  parallel::Communicator* tp_ = nullptr;
  SpMode mode_ = SpMode::kNone;
};

// [B, T, H*D] -> [B, H, T, D]
engine::Tensor split_heads(const engine::Tensor& x, int64_t heads);
// [B, H, T, D] -> [B, T, H*D]
engine::Tensor merge_heads(const engine::Tensor& x);

// Position ids offset, offset+1, ..., offset+t-1 as i64 [t].
// On `device`: forward passes make their own tensors where their input lives.
engine::Tensor positions(int64_t offset, int64_t t, Device device);

// The device of a module's first parameter (the CPU for a module without parameters).
Device module_device(const engine::nn::Module& module);

}  // namespace mammoth::models
