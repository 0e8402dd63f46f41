// GPT-2's sharding policy: the blocks of models/gpt2 rebuilt from tensor-parallel layers.
//
//   attn.c_attn  column-parallel, 3 segments (q|k|v): rank r holds heads [r H/tp, (r+1) H/tp)
//                of each of q, k and v
//   attn.c_proj  row-parallel over the same heads
//   mlp.c_fc     column-parallel (d_ff / tp), mlp.c_proj row-parallel
//   wte          vocab-parallel, padded to a multiple of tp; also the tied LM head, whose
//                logits stay split by vocabulary into the vocab-parallel cross-entropy
//   wpe, ln_*    replicated
#include <cmath>

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
using parallel::ColumnParallelLinear;
using parallel::Communicator;
using parallel::RowParallelLinear;

namespace {

// What a block needs to know about the sequence layout of its input.
struct SeqContext {
  SpMode mode = SpMode::kNone;
  // Owned, not borrowed: a recomputed (activation-checkpointed) block runs again in backward.
  std::shared_ptr<const parallel::SequenceLayout> layout;  // ulysses / ring
  Communicator* sp = nullptr;
};

class TpGpt2Attention : public engine::nn::Module {
 public:
  TpGpt2Attention(const ModelConfig& c, Communicator& tp, bool sequence_parallel)
      : config_(c), tp_(tp) {
    MAMMOTH_CHECK(c.n_head % tp.size() == 0)
        << "[gpt2_policy] n_head " << c.n_head << " does not divide by tp " << tp.size();
    c_attn = register_module(
        "c_attn",
        std::make_shared<ColumnParallelLinear>(
            c.d_model, 3 * c.d_model, true, c.dtype, tp,
            ColumnParallelLinear::Options{.sequence_parallel = sequence_parallel, .parts = 3}));
    c_proj = register_module(
        "c_proj", std::make_shared<RowParallelLinear>(
                      c.d_model, c.d_model, true, c.dtype, tp,
                      RowParallelLinear::Options{.sequence_parallel = sequence_parallel}));
    resid_dropout_ = register_module("resid_dropout", std::make_shared<Dropout>(c.dropout));
  }

  Tensor forward(const Tensor& x, const SeqContext& seq) const {
    const int64_t Cl = config_.d_model / tp_.size(), Hl = config_.n_head / tp_.size();
    std::vector<Tensor> qkv = engine::split(c_attn->forward(x), {Cl, Cl, Cl}, -1);
    Tensor q = split_heads(qkv[0], Hl), k = split_heads(qkv[1], Hl), v = split_heads(qkv[2], Hl);
    Tensor y;
    if (seq.mode == SpMode::kUlysses) {
      y = parallel::ulysses_attention(q.contiguous(), k.contiguous(), v.contiguous(), *seq.sp,
                                      *seq.layout, true);
    } else if (seq.mode == SpMode::kRing) {
      y = parallel::ring_attention(q.contiguous(), k.contiguous(), v.contiguous(), *seq.sp,
                                   *seq.layout, true);
    } else {
      engine::AttentionOptions causal;
      causal.causal = true;
      y = attend(q, k, v, causal, config_.attn_dropout, is_training());
    }
    return resid_dropout_->forward(c_proj->forward(merge_heads(y)));
  }

  // x [1, N, C]: the new tokens of `seqs` (serving), this rank's heads in the paged cache.
  Tensor forward_paged(const Tensor& x, const std::vector<PagedSequence>& seqs, PagedKVCache* cache,
                       int64_t layer) const {
    const int64_t Cl = config_.d_model / tp_.size(), Hl = config_.n_head / tp_.size();
    const int64_t N = x.size(1), D = config_.head_dim();
    std::vector<Tensor> qkv = engine::split(c_attn->forward(x), {Cl, Cl, Cl}, -1);
    auto heads = [&](const Tensor& t) { return t.reshape({1, N, Hl, D}); };
    const Tensor y =
        paged_attention(cache, layer, seqs, heads(qkv[0]), heads(qkv[1]), heads(qkv[2]));
    return resid_dropout_->forward(c_proj->forward(y));
  }

  std::shared_ptr<ColumnParallelLinear> c_attn;
  std::shared_ptr<RowParallelLinear> c_proj;

 private:
  const ModelConfig& config_;
  Communicator& tp_;
  std::shared_ptr<Dropout> resid_dropout_;
};

class TpGpt2Mlp : public engine::nn::Module {
 public:
  TpGpt2Mlp(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    c_fc = register_module(
        "c_fc", std::make_shared<ColumnParallelLinear>(
                    c.d_model, c.d_ff, true, c.dtype, tp,
                    ColumnParallelLinear::Options{.sequence_parallel = sequence_parallel}));
    c_proj = register_module(
        "c_proj", std::make_shared<RowParallelLinear>(
                      c.d_ff, c.d_model, true, c.dtype, tp,
                      RowParallelLinear::Options{.sequence_parallel = sequence_parallel}));
    dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout));
  }
  Tensor forward(const Tensor& x) const {
    return dropout_->forward(c_proj->forward(engine::gelu_tanh(c_fc->forward(x))));
  }
  std::shared_ptr<ColumnParallelLinear> c_fc;
  std::shared_ptr<RowParallelLinear> c_proj;

 private:
  std::shared_ptr<Dropout> dropout_;
};

class TpGpt2Block : public engine::nn::Module {
 public:
  TpGpt2Block(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
    attn = register_module("attn", std::make_shared<TpGpt2Attention>(c, tp, sequence_parallel));
    ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
    mlp = register_module("mlp", std::make_shared<TpGpt2Mlp>(c, tp, sequence_parallel));
  }
  Tensor forward(const Tensor& x, const SeqContext& seq) const {
    Tensor h1 = x + attn->forward(ln_1->forward(x), seq);
    return h1 + mlp->forward(ln_2->forward(h1));
  }
  Tensor forward_paged(const Tensor& x, const std::vector<PagedSequence>& seqs, PagedKVCache* cache,
                       int64_t layer) const {
    Tensor h1 = x + attn->forward_paged(ln_1->forward(x), seqs, cache, layer);
    return h1 + mlp->forward(ln_2->forward(h1));
  }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<TpGpt2Attention> attn;
  std::shared_ptr<TpGpt2Mlp> mlp;
};

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
    h = register_module("h", std::make_shared<ModuleList<TpGpt2Block>>());
    for (int64_t l = 0; l < c.n_layer; ++l) h->add(std::make_shared<TpGpt2Block>(config_, tp, sg));
    ln_f = register_module("ln_f", std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
    set_spec("wte.weight", wte->weight_spec());
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      const TpGpt2Block& b = (*h)[l];
      set_spec(p + "attn.c_attn.weight", b.attn->c_attn->weight_spec());
      set_spec(p + "attn.c_attn.bias", b.attn->c_attn->weight_spec());
      set_spec(p + "attn.c_proj.weight", b.attn->c_proj->weight_spec());
      set_spec(p + "mlp.c_fc.weight", b.mlp->c_fc->weight_spec());
      set_spec(p + "mlp.c_fc.bias", b.mlp->c_fc->weight_spec());
      set_spec(p + "mlp.c_proj.weight", b.mlp->c_proj->weight_spec());
    }
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
    const SeqContext seq{options_.sp_mode, plan.layout, &mesh_.group(Axis::kSp)};
    const TpGpt2Block* block = &(*h)[static_cast<size_t>(l)];
    return run_block(
        recomputes(l), [block, seq](const Tensor& in) { return block->forward(in, seq); }, x);
  }
  PipelinePart pipeline_part(const std::string& name) const override {
    return gpt2_pipeline_part(name);
  }
  bool supports_paged_kv() const override { return true; }

  std::shared_ptr<parallel::VocabParallelEmbedding> wte;
  std::shared_ptr<Embedding> wpe;
  std::shared_ptr<ModuleList<TpGpt2Block>> h;
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

}  // namespace mammoth::models
