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

// LLaMA's decoder cost outside the MLP: a block's two RMSNorms and q, k, v, o (biases not
// included), the q, k, v, o FLOPs, and the embedding, final norm and LM head.
int64_t llama_attention_params(const ModelConfig& c);
double llama_projection_flops(const ModelConfig& c);
int64_t llama_outside_params(const ModelConfig& c);
int64_t llama_embedding_params(const ModelConfig& c);
double llama_head_flops(const ModelConfig& c, int64_t T);
TpParamSplit llama_tp_split(const ModelConfig& c, int tp, int64_t Vp, int64_t outside);

}  // namespace mammoth::models
