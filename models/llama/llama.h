// LLaMA as in Hugging Face's LlamaForCausalLM: pre-norm RMSNorm blocks, rotary position
// embeddings (rotate-half form), SwiGLU MLP, grouped-query attention, untied LM head (tied
// when the config says tie_word_embeddings). The same classes are Mistral (a sliding attention
// window, ModelConfig::sliding_window) and Qwen2 (q/k/v biases, ModelConfig::qkv_bias).
//
// Parameter names are HF's: "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
// "model.layers.0.mlp.gate_proj.weight", "model.norm.weight", "lm_head.weight".
#pragma once

#include <memory>

#include "engine/nn/module.h"
#include "models/layers.h"
#include "models/model.h"

namespace mammoth::models {

// The blocks are written once for every parallel layout: `L` gives them their linears (one
// device by default; column / row parallel over a tp group from a sharding policy) and they
// keep n_head / L.tp() query heads, n_kv_head / L.tp() key/value heads (or, with fewer KV heads
// than ranks, one copy of the KV head their query heads use: models/policies/policy.h) and
// d_ff / L.tp() of the MLP. `seq` says how the sequence is split (models/layers.h); its
// positions, when given, are the global positions the rotary embedding rotates by. The KV
// cache and the paged forward take the whole sequence.
class LlamaAttention : public engine::nn::Module {
 public:
  explicit LlamaAttention(const ModelConfig& c, const Layers& L = Layers());
  engine::Tensor forward(const engine::Tensor& x, KVCache* cache, int64_t layer,
                         const SeqContext& seq = {}) const;
  // x [1, N, C]: the new tokens of `seqs`, concatenated (LanguageModel::forward_paged).
  engine::Tensor forward_paged(const engine::Tensor& x, const std::vector<PagedSequence>& seqs,
                               PagedKVCache* cache, int64_t layer) const;
  // Whether each rank holds a copy of one KV head (fewer KV heads than tp ranks).
  bool kv_replicated() const { return config_.n_kv_head < layers_.tp(); }
  std::shared_ptr<engine::nn::Linear> q_proj, k_proj, v_proj, o_proj;

 private:
  const ModelConfig& config_;
  Layers layers_;
  int64_t heads_, kv_heads_;  // this rank's
};

class LlamaMlp : public engine::nn::Module {
 public:
  explicit LlamaMlp(const ModelConfig& c, const Layers& L = Layers());
  // down(silu(gate(x)) * up(x)); under tp the product is elementwise over this rank's columns.
  engine::Tensor forward(const engine::Tensor& x) const;
  std::shared_ptr<engine::nn::Linear> gate_proj, up_proj, down_proj;
};

class LlamaDecoderLayer : public engine::nn::Module {
 public:
  explicit LlamaDecoderLayer(const ModelConfig& c, const Layers& L = Layers());
  engine::Tensor forward(const engine::Tensor& x, KVCache* cache, int64_t layer,
                         const SeqContext& seq = {}) const;
  engine::Tensor forward_paged(const engine::Tensor& x, const std::vector<PagedSequence>& seqs,
                               PagedKVCache* cache, int64_t layer) const;
  std::shared_ptr<engine::nn::RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<LlamaAttention> self_attn;
  std::shared_ptr<LlamaMlp> mlp;
};

// HF's LlamaModel: the decoder stack without the head.
class LlamaModel : public engine::nn::Module {
 public:
  explicit LlamaModel(const ModelConfig& c);
  // ids [B, T] -> final normed hidden states [B, T, C]
  engine::Tensor forward(const engine::Tensor& ids, KVCache* cache) const;
  // ids [N] -> final normed hidden states [1, N, C] (LanguageModel::forward_paged)
  engine::Tensor forward_paged(const engine::Tensor& ids, const std::vector<PagedSequence>& seqs,
                               PagedKVCache* cache) const;
  int64_t recompute_blocks = 0;  // Model::recompute_blocks() while training, set by Llama
  std::shared_ptr<engine::nn::Embedding> embed_tokens;
  std::shared_ptr<ModuleList<LlamaDecoderLayer>> layers;
  std::shared_ptr<engine::nn::RMSNorm> norm;

 private:
  const ModelConfig& config_;
};

class Llama : public LanguageModel {
 public:
  explicit Llama(ModelConfig config);
  engine::Tensor forward(const engine::Tensor& ids) override;
  bool supports_kv_cache() const override { return true; }
  engine::Tensor forward_cached(const engine::Tensor& ids, KVCache* cache) override;
  bool supports_paged_kv() const override { return true; }
  engine::Tensor forward_paged(const engine::Tensor& ids, const std::vector<PagedSequence>& seqs,
                               PagedKVCache* cache) override;
  const ModelConfig& config() const override { return config_; }
  HfLayout hf_layout() const override;

  bool supports_pipeline() const override { return true; }
  engine::Tensor pipeline_embed(const engine::Tensor& ids) override;
  engine::Tensor pipeline_block(int64_t l, const engine::Tensor& x,
                                const engine::Tensor& ids) override;
  engine::Tensor pipeline_loss(const engine::Tensor& x, const engine::Tensor& ids) override;
  PipelinePart pipeline_part(const std::string& name) const override;

  std::shared_ptr<LlamaModel> model;
  std::shared_ptr<engine::nn::Linear> lm_head;  // null when tied to model.embed_tokens

 private:
  engine::Tensor run(const engine::Tensor& ids, KVCache* cache);
  ModelConfig config_;
};

// Which part of LLaMA's forward uses parameter `name` (shared by its tp/sp form); `tied`: the
// head reuses the embedding.
LanguageModel::PipelinePart llama_pipeline_part(const std::string& name, bool tied);

}  // namespace mammoth::models
