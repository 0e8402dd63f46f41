// Model shapes of published training runs, for the planner's tests.
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "models/config.h"

namespace mammoth::plan::testing {

// Narayanan et al. 2021's GPT models: vocabulary 51,200, sequence 2048, MLP 4h, 16-bit
// weights (GPT-3 175B is layers 96, hidden 12288, heads 96). The position table is longer than
// the 2048 trained positions because Mammoth's pipeline carries each row as seq_len + 1 tokens,
// padded for the sequence splits (plan::check); it adds under 0.02% to the parameters.
inline models::ModelConfig megatron_gpt(int64_t layers, int64_t hidden, int64_t heads) {
  models::ModelConfig c;
  c.name = "megatron-gpt";
  c.family = models::Family::kGpt2;
  c.vocab_size = 51200;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_kv_head = heads;
  c.d_model = hidden;
  c.d_ff = 4 * hidden;
  c.max_seq = 4096;
  c.dtype = DType::kBF16;
  return c;
}

// Llama 3 405B (The Llama 3 Herd of Models, Table 3): 126 layers, model dimension 16,384, FFN
// 53,248, 128 attention heads, 8 key/value heads, vocabulary 128,256, untied embeddings.
inline models::ModelConfig llama3_405b() {
  models::ModelConfig c;
  c.name = "llama3-405b";
  c.family = models::Family::kLlama;
  c.vocab_size = 128256;
  c.n_layer = 126;
  c.n_head = 128;
  c.n_kv_head = 8;
  c.d_model = 16384;
  c.d_ff = 53248;
  c.max_seq = 131072;  // Llama 3.1's context; no position table
  c.rope_base = 500000.0;
  c.tie_embeddings = false;
  c.dtype = DType::kBF16;
  return c;
}

}  // namespace mammoth::plan::testing
