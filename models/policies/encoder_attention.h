// The tensor-parallel self-attention of the bidirectional encoders (BERT, ViT), shared by their
// policies: query, key and value column-parallel by heads (Hugging Face's names), attention over
// this rank's heads with no causal mask, the sequence split on the tp group (split_gather:
// padded keys masked) or on the sp group (Ulysses or ring). The output stays split by heads:
// the family's row-parallel "dense" projection follows.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "engine/nn/module.h"
#include "models/config.h"
#include "models/layers.h"
#include "models/policies/policy.h"
#include "parallel/sequence_parallel/sequence_parallel.h"
#include "parallel/tensor_parallel/layers.h"

namespace mammoth::models {

// What an encoder layer needs to know about the sequence layout of its input.
struct EncoderSeqContext {
  SpMode mode = SpMode::kNone;
  // Owned, not borrowed: a recomputed (activation-checkpointed) layer runs again in backward.
  std::shared_ptr<const parallel::SequenceLayout> layout;
  parallel::Communicator* sp = nullptr;
  engine::Tensor key_mask;  // split_gather with padding: bool [B, padded], true = a real position
};

class TpEncoderSelfAttention : public engine::nn::Module {
 public:
  static constexpr const char* kNames[] = {"query", "key", "value"};  // Hugging Face's
  // `policy` names the caller in errors ("bert_policy").
  TpEncoderSelfAttention(const ModelConfig& c, parallel::Communicator& tp, bool sequence_parallel,
                         const char* policy)
      : config_(c), tp_(tp) {
    MAMMOTH_CHECK(c.n_head % tp.size() == 0)
        << "[" << policy << "] n_head " << c.n_head << " does not divide by tp " << tp.size();
    parallel::ColumnParallelLinear::Options col{.sequence_parallel = sequence_parallel};
    for (const char* name : kNames) {
      proj_.push_back(register_module(name, std::make_shared<parallel::ColumnParallelLinear>(
                                                c.d_model, c.d_model, true, c.dtype, tp, col)));
    }
  }
  engine::Tensor forward(const engine::Tensor& x, const EncoderSeqContext& seq) const {
    const int64_t Hl = config_.n_head / tp_.size();
    engine::Tensor q = split_heads(proj_[0]->forward(x), Hl).contiguous();
    engine::Tensor k = split_heads(proj_[1]->forward(x), Hl).contiguous();
    engine::Tensor v = split_heads(proj_[2]->forward(x), Hl).contiguous();
    engine::Tensor y;
    if (seq.mode == SpMode::kUlysses) {
      y = parallel::ulysses_attention(q, k, v, *seq.sp, *seq.layout, false);
    } else if (seq.mode == SpMode::kRing) {
      y = parallel::ring_attention(q, k, v, *seq.sp, *seq.layout, false);
    } else {
      y = attend(q, k, v, {.key_mask = seq.key_mask}, config_.attn_dropout, is_training());
    }
    return merge_heads(y);
  }
  // Its parameters' shard specs, named under `prefix` (the module's own path, with its dot).
  std::vector<std::pair<std::string, parallel::ShardSpec>> shard_specs(
      const std::string& prefix) const {
    std::vector<std::pair<std::string, parallel::ShardSpec>> out;
    for (size_t i = 0; i < proj_.size(); ++i) {
      const parallel::ShardSpec s = proj_[i]->weight_spec();
      out.emplace_back(prefix + kNames[i] + ".weight", s);
      out.emplace_back(prefix + kNames[i] + ".bias", s);
    }
    return out;
  }

 private:
  const ModelConfig& config_;
  parallel::Communicator& tp_;
  std::vector<std::shared_ptr<parallel::ColumnParallelLinear>> proj_;  // query, key, value
};

// The encoders' "encoder.layer" stack: n_layer tensor-parallel layers of the family's Layer,
// each built as Layer(config, tp, sequence_parallel).
template <typename Layer>
class TpEncoder : public engine::nn::Module {
 public:
  TpEncoder(const ModelConfig& c, parallel::Communicator& tp, bool sequence_parallel) {
    layer = register_module("layer", std::make_shared<ModuleList<Layer>>());
    for (int64_t l = 0; l < c.n_layer; ++l) {
      layer->add(std::make_shared<Layer>(c, tp, sequence_parallel));
    }
  }
  std::shared_ptr<ModuleList<Layer>> layer;
};

}  // namespace mammoth::models
