// Rotary position embeddings with config.json's rope_scaling, as transformers 4.44 computes
// them (modeling_rope_utils.py: _compute_default / linear / dynamic_ntk / llama3 parameters).
// The one place that knows the scaled frequencies: LLaMA's attention (in every parallel
// layout) and its paged serving path all rotate through llama_rope.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/tensor.h"
#include "models/config.h"

namespace mammoth::models {

// The rotary base at a sequence of seq_len positions: rope_theta, except under dynamic NTK
// scaling once seq_len exceeds max_seq, where it grows to
//   base * (factor * seq_len / max_seq - (factor - 1)) ^ (head_dim / (head_dim - 2)).
// transformers caches the largest base seen until a sequence shorter than max_seq comes; we
// use the sequence's own (the same for one forward and for generation, which only grows).
double rope_base_at(const ModelConfig& c, int64_t seq_len);

// The head_dim / 2 inverse frequencies of linear and llama3 scaling (rounded to float as
// transformers holds them); empty when the frequencies are base^(-2i / head_dim), which
// engine::rope computes itself.
std::vector<float> rope_inv_freq(const ModelConfig& c);

// engine::rope of t [B, T, H, head_dim] whose first row is position `offset`, in a sequence of
// seq_len positions (what dynamic scaling depends on; ignored by the other kinds).
engine::Tensor llama_rope(const engine::Tensor& t, const ModelConfig& c, int64_t offset,
                          int64_t seq_len);

// llama_rope of t [B, n, H, head_dim] whose rows are the global `positions` (a sequence split
// over ranks: a rank's rows need not be consecutive). engine::rope takes one offset, so each
// run of consecutive positions is rotated from its first one. Dynamic scaling is not
// supported (it needs the whole sequence's length; the tp/sp policy refuses it).
engine::Tensor llama_rope_at(const engine::Tensor& t, const std::vector<int64_t>& positions,
                             const ModelConfig& c);

}  // namespace mammoth::models
