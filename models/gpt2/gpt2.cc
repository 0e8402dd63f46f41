#include "models/gpt2/gpt2.h"

#include <cmath>
#include <tuple>

#include "engine/ops.h"

namespace mammoth::models {

using engine::Tensor;
using engine::nn::Dropout;
using engine::nn::Embedding;
using engine::nn::LayerNorm;
using engine::nn::Linear;

namespace {
// GPT-2 scales the residual projections' initial weights by 1/sqrt(2 n_layer).
double residual_std(const ModelConfig& c) { return 0.02 / std::sqrt(2.0 * c.n_layer); }
}  // namespace

Gpt2Attention::Gpt2Attention(const ModelConfig& c, const Layers& L)
    : config_(c),
      layers_(L),
      heads_(L.split(c.n_head, "n_head")),
      width_(L.split(c.d_model, "d_model")) {
  c_attn =
      register_module("c_attn", L.column(c.d_model, 3 * c.d_model, true, c.dtype, {.parts = 3}));
  c_proj = register_module(
      "c_proj", L.row(c.d_model, c.d_model, true, c.dtype, {.init_std = residual_std(c)}));
  resid_dropout_ = register_module("resid_dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor Gpt2Attention::forward(const Tensor& x, KVCache* cache, int64_t layer,
                              const SeqContext& seq) const {
  const int64_t C = width_;
  std::vector<Tensor> qkv = engine::split(c_attn->forward(x), {C, C, C}, -1);  // [B, T, C] each
  Tensor q = split_heads(qkv[0], heads_);                                      // [B, H, T, D]
  Tensor k = split_heads(qkv[1], heads_);
  Tensor v = split_heads(qkv[2], heads_);
  if (cache != nullptr) std::tie(k, v) = cache->append(layer, k, v);
  Tensor y = layers_.attention(q, k, v, {.causal = true}, config_.attn_dropout, is_training(), seq);
  return resid_dropout_->forward(c_proj->forward(merge_heads(y)));
}

Tensor Gpt2Attention::forward_paged(const Tensor& x, const std::vector<PagedSequence>& seqs,
                                    PagedKVCache* cache, int64_t layer) const {
  const int64_t C = width_, N = x.size(1), D = config_.head_dim();
  std::vector<Tensor> qkv = engine::split(c_attn->forward(x), {C, C, C}, -1);  // [1, N, C] each
  auto heads = [&](const Tensor& t) { return t.reshape({1, N, heads_, D}); };
  const Tensor y = paged_attention(cache, layer, seqs, heads(qkv[0]), heads(qkv[1]), heads(qkv[2]));
  return resid_dropout_->forward(c_proj->forward(y));
}

Gpt2Mlp::Gpt2Mlp(const ModelConfig& c, const Layers& L) {
  c_fc = register_module("c_fc", L.column(c.d_model, c.d_ff, true, c.dtype));
  c_proj = register_module("c_proj",
                           L.row(c.d_ff, c.d_model, true, c.dtype, {.init_std = residual_std(c)}));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor Gpt2Mlp::forward(const Tensor& x) const {
  return dropout_->forward(c_proj->forward(engine::gelu_tanh(c_fc->forward(x))));
}

Gpt2Block::Gpt2Block(const ModelConfig& c, const Layers& L) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
  attn = register_module("attn", std::make_shared<Gpt2Attention>(c, L));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
  mlp = register_module("mlp", std::make_shared<Gpt2Mlp>(c, L));
}

Tensor Gpt2Block::forward(const Tensor& x, KVCache* cache, int64_t layer,
                          const SeqContext& seq) const {
  Tensor h1 = x + attn->forward(ln_1->forward(x), cache, layer, seq);
  return h1 + mlp->forward(ln_2->forward(h1));
}

Tensor Gpt2Block::forward_paged(const Tensor& x, const std::vector<PagedSequence>& seqs,
                                PagedKVCache* cache, int64_t layer) const {
  Tensor h1 = x + attn->forward_paged(ln_1->forward(x), seqs, cache, layer);
  return h1 + mlp->forward(ln_2->forward(h1));
}

Gpt2::Gpt2(ModelConfig config) : config_(std::move(config)) {
  config_.validate();
  const ModelConfig& c = config_;
  wte = register_module("wte", std::make_shared<Embedding>(c.vocab_size, c.d_model, c.dtype));
  wpe = register_module("wpe", std::make_shared<Embedding>(c.max_seq, c.d_model, c.dtype));
  drop_ = register_module("drop", std::make_shared<Dropout>(c.dropout));
  h = register_module("h", std::make_shared<ModuleList<Gpt2Block>>());
  for (int64_t l = 0; l < c.n_layer; ++l) h->add(std::make_shared<Gpt2Block>(config_));
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
  if (!c.tie_embeddings) {
    lm_head = register_module("lm_head",
                              std::make_shared<Linear>(c.d_model, c.vocab_size, false, c.dtype));
  }
}

Tensor Gpt2::head(const Tensor& x) const {
  const Tensor h = ln_f->forward(x);
  return lm_head ? lm_head->forward(h) : engine::linear(h, wte->weight);  // [B, T, V]
}

Tensor Gpt2::run(const Tensor& ids, KVCache* cache) {
  MAMMOTH_CHECK(ids.dim() == 2 && ids.dtype() == DType::kI64)
      << "[Gpt2::forward] ids must be i64 [B, T], got " << dtype_name(ids.dtype()) << " "
      << engine::shape_str(ids.shape());
  const int64_t T = ids.size(1);
  const int64_t offset = cache != nullptr ? cache->length : 0;
  MAMMOTH_CHECK(offset + T <= config_.max_seq)
      << "[Gpt2::forward] positions up to " << offset + T << " exceed max_seq " << config_.max_seq;
  Tensor x = wte->forward(ids) + wpe->forward(positions(offset, T, ids.device()));  // [B, T, C]
  x = drop_->forward(x);
  for (size_t l = 0; l < h->size(); ++l) {
    const Gpt2Block& block = (*h)[l];
    const int64_t layer = static_cast<int64_t>(l);
    if (cache != nullptr) {
      x = block.forward(x, cache, layer);
      continue;
    }
    x = run_block(
        recomputes(layer),
        [&block, layer](const Tensor& in) { return block.forward(in, nullptr, layer); }, x);
  }
  if (cache != nullptr) cache->length += T;
  return head(x);
}

Tensor Gpt2::forward(const Tensor& ids) { return run(ids, nullptr); }

Tensor Gpt2::forward_cached(const Tensor& ids, KVCache* cache) {
  MAMMOTH_CHECK(cache != nullptr) << "[Gpt2::forward_cached] cache is null";
  return run(ids, cache);
}

Tensor Gpt2::forward_paged(const Tensor& ids, const std::vector<PagedSequence>& seqs,
                           PagedKVCache* cache) {
  MAMMOTH_CHECK(cache != nullptr) << "[Gpt2::forward_paged] cache is null";
  const Tensor pos = paged_positions(ids, seqs, *cache, config_.max_seq, "Gpt2::forward_paged");
  Tensor x = wte->forward(ids.unsqueeze(0)) + wpe->forward(pos.unsqueeze(0));  // [1, N, C]
  x = drop_->forward(x);
  for (size_t l = 0; l < h->size(); ++l) {
    x = (*h)[l].forward_paged(x, seqs, cache, static_cast<int64_t>(l));
  }
  return head(paged_last_rows(x, seqs)).select(0, 0);  // [S, V]
}

Tensor Gpt2::pipeline_embed(const Tensor& ids) {
  const int64_t T = ids.size(1);
  MAMMOTH_CHECK(T <= config_.max_seq)
      << "[Gpt2::pipeline_embed] " << T << " positions exceed max_seq " << config_.max_seq;
  return drop_->forward(wte->forward(ids) + wpe->forward(positions(0, T, ids.device())));
}

Tensor Gpt2::pipeline_block(int64_t l, const Tensor& x, const Tensor&) {
  const Gpt2Block& block = (*h)[static_cast<size_t>(l)];
  return run_block(
      recomputes(l), [&block, l](const Tensor& in) { return block.forward(in, nullptr, l); }, x);
}

Tensor Gpt2::pipeline_loss(const Tensor& x, const Tensor& ids) {
  const int64_t T = ids.size(1);
  Tensor logits = head(x);
  return engine::cross_entropy(logits.slice(1, 0, T - 1), ids.slice(1, 1, T));
}

LanguageModel::PipelinePart gpt2_pipeline_part(const std::string& name, bool tied) {
  if (name.rfind("h.", 0) == 0) return {.block = std::stoll(name.substr(2, name.find('.', 2) - 2))};
  if (name.rfind("wte.", 0) == 0) return {.embed = true, .head = tied};
  if (name.rfind("wpe.", 0) == 0) return {.embed = true};
  if (name.rfind("ln_f.", 0) == 0 || name.rfind("lm_head.", 0) == 0) return {.head = true};
  MAMMOTH_THROW() << "[gpt2_pipeline_part] parameter '" << name << "' belongs to no part";
}

LanguageModel::PipelinePart Gpt2::pipeline_part(const std::string& name) const {
  return gpt2_pipeline_part(name, config_.tie_embeddings);
}

HfLayout Gpt2::hf_layout() const {
  // Tied: GPT2Model's names ("h.0...", what transformers loads into either class). Untied: the
  // head needs GPT2LMHeadModel's layout, "transformer.h.0..." beside "lm_head.weight"
  // (transformers refuses a prefix-less file that holds lm_head.weight). Either spelling loads.
  const bool tied = config_.tie_embeddings;
  HfLayout layout;
  for (const auto& [name, t] : named_parameters()) {
    // Conv1D modules: every 2-D weight inside the blocks (c_attn, c_proj, c_fc).
    const bool conv1d = name.rfind("h.", 0) == 0 && t.dim() == 2;
    const bool head = name.rfind("lm_head.", 0) == 0;
    layout.params.push_back({name, tied || head ? name : "transformer." + name, conv1d, false});
  }
  if (tied) {
    layout.prefix_aliases = {{"wte.", "transformer.wte."},
                             {"wpe.", "transformer.wpe."},
                             {"h.", "transformer.h."},
                             {"ln_f.", "transformer.ln_f."}};
  } else {
    layout.prefix_aliases = {{"transformer.", ""}};
  }
  layout.ignored = {"*.attn.bias", "*.attn.masked_bias"};
  // A tied head's copy in the file is the embedding again.
  if (tied) layout.ignored.push_back("lm_head.weight");
  return layout;
}

}  // namespace mammoth::models
