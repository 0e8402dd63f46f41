// Blocks shared by the bidirectional encoder families (BERT, ViT).
#pragma once

#include <cstdint>
#include <memory>

#include "engine/nn/module.h"
#include "engine/tensor.h"
#include "models/config.h"
#include "models/layers.h"

namespace mammoth::models {

// Hugging Face's BertSelfAttention / ViTSelfAttention: query, key and value projections (column
// layers of `L`) and attention with no causal mask over this rank's n_head / tp heads, the
// padded or masked keys hidden by `seq`. The output stays split by heads: the family's row
// layer "dense" follows.
class EncoderSelfAttention : public engine::nn::Module {
 public:
  explicit EncoderSelfAttention(const ModelConfig& c, const Layers& L = Layers());
  // x [B, n, C] -> [B, n, C / tp]
  engine::Tensor forward(const engine::Tensor& x, const SeqContext& seq) const;
  std::shared_ptr<engine::nn::Linear> query, key, value;

 private:
  const ModelConfig& config_;
  Layers layers_;
  int64_t heads_;  // n_head / tp
};

}  // namespace mammoth::models
