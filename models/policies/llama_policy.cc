// LLaMA's sharding policy. The decoder layers are models/llama's own, built from
// Layers(tp, mode), which gives them these layers (parameter names stay Hugging Face's):
//
//   self_attn.q_proj     column-parallel by heads: rank r holds query heads [r H/tp, (r+1) H/tp)
//   self_attn.k_proj/v_proj  column-parallel by KV heads when Hk % tp == 0 (rank r holds the KV
//                        heads its query heads use); with fewer KV heads than ranks
//                        (tp % Hk == 0) rank r holds a copy of KV head r / (tp / Hk) (see
//                        policy.h); any other Hk is refused
//   self_attn.o_proj     row-parallel over the query heads
//   mlp.gate_proj/up_proj column-parallel (d_ff / tp), mlp.down_proj row-parallel
//
// What is LLaMA-specific and parallel lives here, in the sharded top:
//
//   model.embed_tokens   vocab-parallel, padded to a multiple of tp
//   lm_head              column-parallel over the (padded) vocabulary, or, tied, the embedding
//                        table; its logits stay split into the vocab-parallel cross-entropy
//   *layernorm, model.norm  RMSNorm, replicated (sequence-partial gradients under split_gather,
//                        summed by sync_grads)
//
// Rotary embeddings rotate each position by its global index (SeqContext::positions): the
// attention input holds the whole (padded) sequence without sp and under split_gather (the
// column-parallel projections all-gather it), T/sp contiguous positions from sp rank r * T/sp
// under Ulysses, and a zigzag pair of chunks under ring attention, each chunk rotated from its
// own first position.
//
// Qwen2's q/k/v biases split with their projections' rows; Mistral's sliding window reaches
// every attention form (local, Ulysses, ring) through Layers::attention, each of which masks by
// global position.
#include <memory>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/layers.h"
#include "models/llama/llama.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "parallel/sequence_parallel/sequence_parallel.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mammoth::models {

using engine::Tensor;
using engine::nn::RMSNorm;
using parallel::Axis;
using parallel::ColumnParallelLinear;
using parallel::Communicator;

namespace {

// HF's LlamaModel: embeddings, decoder layers and the final norm (the "model." prefix).
class TpLlamaModel : public engine::nn::Module {
 public:
  TpLlamaModel(const ModelConfig& c, Communicator& tp, SpMode mode) {
    embed_tokens = register_module(
        "embed_tokens", std::make_shared<parallel::VocabParallelEmbedding>(
                            c.vocab_size, c.d_model, c.dtype, tp, mode == SpMode::kSplitGather));
    layers = register_module("layers", std::make_shared<ModuleList<LlamaDecoderLayer>>());
    const Layers L(tp, mode);
    for (int64_t l = 0; l < c.n_layer; ++l) layers->add(std::make_shared<LlamaDecoderLayer>(c, L));
    norm = register_module("norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
  }
  std::shared_ptr<parallel::VocabParallelEmbedding> embed_tokens;
  std::shared_ptr<ModuleList<LlamaDecoderLayer>> layers;
  std::shared_ptr<RMSNorm> norm;
};

class TpLlama : public ShardedDecoder {
 public:
  TpLlama(const ModelConfig& config, const parallel::DeviceMesh& mesh, const ShardOptions& options)
      : ShardedDecoder(config, mesh, options) {
    const ModelConfig& c = config_;
    MAMMOTH_CHECK(c.rope_scaling != ModelConfig::RopeScaling::kDynamic)
        << "[llama_policy] rope_scaling 'dynamic' is not supported under tp / sp (its base "
           "depends on the whole sequence's length); linear and llama3 are";
    Communicator& tp = mesh.group(Axis::kTp);
    model = register_module("model", std::make_shared<TpLlamaModel>(c, tp, options.sp_mode));
    if (!c.tie_embeddings) {
      lm_head = register_module(
          "lm_head", std::make_shared<ColumnParallelLinear>(
                         c.d_model, c.vocab_size, false, c.dtype, tp,
                         ColumnParallelLinear::Options{.sequence_parallel = options.sp_mode ==
                                                                            SpMode::kSplitGather}));
    }
    for (int64_t l = 0; l < c.n_layer; ++l) {
      if ((*model->layers)[l].self_attn->kv_replicated())
        set_replicated_kv_heads("model.layers." + std::to_string(l) + ".self_attn.", c);
    }
    set_layer_specs();
  }

  // Pipeline stages (and, run in a row, the whole forward), each re-deriving the sequence plan
  // from T.
  Tensor pipeline_embed(const Tensor& ids) override {
    const SeqPlan plan = checked_plan(ids);
    // split_gather embeds the whole sequence and reduce-scatters it along the sequence.
    const bool sg = options_.sp_mode == SpMode::kSplitGather;
    return model->embed_tokens->forward(ids_at(ids, sg ? plan.every : plan.local));
  }
  Tensor pipeline_block(int64_t l, const Tensor& x, const Tensor& ids) override {
    const SeqContext seq = sequence_context(plan_sequence(ids.size(1)));
    const LlamaDecoderLayer* layer = &(*model->layers)[static_cast<size_t>(l)];
    return run_block(
        recomputes(l),
        [layer, seq, l](const Tensor& in) { return layer->forward(in, nullptr, l, seq); }, x);
  }
  PipelinePart pipeline_part(const std::string& name) const override {
    return llama_pipeline_part(name, config_.tie_embeddings);
  }
  bool supports_paged_kv() const override { return true; }

  std::shared_ptr<TpLlamaModel> model;
  std::shared_ptr<ColumnParallelLinear> lm_head;  // null when tied to model.embed_tokens

 private:
  SeqPlan checked_plan(const Tensor& ids) const {
    MAMMOTH_CHECK(ids.dim() == 2 && ids.dtype() == DType::kI64)
        << "[TpLlama::forward] ids must be i64 [B, T], got " << engine::shape_str(ids.shape());
    MAMMOTH_CHECK(ids.size(1) <= config_.max_seq)
        << "[TpLlama::forward] " << ids.size(1) << " positions exceed max_seq " << config_.max_seq;
    return plan_sequence(ids.size(1));
  }

  // The attention sees the whole padded sequence under split_gather (gathered by the
  // column-parallel projections), this rank's positions otherwise.
  SeqContext sequence_context(const SeqPlan& plan) const {
    const bool sg = options_.sp_mode == SpMode::kSplitGather;
    auto attn_rows = std::make_shared<const std::vector<int64_t>>(sg ? plan.every : plan.local);
    return SeqContext{.mode = options_.sp_mode,
                      .layout = plan.layout,
                      .sp = &mesh_.group(Axis::kSp),
                      .positions = attn_rows};
  }

  Tensor local_logits(const Tensor& x) const override {
    return head_logits(model->norm->forward(x));
  }
  int64_t vocab_start() const override { return model->embed_tokens->vocab_start(); }
  Tensor paged_embed(const Tensor& ids, const Tensor&) override {
    return model->embed_tokens->forward(ids.unsqueeze(0));
  }
  Tensor paged_block(int64_t l, const Tensor& x, const std::vector<PagedSequence>& seqs,
                     PagedKVCache* cache) override {
    return (*model->layers)[static_cast<size_t>(l)].forward_paged(x, seqs, cache, l);
  }
  // The head: columns of this rank's vocabulary shard, for every position under split_gather
  // (gathered), this rank's positions otherwise.
  Tensor head_logits(const Tensor& x) const {
    if (lm_head) return lm_head->forward(x);
    Communicator& tp = mesh_.group(Axis::kTp);
    const bool sg = options_.sp_mode == SpMode::kSplitGather;
    Tensor xh = sg ? parallel::all_gather_from_group(x, tp, 1) : parallel::copy_to_group(x, tp);
    return engine::linear(xh, model->embed_tokens->weight);
  }
};

}  // namespace

std::shared_ptr<ShardedLanguageModel> llama_policy(const Model& model,
                                                   const parallel::DeviceMesh& mesh,
                                                   const ShardOptions& options) {
  MAMMOTH_CHECK(model.config().family == Family::kLlama)
      << "[llama_policy] needs a LLaMA model, got " << family_name(model.config().family);
  return adopt(std::make_shared<TpLlama>(model.config(), mesh, options), model);
}

namespace {
[[maybe_unused]] const bool kRegistered = register_policy(Family::kLlama, llama_policy);
}  // namespace

}  // namespace mammoth::models
