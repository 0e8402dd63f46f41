// BERT's sharding policy (the masked-LM path of models/bert): the encoder rebuilt from
// tensor-parallel layers, with Hugging Face's parameter names.
//
//   attention.self.query/key/value  column-parallel by heads: rank r holds heads
//                                   [r H/tp, (r+1) H/tp) of each (weights and biases)
//   attention.output.dense          row-parallel over the same heads
//   intermediate.dense              column-parallel (d_ff / tp), output.dense row-parallel
//   embeddings.word_embeddings      vocab-parallel, padded to a multiple of tp; also the tied
//                                   MLM decoder, whose logits stay split by vocabulary into the
//                                   vocab-parallel cross-entropy
//   cls.predictions.bias            split by vocabulary like the decoder's rows
//   position/token-type embeddings, LayerNorms, cls.predictions.transform, pooler, classifier
//                                   replicated (the pooler and classifier are not used by the
//                                   MLM loss and keep no gradient)
//
// Attention is bidirectional: padded positions (sequences that do not divide) are keys nobody
// attends to (a key mask under split_gather; ulysses_attention and ring_attention mask them
// themselves). Only forward(ids) and loss(ids, targets) exist in the sharded form: no attention
// mask or token types (token type 0 everywhere, as Bert::forward), no classification.
#include <memory>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/layers.h"
#include "models/policies/encoder_attention.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "parallel/sequence_parallel/sequence_parallel.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mammoth::models {

using engine::Tensor;
using engine::nn::Dropout;
using engine::nn::Embedding;
using engine::nn::LayerNorm;
using engine::nn::Linear;
using parallel::Axis;
using parallel::ColumnParallelLinear;
using parallel::Communicator;
using parallel::RowParallelLinear;

namespace {

// What the attention needs to know about the sequence layout of its input.
using SeqContext = EncoderSeqContext;

class TpBertEmbeddings : public engine::nn::Module {
 public:
  TpBertEmbeddings(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    word_embeddings = register_module("word_embeddings",
                                      std::make_shared<parallel::VocabParallelEmbedding>(
                                          c.vocab_size, c.d_model, c.dtype, tp, sequence_parallel));
    position_embeddings = register_module(
        "position_embeddings", std::make_shared<Embedding>(c.max_seq, c.d_model, c.dtype));
    token_type_embeddings =
        register_module("token_type_embeddings",
                        std::make_shared<Embedding>(c.type_vocab_size, c.d_model, c.dtype));
    LayerNorm = register_module(
        "LayerNorm", std::make_shared<engine::nn::LayerNorm>(c.d_model, c.norm_eps, c.dtype));
    dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout));
  }
  // ids: the tokens word_embeddings looks up (the whole padded sequence under split_gather,
  // which it reduce-scatters); local: the global positions of this rank's rows.
  Tensor forward(const Tensor& ids, const std::vector<int64_t>& local) const {
    const int64_t B = ids.size(0), n = static_cast<int64_t>(local.size());
    Tensor x = word_embeddings->forward(ids);
    x = x + position_embeddings->forward(Tensor::from_ints(local, {n}).to(ids.device()));
    x = x + token_type_embeddings->forward(Tensor::zeros({B, n}, DType::kI64, ids.device()));
    return dropout->forward(LayerNorm->forward(x));
  }
  std::shared_ptr<parallel::VocabParallelEmbedding> word_embeddings;
  std::shared_ptr<Embedding> position_embeddings, token_type_embeddings;
  std::shared_ptr<engine::nn::LayerNorm> LayerNorm;  // NOLINT: HF's name
  std::shared_ptr<Dropout> dropout;
};

// dense (row-parallel) -> dropout -> LayerNorm(x + residual).
class TpBertResidualOutput : public engine::nn::Module {
 public:
  TpBertResidualOutput(const ModelConfig& c, int64_t in, Communicator& tp, bool sequence_parallel) {
    dense = register_module(
        "dense", std::make_shared<RowParallelLinear>(
                     in, c.d_model, true, c.dtype, tp,
                     RowParallelLinear::Options{.sequence_parallel = sequence_parallel}));
    LayerNorm = register_module(
        "LayerNorm", std::make_shared<engine::nn::LayerNorm>(c.d_model, c.norm_eps, c.dtype));
    dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout));
  }
  Tensor forward(const Tensor& x, const Tensor& residual) const {
    return LayerNorm->forward(dropout->forward(dense->forward(x)) + residual);
  }
  std::shared_ptr<RowParallelLinear> dense;
  std::shared_ptr<engine::nn::LayerNorm> LayerNorm;  // NOLINT: HF's name
  std::shared_ptr<Dropout> dropout;
};

class TpBertAttention : public engine::nn::Module {
 public:
  TpBertAttention(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    self = register_module(
        "self", std::make_shared<TpEncoderSelfAttention>(c, tp, sequence_parallel, "bert_policy"));
    output = register_module(
        "output", std::make_shared<TpBertResidualOutput>(c, c.d_model, tp, sequence_parallel));
  }
  Tensor forward(const Tensor& x, const SeqContext& seq) const {
    return output->forward(self->forward(x, seq), x);
  }
  std::shared_ptr<TpEncoderSelfAttention> self;
  std::shared_ptr<TpBertResidualOutput> output;
};

class TpBertIntermediate : public engine::nn::Module {
 public:
  TpBertIntermediate(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    dense = register_module(
        "dense", std::make_shared<ColumnParallelLinear>(
                     c.d_model, c.d_ff, true, c.dtype, tp,
                     ColumnParallelLinear::Options{.sequence_parallel = sequence_parallel}));
  }
  Tensor forward(const Tensor& x) const { return engine::gelu(dense->forward(x)); }
  std::shared_ptr<ColumnParallelLinear> dense;
};

class TpBertLayer : public engine::nn::Module {
 public:
  TpBertLayer(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    attention =
        register_module("attention", std::make_shared<TpBertAttention>(c, tp, sequence_parallel));
    intermediate = register_module("intermediate",
                                   std::make_shared<TpBertIntermediate>(c, tp, sequence_parallel));
    output = register_module(
        "output", std::make_shared<TpBertResidualOutput>(c, c.d_ff, tp, sequence_parallel));
  }
  Tensor forward(const Tensor& x, const SeqContext& seq) const {
    Tensor a = attention->forward(x, seq);
    return output->forward(intermediate->forward(a), a);
  }
  std::shared_ptr<TpBertAttention> attention;
  std::shared_ptr<TpBertIntermediate> intermediate;
  std::shared_ptr<TpBertResidualOutput> output;
};

// A module holding one replicated Linear as "dense" (the pooler; the head's transform adds a
// LayerNorm).
class DenseHolder : public engine::nn::Module {
 public:
  DenseHolder(const ModelConfig& c, bool with_layer_norm) {
    dense = register_module("dense", std::make_shared<Linear>(c.d_model, c.d_model, true, c.dtype));
    if (with_layer_norm) {
      LayerNorm = register_module(
          "LayerNorm", std::make_shared<engine::nn::LayerNorm>(c.d_model, c.norm_eps, c.dtype));
    }
  }
  std::shared_ptr<Linear> dense;
  std::shared_ptr<engine::nn::LayerNorm> LayerNorm;  // NOLINT: HF's name
};

class TpBertModel : public engine::nn::Module {
 public:
  TpBertModel(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    embeddings =
        register_module("embeddings", std::make_shared<TpBertEmbeddings>(c, tp, sequence_parallel));
    encoder = register_module("encoder",
                              std::make_shared<TpEncoder<TpBertLayer>>(c, tp, sequence_parallel));
    pooler = register_module("pooler", std::make_shared<DenseHolder>(c, false));
  }
  std::shared_ptr<TpBertEmbeddings> embeddings;
  std::shared_ptr<TpEncoder<TpBertLayer>> encoder;
  std::shared_ptr<DenseHolder> pooler;  // not used by the MLM loss
};

// "cls.predictions": the transform and this rank's slice of the decoder bias.
class TpBertPredictionHead : public engine::nn::Module {
 public:
  TpBertPredictionHead(const ModelConfig& c, int64_t local_vocab) {
    transform = register_module("transform", std::make_shared<DenseHolder>(c, true));
    bias = register_parameter("bias", Tensor::zeros({local_vocab}, c.dtype));
  }
  std::shared_ptr<DenseHolder> transform;
  Tensor bias;  // [Vp/tp]
};

class TpBertOnlyMLMHead : public engine::nn::Module {
 public:
  TpBertOnlyMLMHead(const ModelConfig& c, int64_t local_vocab) {
    predictions =
        register_module("predictions", std::make_shared<TpBertPredictionHead>(c, local_vocab));
  }
  std::shared_ptr<TpBertPredictionHead> predictions;
};

class TpBert : public ShardedLanguageModel {
 public:
  TpBert(const ModelConfig& config, const parallel::DeviceMesh& mesh, const ShardOptions& options)
      : ShardedLanguageModel(mesh, options), config_(config) {
    Communicator& tp = mesh.group(Axis::kTp);
    const bool sg = options.sp_mode == SpMode::kSplitGather;
    const ModelConfig& c = config_;
    bert = register_module("bert", std::make_shared<TpBertModel>(c, tp, sg));
    const parallel::ShardSpec vocab = bert->embeddings->word_embeddings->weight_spec();
    predictions =
        register_module("cls", std::make_shared<TpBertOnlyMLMHead>(c, vocab.padded / tp.size()))
            ->predictions;
    register_module("dropout", std::make_shared<Dropout>(c.dropout));  // the classifier's
    if (c.num_labels > 0) {
      register_module("classifier",
                      std::make_shared<Linear>(c.d_model, c.num_labels, true, c.dtype));
    }
    set_spec("bert.embeddings.word_embeddings.weight", vocab);
    set_spec("cls.predictions.bias", vocab);
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string p = "bert.encoder.layer." + std::to_string(l) + ".";
      const TpBertLayer& layer = (*bert->encoder->layer)[l];
      const TpEncoderSelfAttention& self = *layer.attention->self;
      for (const auto& [name, spec] : self.shard_specs(p + "attention.self.")) set_spec(name, spec);
      set_spec(p + "attention.output.dense.weight", layer.attention->output->dense->weight_spec());
      set_spec(p + "intermediate.dense.weight", layer.intermediate->dense->weight_spec());
      set_spec(p + "intermediate.dense.bias", layer.intermediate->dense->weight_spec());
      set_spec(p + "output.dense.weight", layer.output->dense->weight_spec());
    }
  }

  const ModelConfig& config() const override { return config_; }
  HfLayout hf_layout() const override { return build_model(config_)->hf_layout(); }

  Tensor forward(const Tensor& ids) override {
    Local l = run(ids);
    return gather_logits(l.logits, l.plan, ids.size(1), config_.vocab_size);
  }

  Tensor loss(const Tensor& ids, const Tensor& targets) override {
    MAMMOTH_CHECK(targets.defined())
        << "[TpBert::loss] BERT is a masked LM: pass targets [B, T] with -100 at unmasked "
           "positions";
    Local l = run(ids);
    return loss_from_local(l.logits, l.rows, ids, targets,
                           bert->embeddings->word_embeddings->vocab_start(), config_.vocab_size);
  }

  std::shared_ptr<TpBertModel> bert;
  std::shared_ptr<TpBertPredictionHead> predictions;

 private:
  struct Local {
    Tensor logits;              // [B, n, Vp/tp]: the rows of `rows`
    std::vector<int64_t> rows;  // global positions (>= T: padding)
    SeqPlan plan;
  };

  Local run(const Tensor& ids) {
    MAMMOTH_CHECK(ids.dim() == 2 && ids.dtype() == DType::kI64)
        << "[TpBert::forward] ids must be i64 [B, T], got " << engine::shape_str(ids.shape());
    const int64_t B = ids.size(0), T = ids.size(1);
    Communicator& tp = mesh_.group(Axis::kTp);
    const SpMode mode = options_.sp_mode;
    const bool sg = mode == SpMode::kSplitGather;
    Local out;
    out.plan = plan_sequence(T);
    const SeqPlan& plan = out.plan;
    MAMMOTH_CHECK(plan.layout->padded() <= config_.max_seq)
        << "[TpBert::forward] " << T << " positions padded to " << plan.layout->padded()
        << " exceed max_seq " << config_.max_seq;
    SeqContext seq{mode, plan.layout, &mesh_.group(Axis::kSp), Tensor()};
    if (sg && plan.layout->padded() > T) {
      std::vector<double> keep(static_cast<size_t>(B * plan.layout->padded()));
      for (size_t i = 0; i < keep.size(); ++i) {
        keep[i] = static_cast<int64_t>(i) % plan.layout->padded() < T ? 1.0 : 0.0;
      }
      seq.key_mask =
          Tensor::from_vector(keep, {B, plan.layout->padded()}, DType::kBool).to(ids.device());
    }
    Tensor x = bert->embeddings->forward(ids_at(ids, sg ? plan.every : plan.local), plan.local);
    for (size_t l = 0; l < bert->encoder->layer->size(); ++l) {
      const TpBertLayer* layer = &(*bert->encoder->layer)[l];
      x = run_block(
          recomputes(static_cast<int64_t>(l)),
          [layer, seq](const Tensor& in) { return layer->forward(in, seq); }, x);
    }
    const DenseHolder& t = *predictions->transform;
    x = t.LayerNorm->forward(engine::gelu(t.dense->forward(x)));
    // The tied decoder: columns (and bias) of this rank's vocabulary shard, for every position
    // under split_gather (gathered), this rank's positions otherwise.
    Tensor xh = sg ? parallel::all_gather_from_group(x, tp, 1) : parallel::copy_to_group(x, tp);
    out.logits = engine::linear(xh, bert->embeddings->word_embeddings->weight, predictions->bias);
    out.rows = sg ? plan.every : plan.local;
    return out;
  }

  ModelConfig config_;
};

}  // namespace

std::shared_ptr<ShardedLanguageModel> bert_policy(const Model& model,
                                                  const parallel::DeviceMesh& mesh,
                                                  const ShardOptions& options) {
  MAMMOTH_CHECK(model.config().family == Family::kBert)
      << "[bert_policy] needs a BERT model, got " << family_name(model.config().family);
  return adopt(std::make_shared<TpBert>(model.config(), mesh, options), model);
}

}  // namespace mammoth::models
