#include "models/mixtral/mixtral.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/ops.h"

namespace mammoth::models {

using engine::Tensor;
using engine::nn::Embedding;
using engine::nn::Linear;
using engine::nn::RMSNorm;

MixtralExpert::MixtralExpert(const ModelConfig& c) {
  w1 = register_module("w1", std::make_shared<Linear>(c.d_model, c.d_ff, false, c.dtype));
  w2 = register_module("w2", std::make_shared<Linear>(c.d_ff, c.d_model, false, c.dtype));
  w3 = register_module("w3", std::make_shared<Linear>(c.d_model, c.d_ff, false, c.dtype));
}

MixtralSparseMoeBlock::MixtralSparseMoeBlock(const ModelConfig& c) : config_(c) {
  gate =
      register_module("gate", std::make_shared<Linear>(c.d_model, c.moe_experts, false, c.dtype));
  experts = register_module("experts", std::make_shared<ModuleList<MixtralExpert>>());
  for (int64_t e = 0; e < c.moe_experts; ++e) experts->add(std::make_shared<MixtralExpert>(c));
}

Tensor MixtralSparseMoeBlock::forward(const Tensor& x) {
  const int64_t C = x.size(-1), E = config_.moe_experts, k = config_.moe_top_k;
  const Tensor h = x.reshape({-1, C});  // [N, C]
  const int64_t N = h.size(0);
  // The router in f32 at least (HF softmaxes in float32), f64 for f64 models.
  router_logits = gate->forward(h);  // [N, E]
  const DType rdt = router_logits.dtype() == DType::kF64 ? DType::kF64 : DType::kF32;
  if (router_logits.dtype() != rdt) router_logits = engine::cast(router_logits, rdt);
  router_probs = engine::softmax(router_logits, -1);

  // Top-k per token on the host (a selection, no gradient), larger probability first.
  const std::vector<double> p = router_probs.detach().to(Device::cpu()).to_vector();
  selected.assign(static_cast<size_t>(N * k), 0);
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    std::iota(order.begin(), order.end(), 0);
    const double* row = p.data() + n * E;
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [row](int64_t a, int64_t b) {
      return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    std::copy(order.begin(), order.begin() + k, selected.begin() + n * k);
  }
  // Renormalised top-k weights [N * k], differentiable through the softmax.
  Tensor top = engine::gather(router_probs, 1, Tensor::from_ints(selected, {N, k}));
  top = (top / engine::sum(top, {1}, true)).reshape({N * k});

  // (token, expert) pairs sorted by expert, token order within one; capacity drops the tail.
  const int64_t capacity =
      config_.moe_capacity_factor > 0
          ? static_cast<int64_t>(std::ceil(config_.moe_capacity_factor *
                                           static_cast<double>(N * k) / static_cast<double>(E)))
          : N;
  load.tokens.assign(static_cast<size_t>(E), 0);
  load.dropped = 0;
  std::vector<std::vector<int64_t>> slots(static_cast<size_t>(E));  // n * k + rank
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = selected[n * k + j];
      ++load.tokens[e];
      if (static_cast<int64_t>(slots[e].size()) < capacity)
        slots[e].push_back(n * k + j);
      else
        ++load.dropped;
    }
  }
  std::vector<int64_t> offsets = {0}, rows, pair;
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t s : slots[e]) {
      rows.push_back(s / k);
      pair.push_back(s);
    }
    offsets.push_back(static_cast<int64_t>(rows.size()));
  }
  const int64_t M = offsets.back();
  const Tensor row_index = Tensor::from_ints(rows, {M}).to(x.device());
  const Tensor weights = engine::cast(
      engine::index_select(top, 0, Tensor::from_ints(pair, {M}).to(x.device())), x.dtype());
  std::vector<Tensor> w1, w2, w3;
  for (size_t e = 0; e < experts->size(); ++e) {
    w1.push_back((*experts)[e].w1->weight);
    w2.push_back((*experts)[e].w2->weight);
    w3.push_back((*experts)[e].w3->weight);
  }
  const Tensor xs = engine::index_select(h, 0, row_index);  // [M, C]
  const Tensor act = engine::silu(engine::grouped_matmul(xs, offsets, w1)) *
                     engine::grouped_matmul(xs, offsets, w3);
  const Tensor ys = engine::grouped_matmul(act, offsets, w2);  // [M, C]
  return engine::moe_combine(ys, row_index, weights, N).view(x.shape());
}

MixtralDecoderLayer::MixtralDecoderLayer(const ModelConfig& c) {
  input_layernorm =
      register_module("input_layernorm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
  self_attn = register_module("self_attn", std::make_shared<LlamaAttention>(c));
  post_attention_layernorm = register_module(
      "post_attention_layernorm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
  block_sparse_moe =
      register_module("block_sparse_moe", std::make_shared<MixtralSparseMoeBlock>(c));
}

Tensor MixtralDecoderLayer::forward(const Tensor& x, KVCache* cache, int64_t layer) const {
  Tensor h = x + self_attn->forward(input_layernorm->forward(x), cache, layer);
  return h + block_sparse_moe->forward(post_attention_layernorm->forward(h));
}

MixtralModel::MixtralModel(const ModelConfig& c) : config_(c) {
  embed_tokens = register_module("embed_tokens",
                                 std::make_shared<Embedding>(c.vocab_size, c.d_model, c.dtype));
  layers = register_module("layers", std::make_shared<ModuleList<MixtralDecoderLayer>>());
  for (int64_t l = 0; l < c.n_layer; ++l) layers->add(std::make_shared<MixtralDecoderLayer>(c));
  norm = register_module("norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
}

Tensor MixtralModel::forward(const Tensor& ids, KVCache* cache) const {
  MAMMOTH_CHECK(ids.dim() == 2 && ids.dtype() == DType::kI64)
      << "[Mixtral::forward] ids must be i64 [B, T], got " << dtype_name(ids.dtype()) << " "
      << engine::shape_str(ids.shape());
  const int64_t offset = cache != nullptr ? cache->length : 0;
  MAMMOTH_CHECK(offset + ids.size(1) <= config_.position_limit())
      << "[Mixtral::forward] positions up to " << offset + ids.size(1) << " exceed max_seq "
      << config_.max_seq;
  Tensor x = embed_tokens->forward(ids);
  for (size_t l = 0; l < layers->size(); ++l) x = (*layers)[l].forward(x, cache, l);
  if (cache != nullptr) cache->length += ids.size(1);
  return norm->forward(x);
}

Mixtral::Mixtral(ModelConfig config) : config_(std::move(config)) {
  config_.validate();
  MAMMOTH_CHECK(config_.family == Family::kMixtral)
      << "[Mixtral] config '" << config_.name << "' is family " << family_name(config_.family);
  model = register_module("model", std::make_shared<MixtralModel>(config_));
  if (!config_.tie_embeddings) {
    lm_head = register_module(
        "lm_head",
        std::make_shared<Linear>(config_.d_model, config_.vocab_size, false, config_.dtype));
  }
}

Tensor Mixtral::run(const Tensor& ids, KVCache* cache) {
  // Recomputing a block would run its router again under no grad and lose the router losses'
  // graph; refused until the router state is carried through engine::nn::checkpoint.
  MAMMOTH_CHECK(!is_training() || recompute_blocks_ == 0)
      << "[Mixtral] activation checkpointing (--recompute-blocks) is not supported for mixtral yet";
  Tensor h = model->forward(ids, cache);
  return lm_head ? lm_head->forward(h) : engine::linear(h, model->embed_tokens->weight);
}

Tensor Mixtral::forward(const Tensor& ids) { return run(ids, nullptr); }

Tensor Mixtral::forward_cached(const Tensor& ids, KVCache* cache) {
  MAMMOTH_CHECK(cache != nullptr) << "[Mixtral::forward_cached] cache is null";
  return run(ids, cache);
}

Tensor Mixtral::loss(const Tensor& ids, const Tensor& targets) {
  Tensor l = LanguageModel::loss(ids, targets);
  if (config_.moe_aux_loss && config_.moe_aux_loss_coef > 0)
    l = l + aux_loss() * config_.moe_aux_loss_coef;
  if (config_.moe_z_loss_coef > 0) l = l + z_loss() * config_.moe_z_loss_coef;
  return l;
}

namespace {

std::vector<const MixtralSparseMoeBlock*> moe_blocks(const MixtralModel& m) {
  std::vector<const MixtralSparseMoeBlock*> out;
  for (size_t l = 0; l < m.layers->size(); ++l) {
    const MixtralSparseMoeBlock& b = *(*m.layers)[l].block_sparse_moe;
    MAMMOTH_CHECK(b.router_probs.defined()) << "[Mixtral] router losses need a forward first";
    out.push_back(&b);
  }
  return out;
}

}  // namespace

Tensor Mixtral::aux_loss() const {
  // HF's load_balancing_loss_func without an attention mask, over the layers' rows stacked:
  // E * sum_e (fraction of the top-k choices that went to e) * (mean router probability of e),
  // the fraction taken per rank j and summed over j, i.e. counts_e / rows.
  const int64_t E = config_.moe_experts;
  std::vector<Tensor> probs;
  std::vector<double> counts(static_cast<size_t>(E), 0.0);
  int64_t rows = 0;
  for (const MixtralSparseMoeBlock* b : moe_blocks(*model)) {
    probs.push_back(b->router_probs);
    rows += b->router_probs.size(0);
    for (int64_t e : b->selected) counts[e] += 1;
  }
  const Tensor mean_p = engine::mean(engine::concat(probs, 0), {0});  // [E]
  for (double& c : counts) c /= static_cast<double>(rows);
  const Tensor frac = Tensor::from_vector(counts, {E}, mean_p.dtype()).to(mean_p.device());
  return engine::sum(mean_p * frac) * static_cast<double>(E);
}

Tensor Mixtral::z_loss() const {
  std::vector<Tensor> logits;
  for (const MixtralSparseMoeBlock* b : moe_blocks(*model)) logits.push_back(b->router_logits);
  const Tensor z = engine::concat(logits, 0);  // [rows, E]
  // logsumexp with the (constant) row maximum taken out first.
  const Tensor m = engine::max(z, 1, true).detach();
  const Tensor lse = engine::log(engine::sum(engine::exp(z - m), {1}, true)) + m;
  return engine::mean(lse * lse);
}

std::vector<ExpertLoad> Mixtral::expert_load() const {
  std::vector<ExpertLoad> out;
  for (const MixtralSparseMoeBlock* b : moe_blocks(*model)) out.push_back(b->load);
  return out;
}

HfLayout Mixtral::hf_layout() const {
  HfLayout layout = Model::hf_layout();
  layout.ignored = {"*.rotary_emb.inv_freq"};
  if (config_.tie_embeddings) layout.ignored.push_back("lm_head.weight");
  return layout;
}

}  // namespace mammoth::models
