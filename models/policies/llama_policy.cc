// LLaMA's sharding policy: the decoder of models/llama rebuilt from tensor-parallel layers, with
// Hugging Face's parameter names.
//
//   self_attn.q_proj     column-parallel by heads: rank r holds query heads [r H/tp, (r+1) H/tp)
//   self_attn.k_proj/v_proj  column-parallel by KV heads when Hk % tp == 0 (rank r holds the KV
//                        heads its query heads use); with fewer KV heads than ranks
//                        (tp % Hk == 0) rank r holds a copy of KV head r / (tp / Hk) (see
//                        policy.h); any other Hk is refused
//   self_attn.o_proj     row-parallel over the query heads
//   mlp.gate_proj/up_proj column-parallel (d_ff / tp), mlp.down_proj row-parallel
//   model.embed_tokens   vocab-parallel, padded to a multiple of tp
//   lm_head              column-parallel over the (padded) vocabulary, or, tied, the embedding
//                        table; its logits stay split into the vocab-parallel cross-entropy
//   *layernorm, model.norm  RMSNorm, replicated (sequence-partial gradients under split_gather,
//                        summed by sync_grads)
//
// Rotary embeddings rotate each position by its global index: the attention input holds the
// whole (padded) sequence without sp and under split_gather (the column-parallel projections
// all-gather it), T/sp contiguous positions from sp rank r * T/sp under Ulysses, and a zigzag
// pair of chunks under ring attention, each chunk rotated from its own first position.
//
// Qwen2's q/k/v biases split with their projections' rows; Mistral's sliding window is passed
// to every attention form (local, Ulysses, ring), each of which masks by global position.
#include <algorithm>
#include <memory>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/layers.h"
#include "models/llama/llama.h"
#include "models/llama/rope.h"
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
using parallel::RowParallelLinear;

namespace {

// What a layer needs to know about the sequence layout of its attention input.
struct SeqContext {
  SpMode mode = SpMode::kNone;
  // Owned, not borrowed: a recomputed (activation-checkpointed) layer runs again in backward.
  std::shared_ptr<const parallel::SequenceLayout> layout;  // ulysses / ring
  Communicator* sp = nullptr;
  // Global positions of the rows the attention sees, in order (>= T: padding).
  std::shared_ptr<const std::vector<int64_t>> positions;
};

// Rotary embedding of t [B, n, H, D] whose rows are the global `positions`: engine::rope takes
// one offset, so each run of consecutive positions is rotated from its first one. Dynamic NTK
// scaling (which needs the sequence length) is refused when the policy is built.
Tensor rope_at(const Tensor& t, const std::vector<int64_t>& positions, const ModelConfig& c) {
  const int64_t n = static_cast<int64_t>(positions.size());
  MAMMOTH_CHECK(t.size(1) == n) << "[llama_policy] " << t.size(1) << " rows but " << n
                                << " positions";
  std::vector<Tensor> runs;
  int64_t start = 0;
  for (int64_t i = 1; i <= n; ++i) {
    if (i < n && positions[i] == positions[i - 1] + 1) continue;
    Tensor part = start == 0 && i == n ? t : t.slice(1, start, i);
    runs.push_back(llama_rope(part, c, positions[start], 0));
    start = i;
  }
  return runs.size() == 1 ? runs[0] : engine::concat(runs, 1);
}

class TpLlamaAttention : public engine::nn::Module {
 public:
  TpLlamaAttention(const ModelConfig& c, Communicator& tp, bool sequence_parallel)
      : config_(c), tp_(tp) {
    const int p = tp.size();
    MAMMOTH_CHECK(c.rope_scaling != ModelConfig::RopeScaling::kDynamic)
        << "[llama_policy] rope_scaling 'dynamic' is not supported under tp / sp (its base "
           "depends on the whole sequence's length); linear and llama3 are";
    MAMMOTH_CHECK(c.n_head % p == 0)
        << "[llama_policy] n_head " << c.n_head << " does not divide by tp " << p;
    MAMMOTH_CHECK(c.n_kv_head % p == 0 || p % c.n_kv_head == 0)
        << "[llama_policy] " << c.n_kv_head << " key/value heads can neither be split over tp " << p
        << " (n_kv_head % tp != 0) nor replicated (tp % n_kv_head != 0); with n_head " << c.n_head
        << " a rank's query heads would need parts of several KV heads";
    const int64_t D = c.head_dim();
    // With fewer KV heads than ranks, each rank projects one (replicated) KV head: the
    // column-parallel layer then has tp heads' rows, one per rank.
    const int64_t kv_rows = std::max<int64_t>(c.n_kv_head, p) * D;
    ColumnParallelLinear::Options col{.sequence_parallel = sequence_parallel};
    RowParallelLinear::Options row{.sequence_parallel = sequence_parallel};
    const bool bias = c.qkv_bias;  // Qwen2: split with its projection's rows
    q_proj = register_module("q_proj", std::make_shared<ColumnParallelLinear>(
                                           c.d_model, c.n_head * D, bias, c.dtype, tp, col));
    k_proj = register_module("k_proj", std::make_shared<ColumnParallelLinear>(
                                           c.d_model, kv_rows, bias, c.dtype, tp, col));
    v_proj = register_module("v_proj", std::make_shared<ColumnParallelLinear>(
                                           c.d_model, kv_rows, bias, c.dtype, tp, col));
    o_proj = register_module("o_proj", std::make_shared<RowParallelLinear>(
                                           c.n_head * D, c.d_model, false, c.dtype, tp, row));
  }

  bool kv_replicated() const { return config_.n_kv_head < tp_.size(); }

  Tensor forward(const Tensor& x, const SeqContext& seq) const {
    const int64_t D = config_.head_dim(), Hl = config_.n_head / tp_.size();
    const int64_t Hkl = kv_replicated() ? 1 : config_.n_kv_head / tp_.size();
    // rope works on [B, n, H, D]; attention wants [B, H, n, D].
    auto project = [&](const ColumnParallelLinear& proj, int64_t heads, bool rotate) {
      Tensor t = proj.forward(x);
      t = t.view({t.size(0), t.size(1), heads, D});
      if (rotate) t = rope_at(t, *seq.positions, config_);
      return t.permute({0, 2, 1, 3}).contiguous();
    };
    Tensor q = project(*q_proj, Hl, true);
    Tensor k = project(*k_proj, Hkl, true);
    Tensor v = project(*v_proj, Hkl, false);
    const int64_t window = config_.sliding_window;  // Mistral; 0: none
    Tensor y;
    if (seq.mode == SpMode::kUlysses) {
      y = parallel::ulysses_attention(q, k, v, *seq.sp, *seq.layout, true, 0.0, window);
    } else if (seq.mode == SpMode::kRing) {
      y = parallel::ring_attention(q, k, v, *seq.sp, *seq.layout, true, 0.0, window);
    } else {
      y = attend(q, k, v, {.causal = true, .window = window}, config_.attn_dropout, is_training());
    }
    return o_proj->forward(merge_heads(y));
  }

  // x [1, N, C]: the new tokens of `seqs` (serving), this rank's heads in the paged cache; each
  // sequence's rows rotated from their own positions.
  Tensor forward_paged(const Tensor& x, const std::vector<PagedSequence>& seqs, PagedKVCache* cache,
                       int64_t layer) const {
    const int64_t D = config_.head_dim(), Hl = config_.n_head / tp_.size();
    const int64_t Hkl = kv_replicated() ? 1 : config_.n_kv_head / tp_.size(), N = x.size(1);
    std::vector<int64_t> positions;
    for (const PagedSequence& s : seqs) {
      for (int64_t p = s.start; p < s.start + s.count; ++p) positions.push_back(p);
    }
    auto project = [&](const ColumnParallelLinear& proj, int64_t heads, bool rotate) {
      Tensor t = proj.forward(x).reshape({1, N, heads, D});
      return rotate ? rope_at(t, positions, config_) : t;
    };
    const Tensor y =
        paged_attention(cache, layer, seqs, project(*q_proj, Hl, true), project(*k_proj, Hkl, true),
                        project(*v_proj, Hkl, false), config_.sliding_window);
    return o_proj->forward(y);
  }

  std::shared_ptr<ColumnParallelLinear> q_proj, k_proj, v_proj;
  std::shared_ptr<RowParallelLinear> o_proj;

 private:
  const ModelConfig& config_;
  Communicator& tp_;
};

class TpLlamaMlp : public engine::nn::Module {
 public:
  TpLlamaMlp(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    ColumnParallelLinear::Options col{.sequence_parallel = sequence_parallel};
    gate_proj = register_module("gate_proj", std::make_shared<ColumnParallelLinear>(
                                                 c.d_model, c.d_ff, false, c.dtype, tp, col));
    up_proj = register_module("up_proj", std::make_shared<ColumnParallelLinear>(
                                             c.d_model, c.d_ff, false, c.dtype, tp, col));
    down_proj = register_module(
        "down_proj", std::make_shared<RowParallelLinear>(
                         c.d_ff, c.d_model, false, c.dtype, tp,
                         RowParallelLinear::Options{.sequence_parallel = sequence_parallel}));
  }
  // down(silu(gate(x)) * up(x)): the product is elementwise over this rank's d_ff / tp columns.
  Tensor forward(const Tensor& x) const {
    return down_proj->forward(engine::silu(gate_proj->forward(x)) * up_proj->forward(x));
  }
  std::shared_ptr<ColumnParallelLinear> gate_proj, up_proj;
  std::shared_ptr<RowParallelLinear> down_proj;
};

class TpLlamaDecoderLayer : public engine::nn::Module {
 public:
  TpLlamaDecoderLayer(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    input_layernorm = register_module("input_layernorm",
                                      std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
    self_attn =
        register_module("self_attn", std::make_shared<TpLlamaAttention>(c, tp, sequence_parallel));
    post_attention_layernorm = register_module(
        "post_attention_layernorm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
    mlp = register_module("mlp", std::make_shared<TpLlamaMlp>(c, tp, sequence_parallel));
  }
  Tensor forward(const Tensor& x, const SeqContext& seq) const {
    Tensor h = x + self_attn->forward(input_layernorm->forward(x), seq);
    return h + mlp->forward(post_attention_layernorm->forward(h));
  }
  Tensor forward_paged(const Tensor& x, const std::vector<PagedSequence>& seqs, PagedKVCache* cache,
                       int64_t layer) const {
    Tensor h = x + self_attn->forward_paged(input_layernorm->forward(x), seqs, cache, layer);
    return h + mlp->forward(post_attention_layernorm->forward(h));
  }
  std::shared_ptr<RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<TpLlamaAttention> self_attn;
  std::shared_ptr<TpLlamaMlp> mlp;
};

// HF's LlamaModel: embeddings, decoder layers and the final norm (the "model." prefix).
class TpLlamaModel : public engine::nn::Module {
 public:
  TpLlamaModel(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    embed_tokens = register_module("embed_tokens",
                                   std::make_shared<parallel::VocabParallelEmbedding>(
                                       c.vocab_size, c.d_model, c.dtype, tp, sequence_parallel));
    layers = register_module("layers", std::make_shared<ModuleList<TpLlamaDecoderLayer>>());
    for (int64_t l = 0; l < c.n_layer; ++l) {
      layers->add(std::make_shared<TpLlamaDecoderLayer>(c, tp, sequence_parallel));
    }
    norm = register_module("norm", std::make_shared<RMSNorm>(c.d_model, c.norm_eps, c.dtype));
  }
  std::shared_ptr<parallel::VocabParallelEmbedding> embed_tokens;
  std::shared_ptr<ModuleList<TpLlamaDecoderLayer>> layers;
  std::shared_ptr<RMSNorm> norm;
};

class TpLlama : public ShardedDecoder {
 public:
  TpLlama(const ModelConfig& config, const parallel::DeviceMesh& mesh, const ShardOptions& options)
      : ShardedDecoder(config, mesh, options) {
    Communicator& tp = mesh.group(Axis::kTp);
    const bool sg = options.sp_mode == SpMode::kSplitGather;
    const ModelConfig& c = config_;
    model = register_module("model", std::make_shared<TpLlamaModel>(c, tp, sg));
    if (!c.tie_embeddings) {
      lm_head =
          register_module("lm_head", std::make_shared<ColumnParallelLinear>(
                                         c.d_model, c.vocab_size, false, c.dtype, tp,
                                         ColumnParallelLinear::Options{.sequence_parallel = sg}));
      set_spec("lm_head.weight", lm_head->weight_spec());
    }
    set_spec("model.embed_tokens.weight", model->embed_tokens->weight_spec());
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      const TpLlamaDecoderLayer& layer = (*model->layers)[l];
      const TpLlamaAttention& a = *layer.self_attn;
      // A bias [out] splits as its weight's rows (dim 0 of both).
      std::vector<std::string> params = {"weight"};
      if (c.qkv_bias) params.push_back("bias");
      for (const std::string& w : params) {
        set_spec(p + "self_attn.q_proj." + w, a.q_proj->weight_spec());
        for (const char* kv : {"self_attn.k_proj.", "self_attn.v_proj."}) {
          if (a.kv_replicated()) {
            set_replicated_heads(p + kv + w, c.n_kv_head, c.head_dim());
          } else {
            set_spec(p + kv + w, a.k_proj->weight_spec());
          }
        }
      }
      set_spec(p + "self_attn.o_proj.weight", a.o_proj->weight_spec());
      set_spec(p + "mlp.gate_proj.weight", layer.mlp->gate_proj->weight_spec());
      set_spec(p + "mlp.up_proj.weight", layer.mlp->up_proj->weight_spec());
      set_spec(p + "mlp.down_proj.weight", layer.mlp->down_proj->weight_spec());
    }
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
    const TpLlamaDecoderLayer* layer = &(*model->layers)[static_cast<size_t>(l)];
    return run_block(
        recomputes(l), [layer, seq](const Tensor& in) { return layer->forward(in, seq); }, x);
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
    return SeqContext{options_.sp_mode, plan.layout, &mesh_.group(Axis::kSp), attn_rows};
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

}  // namespace mammoth::models
