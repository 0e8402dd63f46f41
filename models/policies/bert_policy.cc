// BERT's sharding policy (the masked-LM path of models/bert). The encoder is models/bert's own
// BertEncoder built from Layers(tp, sp_mode), so the blocks are written once; this file keeps
// what only the sharded form has, with Hugging Face's parameter names:
//
//   attention.self.query/key/value  column-parallel by heads: rank r holds heads
//                                   [r H/tp, (r+1) H/tp) of each (weights and biases)
//   attention.output.dense          row-parallel over the same heads
//   intermediate.dense              column-parallel (d_ff / tp), output.dense row-parallel
//                                   (these four from Layers; their specs read off the layers)
//   embeddings.word_embeddings      vocab-parallel, padded to a multiple of tp; also the tied
//                                   MLM decoder, whose logits stay split by vocabulary into the
//                                   vocab-parallel cross-entropy
//   cls.predictions.bias            split by vocabulary like the decoder's rows
//   position/token-type embeddings, LayerNorms, cls.predictions.transform, pooler, classifier
//                                   replicated (the MLM loss leaves the pooler and classifier
//                                   without a gradient, classification the MLM head)
//
// Attention is bidirectional: padded positions (sequences that do not divide) are keys nobody
// attends to (a key mask under split_gather; ulysses_attention and ring_attention mask them
// themselves). The sharded form has the masked LM (forward(ids), loss(ids, targets)) and
// sequence classification (classify(ids, attention_mask): the mask, over the whole sequence,
// is the key mask of every sp mode; the [CLS] row is on one rank of the sequence group under
// split_gather, Ulysses and ring, which classifies as ShardedVit does, see vit_policy.cc).
// Token type 0 everywhere, as Bert::forward.
#include <memory>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/bert/bert.h"
#include "models/layers.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "parallel/tensor_parallel/layers.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mammoth::models {

using engine::Tensor;
using engine::nn::Dropout;
using engine::nn::Embedding;
using engine::nn::Linear;
using parallel::Axis;
using parallel::Communicator;

namespace {

// BertEmbeddings with the word table split by vocabulary (VocabParallelEmbedding is no
// nn::Embedding, and under split_gather its lookup also scatters the sequence), token type 0.
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

// "bert": the vocab-parallel embeddings, then the encoder and pooler of models/bert.
class TpBertModel : public engine::nn::Module {
 public:
  TpBertModel(const ModelConfig& c, const Layers& L) {
    embeddings = register_module(
        "embeddings",
        std::make_shared<TpBertEmbeddings>(c, *L.tp_group(), L.sp_mode() == SpMode::kSplitGather));
    encoder = register_module("encoder", std::make_shared<BertEncoder>(c, L));
    pooler = register_module("pooler", std::make_shared<BertPooler>(c));
  }
  std::shared_ptr<TpBertEmbeddings> embeddings;
  std::shared_ptr<BertEncoder> encoder;
  std::shared_ptr<BertPooler> pooler;  // not used by the MLM loss
};

class TpBert : public ShardedLanguageModel, public ShardedSequenceClassifier {
 public:
  TpBert(const ModelConfig& config, const parallel::DeviceMesh& mesh, const ShardOptions& options)
      : ShardedLanguageModel(mesh, options), config_(config) {
    Communicator& tp = mesh.group(Axis::kTp);
    const ModelConfig& c = config_;
    bert = register_module("bert", std::make_shared<TpBertModel>(c, Layers(tp, options.sp_mode)));
    const parallel::ShardSpec vocab = bert->embeddings->word_embeddings->weight_spec();
    predictions =
        register_module("cls", std::make_shared<BertOnlyMLMHead>(c, vocab.padded / tp.size()))
            ->predictions;
    dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout));  // classifier's
    if (c.num_labels > 0) {
      classifier_ = register_module(
          "classifier", std::make_shared<Linear>(c.d_model, c.num_labels, true, c.dtype));
    }
    set_layer_specs();
    // The MLM bias is a plain tensor split like the vocabulary (no layer to read it off).
    set_spec("bert.embeddings.word_embeddings.weight", vocab);
    set_spec("cls.predictions.bias", vocab);
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

  Tensor classify(const Tensor& ids, const Tensor& attention_mask) override {
    MAMMOTH_CHECK(classifier_ != nullptr)
        << "[TpBert::classify] the model has no classification head (num_labels = 0)";
    const SeqPlan plan = checked_plan(ids);
    // The given mask joins the layout's padding in the key mask (every sp mode).
    const SeqContext seq = encoder_context(plan, ids.size(0), ids.device(), attention_mask);
    Tensor x = encode(ids, plan, seq);
    // The [CLS] row (position 0): local row `at` on the rank of the sequence group holding it.
    int64_t at = -1;
    for (size_t i = 0; i < plan.local.size(); ++i) {
      if (plan.local[i] == 0) at = static_cast<int64_t>(i);
    }
    const int64_t row = at >= 0 ? at : 0;
    Tensor logits = classifier_->forward(
        dropout_->forward(bert->pooler->forward(x.slice(1, row, row + 1))));  // [B, labels]
    // Without a sequence split every rank holds position 0; with one, its holder's logits are
    // summed over the group so every rank has them (as ShardedVit does).
    parallel::Communicator& group = sequence_group();
    if (group.size() == 1) return logits;
    return parallel::reduce_from_group(logits * (at >= 0 ? 1.0 : 0.0), group);
  }

  std::shared_ptr<TpBertModel> bert;
  std::shared_ptr<BertLMPredictionHead> predictions;

 private:
  SeqPlan checked_plan(const Tensor& ids) const {
    MAMMOTH_CHECK(ids.dim() == 2 && ids.dtype() == DType::kI64)
        << "[TpBert::forward] ids must be i64 [B, T], got " << engine::shape_str(ids.shape());
    SeqPlan plan = plan_sequence(ids.size(1));
    MAMMOTH_CHECK(plan.layout->padded() <= config_.max_seq)
        << "[TpBert::forward] " << ids.size(1) << " positions padded to " << plan.layout->padded()
        << " exceed max_seq " << config_.max_seq;
    return plan;
  }

  // The encoder's output for this rank's rows [B, n, C].
  Tensor encode(const Tensor& ids, const SeqPlan& plan, const SeqContext& seq) const {
    const bool sg = options_.sp_mode == SpMode::kSplitGather;
    Tensor x = bert->embeddings->forward(ids_at(ids, sg ? plan.every : plan.local), plan.local);
    for (size_t l = 0; l < bert->encoder->layer->size(); ++l) {
      const BertLayer* layer = &(*bert->encoder->layer)[l];
      x = run_block(
          recomputes(static_cast<int64_t>(l)),
          [layer, seq](const Tensor& in) { return layer->forward(in, seq); }, x);
    }
    return x;
  }

  struct Local {
    Tensor logits;              // [B, n, Vp/tp]: the rows of `rows`
    std::vector<int64_t> rows;  // global positions (>= T: padding)
    SeqPlan plan;
  };

  Local run(const Tensor& ids) {
    Communicator& tp = mesh_.group(Axis::kTp);
    const bool sg = options_.sp_mode == SpMode::kSplitGather;
    Local out;
    out.plan = checked_plan(ids);
    const SeqPlan& plan = out.plan;
    const SeqContext seq = encoder_context(plan, ids.size(0), ids.device());
    Tensor x = predictions->transform->forward(encode(ids, plan, seq));
    // The tied decoder: columns (and bias) of this rank's vocabulary shard, for every position
    // under split_gather (gathered), this rank's positions otherwise.
    Tensor xh = sg ? parallel::all_gather_from_group(x, tp, 1) : parallel::copy_to_group(x, tp);
    out.logits = engine::linear(xh, bert->embeddings->word_embeddings->weight, predictions->bias);
    out.rows = sg ? plan.every : plan.local;
    return out;
  }

  ModelConfig config_;
  std::shared_ptr<Dropout> dropout_;
  std::shared_ptr<Linear> classifier_;  // null without num_labels
};

}  // namespace

std::shared_ptr<ShardedLanguageModel> bert_policy(const Model& model,
                                                  const parallel::DeviceMesh& mesh,
                                                  const ShardOptions& options) {
  MAMMOTH_CHECK(model.config().family == Family::kBert)
      << "[bert_policy] needs a BERT model, got " << family_name(model.config().family);
  return adopt(std::make_shared<TpBert>(model.config(), mesh, options), model);
}

namespace {
[[maybe_unused]] const bool kRegistered = register_policy(Family::kBert, bert_policy);
}  // namespace

}  // namespace mammoth::models
