// Size and cost of a model from its config alone (so 70B shapes can be planned on a laptop):
// parameter count, FLOPs per token for forward and training, and memory for weights,
// gradients and optimizer states per storage dtype.
//
// FLOPs count matrix multiplications only, 2 per multiply-add (biases, norms, activations and
// softmax are lower order). Attention scores and the weighted sum cost 2*T*d_attn each per
// token and layer over the full T x T square (as Megatron-LM and PaLM count, not exploiting the
// causal mask). Training = 3 x forward (backward computes input and weight gradients).
// Memory assumes AdamW: two fp32 moments per parameter, plus an fp32 master copy when weights
// are stored in bf16/f16 (mixed precision, 16 bytes/param in total; ZeRO paper's K = 12).
#pragma once

#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "base/json.h"
#include "models/config.h"

namespace mammoth::models {

struct MemoryEstimate {
  DType dtype = DType::kF32;  // weight and gradient storage
  int64_t weights_bytes = 0;
  int64_t grads_bytes = 0;
  int64_t optimizer_bytes = 0;  // AdamW moments (+ fp32 master weights for 16-bit dtypes)
  int64_t total_bytes() const { return weights_bytes + grads_bytes + optimizer_bytes; }
};

struct ModelAnalysis {
  ModelConfig config;
  int64_t params = 0;            // every trainable parameter (tied weights once)
  int64_t embedding_params = 0;  // token, position and token-type tables (lookups, no FLOPs)
  int64_t seq_len = 0;           // context length the FLOPs assume (ViT: patches + 1)
  double flops_per_token_forward = 0;
  double flops_per_token_train = 0;    // forward + backward
  std::vector<MemoryEstimate> memory;  // f32, bf16, f16
};

// seq_len 0: the config's max_seq (ViT: num_patches + 1).
ModelAnalysis analyze(const ModelConfig& config, int64_t seq_len = 0);

// Parameter count alone (matches Module::num_parameters() of the built model).
int64_t count_parameters(const ModelConfig& config);

json::Value analysis_to_json(const ModelAnalysis& a);

}  // namespace mammoth::models
