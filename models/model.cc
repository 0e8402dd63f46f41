#include "models/model.h"

#include "engine/autograd.h"
#include "engine/nn/checkpoint.h"
#include "engine/ops.h"
#include "models/layers.h"

namespace mammoth::models {

engine::Tensor run_block(bool recompute,
                         const std::function<engine::Tensor(const engine::Tensor&)>& block,
                         const engine::Tensor& x) {
  if (!recompute || !engine::grad_enabled()) return block(x);
  return engine::nn::checkpoint(
      [block](const std::vector<engine::Tensor>& in) {
        return std::vector<engine::Tensor>{block(in[0])};
      },
      {x})[0];
}

using engine::Tensor;

HfLayout Model::hf_layout() const {
  HfLayout layout;
  for (const auto& [name, t] : named_parameters()) layout.params.push_back({name, name});
  return layout;
}

std::pair<Tensor, Tensor> KVCache::append(int64_t layer, const Tensor& k_new, const Tensor& v_new) {
  MAMMOTH_CHECK(layer >= 0 && layer < static_cast<int64_t>(k.size()))
      << "[KVCache::append] layer " << layer << " out of range, cache has " << k.size();
  const int64_t t = k_new.size(2);
  MAMMOTH_CHECK(length + t <= capacity) << "[KVCache::append] " << length << " cached + " << t
                                        << " new positions exceed capacity " << capacity;
  {
    engine::NoGradGuard ng;
    engine::copy_(k[layer].slice(2, length, length + t), k_new);
    engine::copy_(v[layer].slice(2, length, length + t), v_new);
  }
  return {k[layer].slice(2, 0, length + t), v[layer].slice(2, 0, length + t)};
}

Tensor LanguageModel::loss(const Tensor& ids, const Tensor& targets) {
  Tensor logits = forward(ids);
  if (targets.defined()) {
    MAMMOTH_CHECK(targets.shape() == ids.shape())
        << "[LanguageModel::loss] targets " << engine::shape_str(targets.shape())
        << " must match ids " << engine::shape_str(ids.shape());
    return engine::cross_entropy(logits, targets);
  }
  const int64_t T = ids.size(1);
  MAMMOTH_CHECK(T >= 2) << "[LanguageModel::loss] next-token loss needs sequences of at least 2 "
                           "tokens, got T="
                        << T;
  return engine::cross_entropy(logits.slice(1, 0, T - 1), ids.slice(1, 1, T));
}

Tensor LanguageModel::forward_cached(const Tensor&, KVCache*) {
  MAMMOTH_THROW() << "[forward_cached] model family " << family_name(config().family)
                  << " does not decode incrementally";
}

namespace {
[[noreturn]] void no_pipeline(const LanguageModel& m) {
  MAMMOTH_THROW() << "[pipeline] model family " << family_name(m.config().family)
                  << " has no pipeline stages yet (GPT-2 has; see LanguageModel::pipeline_*)";
}
}  // namespace

Tensor LanguageModel::pipeline_embed(const Tensor&) { no_pipeline(*this); }
Tensor LanguageModel::pipeline_block(int64_t, const Tensor&, const Tensor&) { no_pipeline(*this); }
Tensor LanguageModel::pipeline_loss(const Tensor&, const Tensor&) { no_pipeline(*this); }
LanguageModel::PipelinePart LanguageModel::pipeline_part(const std::string&) const {
  no_pipeline(*this);
}

KVCache LanguageModel::make_cache(int64_t batch, int64_t capacity) const {
  const ModelConfig& c = config();
  MAMMOTH_CHECK(batch > 0 && capacity > 0)
      << "[make_cache] batch and capacity must be positive, got " << batch << ", " << capacity;
  KVCache cache;
  cache.capacity = capacity;
  const Device device = module_device(*this);  // the cache lives beside the weights
  for (int64_t l = 0; l < c.n_layer; ++l) {
    cache.k.push_back(Tensor::zeros({batch, c.n_kv_head, capacity, c.head_dim()}, c.dtype, device));
    cache.v.push_back(Tensor::zeros({batch, c.n_kv_head, capacity, c.head_dim()}, c.dtype, device));
  }
  return cache;
}

}  // namespace mammoth::models
