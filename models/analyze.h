// Size and cost of a model from its config alone (so 70B shapes can be planned on a laptop):
// parameter count and FLOPs per token for forward and training. The planner's time model reads
// them; memory per rank and tier is plan/memory_model's (which `mammoth analyze` shows).
//
// FLOPs count matrix multiplications only, 2 per multiply-add (biases, norms, activations and
// softmax are lower order). Attention scores and the weighted sum cost 2*T*d_attn each per
// token and layer over the full T x T square (as Megatron-LM and PaLM count, not exploiting the
// causal mask). Training = 3 x forward (backward computes input and weight gradients).
#pragma once

#include <cstdint>

#include "base/json.h"
#include "models/config.h"

namespace mammoth::models {

struct ModelAnalysis {
  ModelConfig config;
  int64_t params = 0;            // every trainable parameter (tied weights once)
  int64_t active_params = 0;     // those one token computes with (MoE: top-k experts; else all)
  int64_t embedding_params = 0;  // token, position and token-type tables (lookups, no FLOPs)
  int64_t seq_len = 0;           // context length the FLOPs assume (ViT: patches + 1)
  double flops_per_token_forward = 0;
  double flops_per_token_train = 0;  // forward + backward
  // The forward's parts (pipeline stages are balanced with these): one transformer block, and
  // the head (LM head / MLM transform / ViT patch projection and classifier).
  double block_flops_per_token_forward = 0;
  double head_flops_per_token_forward = 0;
};

// seq_len 0: the config's max_seq (ViT: num_patches + 1).
ModelAnalysis analyze(const ModelConfig& config, int64_t seq_len = 0);

// Parameter count alone (matches Module::num_parameters() of the built model).
int64_t count_parameters(const ModelConfig& config);

json::Value analysis_to_json(const ModelAnalysis& a);

}  // namespace mammoth::models
