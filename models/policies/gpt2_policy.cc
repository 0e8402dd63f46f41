// GPT-2's sharding policy. The blocks are models/gpt2's own, built from Layers(tp, mode), which
// gives them these layers:
//
//   attn.c_attn  column-parallel, 3 segments (q|k|v): rank r holds heads [r H/tp, (r+1) H/tp)
//                of each of q, k and v
//   attn.c_proj  row-parallel over the same heads
//   mlp.c_fc     column-parallel (d_ff / tp), mlp.c_proj row-parallel
//
// What is GPT-2-specific and parallel lives here, in the sharded top:
//
//   wte          vocab-parallel, padded to a multiple of tp; also the tied LM head, whose
//                logits stay split by vocabulary into the vocab-parallel cross-entropy
//   wpe, ln_*    replicated
#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/gpt2/gpt2.h"
#include "models/layers.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "parallel/sequence_parallel/sequence_parallel.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mammoth::models {

using engine::Tensor;
using engine::nn::Dropout;
using engine::nn::Embedding;
using engine::nn::LayerNorm;
using parallel::Axis;
using parallel::Communicator;

namespace {

class TpGpt2 : public ShardedDecoder {
 public:
  TpGpt2(const ModelConfig& config, const parallel::DeviceMesh& mesh, const ShardOptions& options)
      : ShardedDecoder(config, mesh, options) {
    Communicator& tp = mesh.group(Axis::kTp);
    const bool sg = options.sp_mode == SpMode::kSplitGather;
    const ModelConfig& c = config_;
    wte = register_module("wte", std::make_shared<parallel::VocabParallelEmbedding>(
                                     c.vocab_size, c.d_model, c.dtype, tp, sg));
    wpe = register_module("wpe", std::make_shared<Embedding>(c.max_seq, c.d_model, c.dtype));
    drop_ = register_module("drop", std::make_shared<Dropout>(c.dropout));
    h = register_module("h", std::make_shared<ModuleList<Gpt2Block>>());
    const Layers layers(tp, options.sp_mode);
    for (int64_t l = 0; l < c.n_layer; ++l) h->add(std::make_shared<Gpt2Block>(config_, layers));
    ln_f = register_module("ln_f", std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
    set_layer_specs();
  }

  // Pipeline stages (and, run in a row, the whole forward), each re-deriving the sequence plan
  // from T.
  Tensor pipeline_embed(const Tensor& ids) override {
    const SeqPlan plan = checked_plan(ids);
    const bool sg = options_.sp_mode == SpMode::kSplitGather;
    const int64_t n = static_cast<int64_t>(plan.local.size());
    Tensor x = wte->forward(ids_at(ids, sg ? plan.every : plan.local));
    return drop_->forward(x + wpe->forward(Tensor::from_ints(plan.local, {n}).to(ids.device())));
  }
  Tensor pipeline_block(int64_t l, const Tensor& x, const Tensor& ids) override {
    const SeqPlan plan = plan_sequence(ids.size(1));
    const SeqContext seq{
        .mode = options_.sp_mode, .layout = plan.layout, .sp = &mesh_.group(Axis::kSp)};
    const Gpt2Block* block = &(*h)[static_cast<size_t>(l)];
    return run_block(
        recomputes(l),
        [block, seq, l](const Tensor& in) { return block->forward(in, nullptr, l, seq); }, x);
  }
  PipelinePart pipeline_part(const std::string& name) const override {
    return gpt2_pipeline_part(name);
  }
  bool supports_paged_kv() const override { return true; }

  std::shared_ptr<parallel::VocabParallelEmbedding> wte;
  std::shared_ptr<Embedding> wpe;
  std::shared_ptr<ModuleList<Gpt2Block>> h;
  std::shared_ptr<LayerNorm> ln_f;

 private:
  SeqPlan checked_plan(const Tensor& ids) const {
    MAMMOTH_CHECK(ids.dim() == 2 && ids.dtype() == DType::kI64)
        << "[TpGpt2::forward] ids must be i64 [B, T], got " << engine::shape_str(ids.shape());
    SeqPlan plan = plan_sequence(ids.size(1));
    MAMMOTH_CHECK(plan.layout->padded() <= config_.max_seq)
        << "[TpGpt2::forward] " << ids.size(1) << " positions padded to " << plan.layout->padded()
        << " exceed max_seq " << config_.max_seq;
    return plan;
  }
  Tensor local_logits(const Tensor& x) const override { return head_logits(ln_f->forward(x)); }
  int64_t vocab_start() const override { return wte->vocab_start(); }
  Tensor paged_embed(const Tensor& ids, const Tensor& pos) override {
    return drop_->forward(wte->forward(ids.unsqueeze(0)) + wpe->forward(pos.unsqueeze(0)));
  }
  Tensor paged_block(int64_t l, const Tensor& x, const std::vector<PagedSequence>& seqs,
                     PagedKVCache* cache) override {
    return (*h)[static_cast<size_t>(l)].forward_paged(x, seqs, cache, l);
  }
  // The tied head: columns of this rank's vocabulary shard, every position of the sequence
  // under split_gather (gathered), this rank's positions otherwise.
  Tensor head_logits(const Tensor& x) const {
    Communicator& tp = mesh_.group(Axis::kTp);
    const bool sg = options_.sp_mode == SpMode::kSplitGather;
    Tensor xh = sg ? parallel::all_gather_from_group(x, tp, 1) : parallel::copy_to_group(x, tp);
    return engine::linear(xh, wte->weight);
  }

  std::shared_ptr<Dropout> drop_;
};

}  // namespace

std::shared_ptr<ShardedLanguageModel> gpt2_policy(const Model& model,
                                                  const parallel::DeviceMesh& mesh,
                                                  const ShardOptions& options) {
  MAMMOTH_CHECK(model.config().tie_embeddings)
      << "[gpt2_policy] " << model.config().name
      << ": an untied GPT-2 head (tie_word_embeddings false, lm_head.weight) has no "
         "tensor-parallel form yet; train it without --tp/--sp";
  return adopt(std::make_shared<TpGpt2>(model.config(), mesh, options), model);
}

namespace {
[[maybe_unused]] const bool kRegistered = register_policy(Family::kGpt2, gpt2_policy);
}  // namespace

}  // namespace mammoth::models
