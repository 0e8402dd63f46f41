// What the LLaMA family's spec shares with families built on its decoder (Mixtral): its config
// constructor and the cost terms of its attention, embeddings and head.
#pragma once

#include <cstdint>
#include <string>

#include "models/family.h"

namespace mammoth::models {

ModelConfig llama_config(const std::string& name, int64_t vocab, int64_t layers, int64_t heads,
                         int64_t kv_heads, int64_t d, int64_t ff, int64_t seq, double eps,
                         double rope_base);

// LLaMA's decoder outside the MLP: a block's two RMSNorms and q, k, v, o (no biases), and the
// q, k, v, o FLOPs per token.
int64_t llama_attention_params(const ModelConfig& c);
double llama_projection_flops(const ModelConfig& c);
// The costs outside the blocks (embedding, final norm, LM head, their tp split); the family
// sets block_params, block_flops and activations.
FamilyCost llama_decoder_cost();

}  // namespace mammoth::models
