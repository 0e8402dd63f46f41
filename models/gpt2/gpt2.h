// GPT-2 (Radford et al. 2019) as in Hugging Face's GPT2LMHeadModel: pre-LN blocks, learned
// position embeddings, GELU (tanh approximation), LM head tied to the token embedding, or, with
// tie_word_embeddings false, its own "lm_head.weight" [V, C] (an nn.Linear without bias).
//
// Parameter names are GPT2Model's ("wte.weight", "h.0.attn.c_attn.weight", "ln_f.bias").
// Linear weights are kept as [out, in] like nn.Linear; HF's Conv1D stores [in, out], so the
// layout marks them transposed and models/weights.cc transposes on load and save.
#pragma once

#include <memory>

#include "engine/nn/module.h"
#include "models/layers.h"
#include "models/model.h"

namespace mammoth::models {

// The blocks are written once for every parallel layout: `L` gives them their linears (one
// device by default; column / row parallel over a tp group from a sharding policy) and they
// keep n_head / L.tp() heads and d_model / L.tp() of the attention width. `seq` says how the
// sequence is split (models/layers.h); the KV cache and the paged forward take the whole
// sequence.
class Gpt2Attention : public engine::nn::Module {
 public:
  explicit Gpt2Attention(const ModelConfig& c, const Layers& L = Layers());
  // x [B, T, C]; with a cache, T new positions after cache->length.
  engine::Tensor forward(const engine::Tensor& x, KVCache* cache, int64_t layer,
                         const SeqContext& seq = {}) const;
  // x [1, N, C]: the new tokens of `seqs`, concatenated (LanguageModel::forward_paged).
  engine::Tensor forward_paged(const engine::Tensor& x, const std::vector<PagedSequence>& seqs,
                               PagedKVCache* cache, int64_t layer) const;
  std::shared_ptr<engine::nn::Linear> c_attn;  // [3C, C]: q, k, v
  std::shared_ptr<engine::nn::Linear> c_proj;  // [C, C], N(0, 0.02 / sqrt(2 n_layer))

 private:
  const ModelConfig& config_;
  Layers layers_;
  int64_t heads_, width_;  // this rank's heads and their width (heads_ * head_dim)
  std::shared_ptr<engine::nn::Dropout> resid_dropout_;
};

class Gpt2Mlp : public engine::nn::Module {
 public:
  explicit Gpt2Mlp(const ModelConfig& c, const Layers& L = Layers());
  engine::Tensor forward(const engine::Tensor& x) const;
  std::shared_ptr<engine::nn::Linear> c_fc;    // [d_ff, C]
  std::shared_ptr<engine::nn::Linear> c_proj;  // [C, d_ff], N(0, 0.02 / sqrt(2 n_layer))

 private:
  std::shared_ptr<engine::nn::Dropout> dropout_;
};

class Gpt2Block : public engine::nn::Module {
 public:
  explicit Gpt2Block(const ModelConfig& c, const Layers& L = Layers());
  engine::Tensor forward(const engine::Tensor& x, KVCache* cache, int64_t layer,
                         const SeqContext& seq = {}) const;
  engine::Tensor forward_paged(const engine::Tensor& x, const std::vector<PagedSequence>& seqs,
                               PagedKVCache* cache, int64_t layer) const;
  std::shared_ptr<engine::nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<Gpt2Attention> attn;
  std::shared_ptr<Gpt2Mlp> mlp;
};

class Gpt2 : public LanguageModel {
 public:
  explicit Gpt2(ModelConfig config);
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

  std::shared_ptr<engine::nn::Embedding> wte, wpe;
  std::shared_ptr<ModuleList<Gpt2Block>> h;
  std::shared_ptr<engine::nn::LayerNorm> ln_f;
  std::shared_ptr<engine::nn::Linear> lm_head;  // null when tied to wte

 private:
  engine::Tensor head(const engine::Tensor& x) const;  // final hidden states -> logits
  engine::Tensor run(const engine::Tensor& ids, KVCache* cache);
  ModelConfig config_;
  std::shared_ptr<engine::nn::Dropout> drop_;
};

// Which part of GPT-2's forward uses parameter `name` (shared by its tp/sp form); `tied`: the
// head is wte.
LanguageModel::PipelinePart gpt2_pipeline_part(const std::string& name, bool tied = true);

}  // namespace mammoth::models
