#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/error.h"
#include "base/philox.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/layers.h"

namespace mammoth::models {

using engine::Tensor;

int64_t sample_token(const std::vector<double>& logits, const GenerateOptions& o, double uniform) {
  MAMMOTH_CHECK(!logits.empty()) << "[sample_token] empty logits";
  MAMMOTH_CHECK(o.temperature >= 0) << "[generate] temperature must be >= 0, got " << o.temperature;
  MAMMOTH_CHECK(o.top_p > 0 && o.top_p <= 1)
      << "[generate] top_p must be in (0, 1], got " << o.top_p;
  MAMMOTH_CHECK(o.top_k >= 0) << "[generate] top_k must be >= 0, got " << o.top_k;
  const int64_t V = static_cast<int64_t>(logits.size());
  if (o.temperature == 0.0) {
    return std::max_element(logits.begin(), logits.end()) - logits.begin();
  }
  // Candidates by decreasing logit (ties: lower id first, for determinism).
  std::vector<int64_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  const int64_t k = o.top_k > 0 ? std::min(o.top_k, V) : V;
  std::vector<double> p(k);
  const double top = logits[order[0]] / o.temperature;
  double total = 0;
  for (int64_t i = 0; i < k; ++i) total += p[i] = std::exp(logits[order[i]] / o.temperature - top);
  // Nucleus: the shortest prefix whose probability reaches top_p.
  int64_t keep = k;
  if (o.top_p < 1.0) {
    double cum = 0;
    for (int64_t i = 0; i < k; ++i) {
      cum += p[i] / total;
      if (cum >= o.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  double kept = 0;
  for (int64_t i = 0; i < keep; ++i) kept += p[i];
  double x = uniform * kept;
  for (int64_t i = 0; i < keep; ++i) {
    if (x < p[i]) return order[i];
    x -= p[i];
  }
  return order[keep - 1];
}

std::vector<int64_t> generate(LanguageModel& model, const std::vector<int64_t>& prompt,
                              const GenerateOptions& o) {
  MAMMOTH_CHECK(model.supports_kv_cache())
      << "[generate] " << family_name(model.config().family) << " is not a causal LM";
  MAMMOTH_CHECK(!prompt.empty()) << "[generate] the prompt needs at least one token";
  const int64_t V = model.config().vocab_size;
  for (int64_t t : prompt) {
    MAMMOTH_CHECK(t >= 0 && t < V) << "[generate] prompt token " << t << " outside vocab " << V;
  }
  const int64_t P = static_cast<int64_t>(prompt.size());
  MAMMOTH_CHECK(P <= model.config().position_limit())
      << "[generate] prompt of " << P << " tokens exceeds max_seq " << model.config().max_seq;
  const int64_t capacity =
      std::min(P + std::max<int64_t>(o.max_new_tokens, 0), model.config().position_limit());
  engine::NoGradGuard ng;
  const bool was_training = model.is_training();
  model.eval();
  KVCache cache = model.make_cache(1, capacity);
  std::vector<int64_t> out;
  const Device device = module_device(model);
  Tensor logits = model.forward_cached(Tensor::from_ints(prompt, {1, P}).to(device), &cache);
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    const std::vector<double> row = logits.select(1, logits.size(1) - 1).to_vector();
    const PhiloxOut r = philox4x32(static_cast<uint64_t>(step), 0x67656e6572617465ull, o.seed);
    const double u = static_cast<double>(r.v[0]) / 4294967296.0;
    const int64_t next = sample_token(row, o, u);
    out.push_back(next);
    if (o.on_token) o.on_token(next);
    if (next == o.eos_token || cache.length >= capacity) break;
    logits = model.forward_cached(Tensor::from_ints({next}, {1, 1}).to(device), &cache);
  }
  model.train(was_training);
  return out;
}

}  // namespace mammoth::models
