#include "models/llama/llama.h"

#include <algorithm>
#include <tuple>

#include "engine/ops.h"
#include "models/llama/rope.h"

namespace mammoth::models {

using engine::Tensor;
using engine::nn::Embedding;
using engine::nn::Linear;
using engine::nn::RMSNorm;

LlamaAttention::LlamaAttention(const ModelConfig& c, const Layers& L)
    : config_(c), layers_(L), heads_(L.split(c.n_head, "n_head")) {
  const int64_t p = L.tp();
  MAMMOTH_CHECK(c.n_kv_head % p == 0 || p % c.n_kv_head == 0)
      << "[llama] " << c.n_kv_head << " key/value heads can neither be split over tp " << p
      << " (n_kv_head % tp != 0) nor replicated (tp % n_kv_head != 0); with n_head " << c.n_head
      << " a rank's query heads would need parts of several KV heads";
  kv_heads_ = kv_replicated() ? 1 : c.n_kv_head / p;
  const int64_t D = c.head_dim();
  // With fewer KV heads than ranks each rank projects one (replicated) KV head: the
  // column-parallel layer then has tp heads' rows, one per rank.
  const int64_t kv_rows = std::max(c.n_kv_head, p) * D;
  const bool bias = c.qkv_bias;  // Qwen2; split with its projection's rows
  q_proj = register_module("q_proj", L.column(c.d_model, c.n_head * D, bias, c.dtype));
  k_proj = register_module("k_proj", L.column(c.d_model, kv_rows, bias, c.dtype));
  v_proj = register_module("v_proj", L.column(c.d_model, kv_rows, bias, c.dtype));
  o_proj = register_module("o_proj", L.row(c.n_head * D, c.d_model, false, c.dtype));
}

Tensor LlamaAttention::forward(const Tensor& x, KVCache* cache, int64_t layer,
                               const SeqContext& seq) const {
  const int64_t B = x.size(0), D = config_.head_dim();
  const int64_t offset = cache != nullptr ? cache->length : 0;
  // rope works on [B, T, H, D]; attention wants [B, H, T, D]. T is the projection's rows: under
  // split_gather the column-parallel layers gather the whole sequence.
  auto project = [&](const Linear& proj, int64_t heads, bool rotate) {
    Tensor t = proj.forward(x);
    const int64_t T = t.size(1);
    t = t.view({B, T, heads, D});
    if (rotate) {
      t = seq.positions ? llama_rope_at(t, *seq.positions, config_)
                        : llama_rope(t, config_, offset, offset + T);
    }
    return t.permute({0, 2, 1, 3});
  };
  Tensor q = project(*q_proj, heads_, true);
  Tensor k = project(*k_proj, kv_heads_, true);
  Tensor v = project(*v_proj, kv_heads_, false);
  if (cache != nullptr) std::tie(k, v) = cache->append(layer, k, v);
  Tensor y = layers_.attention(q, k, v, {.causal = true, .window = config_.sliding_window},
                               config_.attn_dropout, is_training(), seq);
  return o_proj->forward(merge_heads(y));
}

Tensor LlamaAttention::forward_paged(const Tensor& x, const std::vector<PagedSequence>& seqs,
                                     PagedKVCache* cache, int64_t layer) const {
  const int64_t N = x.size(1), D = config_.head_dim();
  auto heads = [&](const Linear& proj, int64_t n) { return proj.forward(x).reshape({1, N, n, D}); };
  // Each sequence's rows rotated from its own position offset, the same rope forward applies
  // for a cache at s.start (rope_scaling included).
  auto rotated = [&](const Tensor& t) {
    std::vector<Tensor> parts;
    int64_t at = 0;
    for (const PagedSequence& s : seqs) {
      parts.push_back(
          llama_rope(t.slice(1, at, at + s.count), config_, s.start, s.start + s.count));
      at += s.count;
    }
    return parts.size() == 1 ? parts[0] : engine::concat(parts, 1);
  };
  const Tensor y = paged_attention(cache, layer, seqs, rotated(heads(*q_proj, heads_)),
                                   rotated(heads(*k_proj, kv_heads_)), heads(*v_proj, kv_heads_),
                                   config_.sliding_window);
  return o_proj->forward(y);
}

LlamaMlp::LlamaMlp(const ModelConfig& c, const Layers& L) {
  gate_proj = register_module("gate_proj", L.column(c.d_model, c.d_ff, false, c.dtype));
  up_proj = register_module("up_proj", L.column(c.d_model, c.d_ff, false, c.dtype));
  down_proj = register_module("down_proj", L.row(c.d_ff, c.d_model, false, c.dtype));
}

Tensor LlamaMlp::forward(const Tensor& x) const {
  return down_proj->forward(engine::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

LlamaDecoderLayer::LlamaDecoderLayer(const ModelConfig& c, const Layers& L) {
  input_layernorm =
      register_module("input_layernorm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
  self_attn = register_module("self_attn", std::make_shared<LlamaAttention>(c, L));
  post_attention_layernorm = register_module(
      "post_attention_layernorm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
  mlp = register_module("mlp", std::make_shared<LlamaMlp>(c, L));
}

Tensor LlamaDecoderLayer::forward(const Tensor& x, KVCache* cache, int64_t layer,
                                  const SeqContext& seq) const {
  Tensor h = x + self_attn->forward(input_layernorm->forward(x), cache, layer, seq);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

Tensor LlamaDecoderLayer::forward_paged(const Tensor& x, const std::vector<PagedSequence>& seqs,
                                        PagedKVCache* cache, int64_t layer) const {
  Tensor h = x + self_attn->forward_paged(input_layernorm->forward(x), seqs, cache, layer);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

LlamaModel::LlamaModel(const ModelConfig& c) : config_(c) {
  embed_tokens = register_module("embed_tokens",
                                 std::make_shared<Embedding>(c.vocab_size, c.d_model, c.dtype));
  layers = register_module("layers", std::make_shared<ModuleList<LlamaDecoderLayer>>());
  for (int64_t l = 0; l < c.n_layer; ++l) layers->add(std::make_shared<LlamaDecoderLayer>(c));
  norm = register_module("norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
}

Tensor LlamaModel::forward(const Tensor& ids, KVCache* cache) const {
  MAMMOTH_CHECK(ids.dim() == 2 && ids.dtype() == DType::kI64)
      << "[Llama::forward] ids must be i64 [B, T], got " << dtype_name(ids.dtype()) << " "
      << engine::shape_str(ids.shape());
  const int64_t offset = cache != nullptr ? cache->length : 0;
  MAMMOTH_CHECK(offset + ids.size(1) <= config_.position_limit())
      << "[Llama::forward] positions up to " << offset + ids.size(1) << " exceed max_seq "
      << config_.max_seq;
  Tensor x = embed_tokens->forward(ids);
  for (size_t l = 0; l < layers->size(); ++l) {
    const LlamaDecoderLayer& layer = (*layers)[l];
    const int64_t index = static_cast<int64_t>(l);
    if (cache != nullptr) {
      x = layer.forward(x, cache, index);
      continue;
    }
    x = run_block(
        recompute_blocks < 0 || index < recompute_blocks,
        [&layer, index](const Tensor& in) { return layer.forward(in, nullptr, index); }, x);
  }
  if (cache != nullptr) cache->length += ids.size(1);
  return norm->forward(x);
}

Tensor LlamaModel::forward_paged(const Tensor& ids, const std::vector<PagedSequence>& seqs,
                                 PagedKVCache* cache) const {
  MAMMOTH_CHECK(cache != nullptr) << "[Llama::forward_paged] cache is null";
  paged_positions(ids, seqs, *cache, config_.max_seq, "Llama::forward_paged");
  Tensor x = embed_tokens->forward(ids.unsqueeze(0));  // [1, N, C]
  for (size_t l = 0; l < layers->size(); ++l) {
    x = (*layers)[l].forward_paged(x, seqs, cache, static_cast<int64_t>(l));
  }
  return norm->forward(x);
}

Llama::Llama(ModelConfig config) : config_(std::move(config)) {
  config_.validate();
  model = register_module("model", std::make_shared<LlamaModel>(config_));
  if (!config_.tie_embeddings) {
    lm_head = register_module(
        "lm_head",
        std::make_shared<Linear>(config_.d_model, config_.vocab_size, false, config_.dtype));
  }
}

Tensor Llama::run(const Tensor& ids, KVCache* cache) {
  model->recompute_blocks = is_training() ? recompute_blocks_ : 0;
  Tensor h = model->forward(ids, cache);
  return lm_head ? lm_head->forward(h) : engine::linear(h, model->embed_tokens->weight);
}

Tensor Llama::forward(const Tensor& ids) { return run(ids, nullptr); }

Tensor Llama::forward_cached(const Tensor& ids, KVCache* cache) {
  MAMMOTH_CHECK(cache != nullptr) << "[Llama::forward_cached] cache is null";
  return run(ids, cache);
}

Tensor Llama::forward_paged(const Tensor& ids, const std::vector<PagedSequence>& seqs,
                            PagedKVCache* cache) {
  const Tensor h = paged_last_rows(model->forward_paged(ids, seqs, cache), seqs);  // [1, S, C]
  return (lm_head ? lm_head->forward(h) : engine::linear(h, model->embed_tokens->weight))
      .select(0, 0);
}

Tensor Llama::pipeline_embed(const Tensor& ids) {
  MAMMOTH_CHECK(ids.size(1) <= config_.position_limit())
      << "[Llama::pipeline_embed] " << ids.size(1) << " positions exceed max_seq "
      << config_.max_seq;
  return model->embed_tokens->forward(ids);
}

Tensor Llama::pipeline_block(int64_t l, const Tensor& x, const Tensor&) {
  const LlamaDecoderLayer& layer = (*model->layers)[static_cast<size_t>(l)];
  return run_block(
      recomputes(l), [&layer, l](const Tensor& in) { return layer.forward(in, nullptr, l); }, x);
}

Tensor Llama::pipeline_loss(const Tensor& x, const Tensor& ids) {
  const int64_t T = ids.size(1);
  const Tensor h = model->norm->forward(x);
  Tensor logits = lm_head ? lm_head->forward(h) : engine::linear(h, model->embed_tokens->weight);
  return engine::cross_entropy(logits.slice(1, 0, T - 1), ids.slice(1, 1, T));
}

LanguageModel::PipelinePart llama_pipeline_part(const std::string& name, bool tied) {
  const std::string layers = "model.layers.";
  if (name.rfind(layers, 0) == 0) {
    const size_t at = layers.size();
    return {.block = std::stoll(name.substr(at, name.find('.', at) - at))};
  }
  if (name.rfind("model.embed_tokens.", 0) == 0) return {.embed = true, .head = tied};
  if (name.rfind("model.norm.", 0) == 0 || name.rfind("lm_head.", 0) == 0) return {.head = true};
  MAMMOTH_THROW() << "[llama_pipeline_part] parameter '" << name << "' belongs to no part";
}

LanguageModel::PipelinePart Llama::pipeline_part(const std::string& name) const {
  return llama_pipeline_part(name, config_.tie_embeddings);
}

HfLayout Llama::hf_layout() const {
  HfLayout layout = Model::hf_layout();
  layout.ignored = {"*.rotary_emb.inv_freq"};
  if (config_.tie_embeddings) layout.ignored.push_back("lm_head.weight");
  return layout;
}

}  // namespace mammoth::models
