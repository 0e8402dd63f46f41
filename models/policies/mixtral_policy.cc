// Mixtral's sharding policy: tensor parallelism inside attention, the mixture of experts whole.
// The decoder layers are models/mixtral's own, built from Layers(tp, SpMode::kNone), which
// gives their attention LLaMA's layout (parameter names stay Hugging Face's):
//
//   self_attn.q_proj/k_proj/v_proj/o_proj   as in llama_policy.cc (query heads split, KV heads
//                        split or, fewer than tp, one replicated copy per rank)
//   block_sparse_moe.gate, .experts.*       whole on every tp rank (see models/mixtral)
//
// and the sharded top is LLaMA's: a vocab-parallel embedding and head (or, tied, the embedding
// table) whose logits stay split into the vocab-parallel cross-entropy, replicated RMSNorms.
// The loss adds the router losses of this forward, which every tp rank computes alike; its
// pipeline stages carry the router sums with the hidden states, as Mixtral's do.
//
// Sequence parallelism (split_gather, ulysses, ring) is not a form of this model: each rank
// would route only its positions, and the router losses average over all of them.
#include <memory>
#include <string>

#include "models/layers.h"
#include "models/mixtral/mixtral.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mammoth::models {

using engine::Tensor;
using engine::nn::RMSNorm;
using parallel::Axis;
using parallel::ColumnParallelLinear;
using parallel::Communicator;

namespace {

// HF's MixtralModel: embeddings, decoder layers and the final norm (the "model." prefix).
class TpMixtralModel : public engine::nn::Module {
 public:
  TpMixtralModel(const ModelConfig& c, Communicator& tp) {
    embed_tokens =
        register_module("embed_tokens", std::make_shared<parallel::VocabParallelEmbedding>(
                                            c.vocab_size, c.d_model, c.dtype, tp, false));
    layers = register_module("layers", std::make_shared<ModuleList<MixtralDecoderLayer>>());
    const Layers L(tp, SpMode::kNone);
    for (int64_t l = 0; l < c.n_layer; ++l)
      layers->add(std::make_shared<MixtralDecoderLayer>(c, L));
    norm = register_module("norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
  }
  std::shared_ptr<parallel::VocabParallelEmbedding> embed_tokens;
  std::shared_ptr<ModuleList<MixtralDecoderLayer>> layers;
  std::shared_ptr<RMSNorm> norm;
};

class TpMixtral : public ShardedDecoder {
 public:
  TpMixtral(const ModelConfig& config, const parallel::DeviceMesh& mesh,
            const ShardOptions& options)
      : ShardedDecoder(config, mesh, options) {
    const ModelConfig& c = config_;
    MAMMOTH_CHECK(options.sp_mode == SpMode::kNone && mesh.size(Axis::kSp) == 1)
        << "[mixtral_policy] sequence parallelism (--sp-mode " << sp_mode_name(options.sp_mode)
        << ", --sp " << mesh.size(Axis::kSp)
        << ") would split the tokens the router losses average over; mixtral runs under "
           "plain --tp";
    MAMMOTH_CHECK(c.rope_scaling != ModelConfig::RopeScaling::kDynamic)
        << "[mixtral_policy] rope_scaling 'dynamic' is not supported under tp (its base depends "
           "on the whole sequence's length); linear and llama3 are";
    Communicator& tp = mesh.group(Axis::kTp);
    model = register_module("model", std::make_shared<TpMixtralModel>(c, tp));
    if (!c.tie_embeddings) {
      lm_head = register_module(
          "lm_head", std::make_shared<ColumnParallelLinear>(c.d_model, c.vocab_size, false, c.dtype,
                                                            tp, ColumnParallelLinear::Options{}));
    }
    for (int64_t l = 0; l < c.n_layer; ++l) {
      if ((*model->layers)[l].self_attn->kv_replicated())
        set_replicated_kv_heads("model.layers." + std::to_string(l) + ".self_attn.", c);
    }
    set_layer_specs();
  }

  Tensor forward(const Tensor& ids) override {
    const int64_t T = ids.size(1);
    return gather_logits(local_logits(decode(ids)), plan_sequence(T), T, config_.vocab_size);
  }
  Tensor loss(const Tensor& ids, const Tensor& targets) override {
    const Tensor logits = local_logits(decode(ids));
    return with_router_losses(loss_from_local(logits, logit_rows(plan_sequence(ids.size(1))), ids,
                                              targets, vocab_start(), config_.vocab_size),
                              config_, *model);
  }

  // Pipeline stages as the one-device Mixtral's: a window ids [B, T + 1] routes its first T
  // positions, and each stage's activation carries the router sums of the layers so far
  // (pack_stage), so the last stage adds every layer's router losses. Every tp rank routes
  // alike (the MoE input is replicated), so the sums are the same on all of them.
  Tensor pipeline_embed(const Tensor& ids) override {
    const int64_t T = ids.size(1) - 1;
    MAMMOTH_CHECK(T >= 1) << "[TpMixtral::pipeline_embed] a window of " << ids.size(1)
                          << " tokens has no positions to predict";
    return pack_stage(embed(ids.slice(1, 0, T)), RouterSums{}, config_.moe_experts);
  }
  Tensor pipeline_block(int64_t l, const Tensor& x, const Tensor& ids) override {
    auto [h, sums] = unpack_stage(x, ids, config_);
    const MixtralDecoderLayer& layer = (*model->layers)[static_cast<size_t>(l)];
    h = layer.forward(h, nullptr, l);
    sums.add(*layer.block_sparse_moe);  // this micro-batch's, before another replaces it
    return pack_stage(h, sums, config_.moe_experts);
  }
  PipelinePart pipeline_part(const std::string& name) const override {
    return llama_pipeline_part(name, config_.tie_embeddings);
  }
  Tensor pipeline_loss(const Tensor& x, const Tensor& ids) override {
    const auto [h, sums] = unpack_stage(x, ids, config_);
    const int64_t T = ids.size(1) - 1;
    const Tensor loss =
        loss_from_local(local_logits(h), logit_rows(plan_sequence(T)), ids.slice(1, 0, T),
                        ids.slice(1, 1, T + 1), vocab_start(), config_.vocab_size);
    return with_router_losses(loss, config_, sums);
  }

  std::shared_ptr<TpMixtralModel> model;
  std::shared_ptr<ColumnParallelLinear> lm_head;  // null when tied to model.embed_tokens

 private:
  Tensor local_logits(const Tensor& x) const override {
    const Tensor h = model->norm->forward(x);
    if (lm_head) return lm_head->forward(h);
    return engine::linear(parallel::copy_to_group(h, mesh_.group(Axis::kTp)),
                          model->embed_tokens->weight);
  }
  int64_t vocab_start() const override { return model->embed_tokens->vocab_start(); }

  Tensor embed(const Tensor& ids) const {
    MAMMOTH_CHECK(ids.dim() == 2 && ids.dtype() == DType::kI64)
        << "[TpMixtral::forward] ids must be i64 [B, T], got " << engine::shape_str(ids.shape());
    MAMMOTH_CHECK(ids.size(1) <= config_.max_seq)
        << "[TpMixtral::forward] " << ids.size(1) << " positions exceed max_seq "
        << config_.max_seq;
    // A recomputed block would route again under no grad and lose the router losses' graph.
    MAMMOTH_CHECK(!is_training() || recompute_blocks_ == 0)
        << "[Mixtral] activation checkpointing (--recompute-blocks) is not supported for mixtral "
           "yet";
    return model->embed_tokens->forward(ids);
  }
  // The last decoder layer's output [B, T, C] for ids [B, T].
  Tensor decode(const Tensor& ids) const {
    Tensor x = embed(ids);
    for (int64_t l = 0; l < config_.n_layer; ++l)
      x = (*model->layers)[static_cast<size_t>(l)].forward(x, nullptr, l);
    return x;
  }
};

}  // namespace

std::shared_ptr<ShardedLanguageModel> mixtral_policy(const Model& model,
                                                     const parallel::DeviceMesh& mesh,
                                                     const ShardOptions& options) {
  MAMMOTH_CHECK(model.config().family == Family::kMixtral)
      << "[mixtral_policy] needs a Mixtral model, got " << family_name(model.config().family);
  return adopt(std::make_shared<TpMixtral>(model.config(), mesh, options), model);
}

namespace {
[[maybe_unused]] const bool kRegistered = register_policy(Family::kMixtral, mixtral_policy);
}  // namespace

}  // namespace mammoth::models
