// Text generation from a causal language model with a KV cache: greedy, temperature, top-k and
// top-p (nucleus) sampling, deterministic for a seed (Philox, so every platform draws alike).
//
//   std::vector<int64_t> out = generate(*model, {50256}, {.max_new_tokens = 20, .top_k = 40});
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "models/model.h"

namespace mammoth::models {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  double temperature = 1.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // 0: all tokens
  double top_p = 1.0;        // keep the smallest set of tokens with this much probability
  uint64_t seed = 0;
  int64_t eos_token = -1;  // stop after emitting it (-1: never)
  // Called with each new token as soon as it is chosen (to stream text); may be empty.
  std::function<void(int64_t)> on_token;
};

// Returns the new tokens only (not the prompt). The prompt is run once through the cache, then
// one token per step. Stops at max_new_tokens, eos_token, or the model's max_seq.
std::vector<int64_t> generate(LanguageModel& model, const std::vector<int64_t>& prompt,
                              const GenerateOptions& options);

// Picks a token from one row of logits under `options`; `uniform` is a draw from [0, 1).
int64_t sample_token(const std::vector<double>& logits, const GenerateOptions& options,
                     double uniform);

}  // namespace mammoth::models
