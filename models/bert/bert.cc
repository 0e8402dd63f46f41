#include "models/bert/bert.h"

#include "engine/ops.h"

namespace mammoth::models {

using engine::Tensor;
using engine::nn::Dropout;
using engine::nn::Embedding;
using engine::nn::LayerNorm;
using engine::nn::Linear;

BertEmbeddings::BertEmbeddings(const ModelConfig& c) {
  word_embeddings = register_module("word_embeddings",
                                    std::make_shared<Embedding>(c.vocab_size, c.d_model, c.dtype));
  position_embeddings = register_module("position_embeddings",
                                        std::make_shared<Embedding>(c.max_seq, c.d_model, c.dtype));
  token_type_embeddings = register_module(
      "token_type_embeddings", std::make_shared<Embedding>(c.type_vocab_size, c.d_model, c.dtype));
  LayerNorm = register_module(
      "LayerNorm", std::make_shared<engine::nn::LayerNorm>(c.d_model, c.norm_eps, c.dtype));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor BertEmbeddings::forward(const Tensor& ids, const Tensor& token_type_ids) const {
  const int64_t T = ids.size(1);
  MAMMOTH_CHECK(T <= position_embeddings->weight.size(0))
      << "[Bert::forward] sequence length " << T << " exceeds max_seq "
      << position_embeddings->weight.size(0);
  Tensor x =
      word_embeddings->forward(ids) + position_embeddings->forward(positions(0, T, ids.device()));
  x = x + token_type_embeddings->forward(token_type_ids);
  return dropout->forward(LayerNorm->forward(x));
}

BertResidualOutput::BertResidualOutput(const ModelConfig& c, int64_t in, const Layers& L) {
  dense = register_module("dense", L.row(in, c.d_model, true, c.dtype));
  LayerNorm = register_module(
      "LayerNorm", std::make_shared<engine::nn::LayerNorm>(c.d_model, c.norm_eps, c.dtype));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor BertResidualOutput::forward(const Tensor& x, const Tensor& residual) const {
  return LayerNorm->forward(dropout->forward(dense->forward(x)) + residual);
}

BertAttention::BertAttention(const ModelConfig& c, const Layers& L) {
  self = register_module("self", std::make_shared<EncoderSelfAttention>(c, L));
  output = register_module("output", std::make_shared<BertResidualOutput>(c, c.d_model, L));
}

Tensor BertAttention::forward(const Tensor& x, const SeqContext& seq) const {
  return output->forward(self->forward(x, seq), x);
}

BertIntermediate::BertIntermediate(const ModelConfig& c, const Layers& L) {
  dense = register_module("dense", L.column(c.d_model, c.d_ff, true, c.dtype));
}

Tensor BertIntermediate::forward(const Tensor& x) const { return engine::gelu(dense->forward(x)); }

BertLayer::BertLayer(const ModelConfig& c, const Layers& L) {
  attention = register_module("attention", std::make_shared<BertAttention>(c, L));
  intermediate = register_module("intermediate", std::make_shared<BertIntermediate>(c, L));
  output = register_module("output", std::make_shared<BertResidualOutput>(c, c.d_ff, L));
}

Tensor BertLayer::forward(const Tensor& x, const SeqContext& seq) const {
  Tensor a = attention->forward(x, seq);
  return output->forward(intermediate->forward(a), a);
}

BertEncoder::BertEncoder(const ModelConfig& c, const Layers& L) {
  layer = register_module("layer", std::make_shared<ModuleList<BertLayer>>());
  for (int64_t l = 0; l < c.n_layer; ++l) layer->add(std::make_shared<BertLayer>(c, L));
}

BertPooler::BertPooler(const ModelConfig& c) {
  dense = register_module("dense", std::make_shared<Linear>(c.d_model, c.d_model, true, c.dtype));
}

Tensor BertPooler::forward(const Tensor& hidden) const {
  return engine::tanh(dense->forward(hidden.select(1, 0)));
}

BertModel::BertModel(const ModelConfig& c) {
  embeddings = register_module("embeddings", std::make_shared<BertEmbeddings>(c));
  encoder = register_module("encoder", std::make_shared<BertEncoder>(c));
  pooler = register_module("pooler", std::make_shared<BertPooler>(c));
}

BertPredictionHeadTransform::BertPredictionHeadTransform(const ModelConfig& c) {
  dense = register_module("dense", std::make_shared<Linear>(c.d_model, c.d_model, true, c.dtype));
  LayerNorm = register_module(
      "LayerNorm", std::make_shared<engine::nn::LayerNorm>(c.d_model, c.norm_eps, c.dtype));
}

Tensor BertPredictionHeadTransform::forward(const Tensor& x) const {
  return LayerNorm->forward(engine::gelu(dense->forward(x)));
}

BertLMPredictionHead::BertLMPredictionHead(const ModelConfig& c, int64_t vocab) {
  transform = register_module("transform", std::make_shared<BertPredictionHeadTransform>(c));
  bias = register_parameter("bias", Tensor::zeros({vocab}, c.dtype));
}

BertOnlyMLMHead::BertOnlyMLMHead(const ModelConfig& c, int64_t vocab) {
  predictions = register_module("predictions", std::make_shared<BertLMPredictionHead>(c, vocab));
}

Bert::Bert(ModelConfig config) : config_(std::move(config)) {
  config_.validate();
  MAMMOTH_CHECK(config_.tie_embeddings)
      << "[Bert] the MLM decoder is tied to the word embeddings; tie_embeddings=false is not "
         "supported";
  bert = register_module("bert", std::make_shared<BertModel>(config_));
  cls = register_module("cls", std::make_shared<BertOnlyMLMHead>(config_, config_.vocab_size));
  dropout_ = register_module("dropout", std::make_shared<Dropout>(config_.dropout));
  if (config_.num_labels > 0) {
    classifier = register_module(
        "classifier",
        std::make_shared<Linear>(config_.d_model, config_.num_labels, true, config_.dtype));
  }
}

Tensor Bert::encode(const Tensor& ids, const Tensor& token_type_ids,
                    const Tensor& attention_mask) const {
  MAMMOTH_CHECK(ids.dim() == 2 && ids.dtype() == DType::kI64)
      << "[Bert::encode] ids must be i64 [B, T], got " << dtype_name(ids.dtype()) << " "
      << engine::shape_str(ids.shape());
  Tensor types = token_type_ids.defined() ? token_type_ids
                                          : Tensor::zeros(ids.shape(), DType::kI64, ids.device());
  MAMMOTH_CHECK(types.shape() == ids.shape())
      << "[Bert::encode] token_type_ids " << engine::shape_str(types.shape()) << " must match ids "
      << engine::shape_str(ids.shape());
  SeqContext seq;  // the whole sequence here, padding (if any) masked
  if (attention_mask.defined()) {
    MAMMOTH_CHECK(attention_mask.shape() == ids.shape())
        << "[Bert::encode] attention_mask " << engine::shape_str(attention_mask.shape())
        << " must match ids " << engine::shape_str(ids.shape());
    seq.key_mask = attention_mask.dtype() == DType::kBool
                       ? attention_mask
                       : engine::cast(attention_mask, DType::kBool);
  }
  Tensor x = bert->embeddings->forward(ids, types);
  const ModuleList<BertLayer>& layers = *bert->encoder->layer;
  for (size_t l = 0; l < layers.size(); ++l) {
    const BertLayer& layer = layers[l];
    x = run_block(
        recomputes(static_cast<int64_t>(l)),
        [&layer, seq](const Tensor& in) { return layer.forward(in, seq); }, x);
  }
  return x;
}

Tensor Bert::mlm_logits(const Tensor& hidden) const {
  const BertLMPredictionHead& p = *cls->predictions;
  return engine::linear(p.transform->forward(hidden), bert->embeddings->word_embeddings->weight,
                        p.bias);
}

Tensor Bert::pooled(const Tensor& hidden) const { return bert->pooler->forward(hidden); }

Tensor Bert::classify(const Tensor& hidden) const {
  MAMMOTH_CHECK(classifier != nullptr) << "[Bert::classify] the model has no classification head "
                                          "(num_labels = 0)";
  return classifier->forward(dropout_->forward(pooled(hidden)));
}

Tensor Bert::forward(const Tensor& ids) { return mlm_logits(encode(ids, Tensor(), Tensor())); }

namespace {
// A pipeline micro-batch: the masked LM's [B, 2T] (masked ids, then their targets) or
// classification's [B, 2T + 1] (ids, attention mask with 1 = token, then the label); the
// width's parity tells the two apart.
struct BertMicroBatch {
  Tensor ids;
  Tensor targets;  // [B, T] (-100 = not masked), or the labels [B]
  Tensor mask;     // bool [B, T] for classification; undefined for the masked LM
};

BertMicroBatch split_batch(const Tensor& batch) {
  MAMMOTH_CHECK(batch.dim() == 2 && batch.dtype() == DType::kI64 && batch.size(1) >= 2)
      << "[Bert::pipeline] a micro-batch is i64 [B, 2T] (masked LM: ids, then targets) or "
         "[B, 2T + 1] (classification: ids, attention mask, label), got "
      << engine::shape_str(batch.shape());
  const int64_t T = batch.size(1) / 2;
  if (batch.size(1) % 2 == 0)
    return {batch.slice(1, 0, T).contiguous(), batch.slice(1, T, 2 * T).contiguous(), Tensor()};
  return {batch.slice(1, 0, T).contiguous(),
          batch.slice(1, 2 * T, 2 * T + 1).reshape({batch.size(0)}).contiguous(),
          engine::cast(batch.slice(1, T, 2 * T).contiguous(), DType::kBool)};
}
}  // namespace

Tensor Bert::pipeline_batch(const Tensor& ids, const Tensor& labels) const {
  MAMMOTH_CHECK(ids.dim() == 2 && ids.dtype() == DType::kI64 && labels.dim() == 1 &&
                labels.size(0) == ids.size(0))
      << "[Bert::pipeline_batch] ids i64 [B, T] and labels [B], got "
      << engine::shape_str(ids.shape()) << " and " << engine::shape_str(labels.shape());
  // The attention mask as classify() is given it: padding is the config's pad id.
  const int64_t pad = config_.special_tokens.pad;
  std::vector<int64_t> mask = ids.to(Device::cpu()).to_int_vector();
  for (int64_t& v : mask) v = pad < 0 || v != pad;
  return engine::concat({ids, Tensor::from_ints(mask, ids.shape()).to(ids.device()),
                         engine::cast(labels, DType::kI64).reshape({ids.size(0), 1})},
                        1);
}

Tensor Bert::pipeline_embed(const Tensor& batch) {
  const Tensor ids = split_batch(batch).ids;
  MAMMOTH_CHECK(ids.size(1) <= config_.max_seq) << "[Bert::pipeline_embed] " << ids.size(1)
                                                << " positions exceed max_seq " << config_.max_seq;
  return bert->embeddings->forward(ids, Tensor::zeros(ids.shape(), DType::kI64, ids.device()));
}

Tensor Bert::pipeline_block(int64_t l, const Tensor& x, const Tensor& batch) {
  const BertLayer& layer = (*bert->encoder->layer)[static_cast<size_t>(l)];
  SeqContext seq;  // the whole sequence, padding masked as keys (classification)
  seq.key_mask = split_batch(batch).mask;
  return run_block(
      recomputes(l), [&layer, seq](const Tensor& in) { return layer.forward(in, seq); }, x);
}

Tensor Bert::pipeline_loss(const Tensor& x, const Tensor& batch) {
  const BertMicroBatch mb = split_batch(batch);
  if (mb.mask.defined()) return engine::cross_entropy(classify(x), mb.targets);
  return engine::cross_entropy(mlm_logits(x), mb.targets);
}

LanguageModel::PipelinePart Bert::pipeline_part(const std::string& name) const {
  const std::string layers = "bert.encoder.layer.";
  if (name.rfind(layers, 0) == 0) {
    const size_t at = layers.size();
    return {.block = std::stoll(name.substr(at, name.find('.', at) - at))};
  }
  if (name.rfind("bert.embeddings.word_embeddings.", 0) == 0) return {.embed = true, .head = true};
  if (name.rfind("bert.embeddings.", 0) == 0) return {.embed = true};
  if (name.rfind("cls.", 0) == 0 || name.rfind("bert.pooler.", 0) == 0 ||
      name.rfind("classifier.", 0) == 0)
    return {.head = true};
  MAMMOTH_THROW() << "[Bert::pipeline_part] parameter '" << name << "' belongs to no part";
}

Tensor Bert::loss(const Tensor& ids, const Tensor& targets) {
  MAMMOTH_CHECK(targets.defined())
      << "[Bert::loss] BERT is a masked LM: pass targets [B, T] with -100 at unmasked positions";
  return LanguageModel::loss(ids, targets);
}

HfLayout Bert::hf_layout() const {
  HfLayout layout = Model::hf_layout();
  for (HfParam& p : layout.params) {
    // Task heads HF initialises afresh when a checkpoint lacks them (BertForMaskedLM files
    // have no pooler, pre-training files no classifier, BertForSequenceClassification files
    // no masked-LM head); create_model names each one it initialised.
    if (p.param.rfind("classifier.", 0) == 0 || p.param.rfind("bert.pooler.", 0) == 0 ||
        p.param.rfind("cls.", 0) == 0)
      p.optional = true;
  }
  // BertModel checkpoints spell "embeddings..." without the "bert." prefix.
  layout.prefix_aliases = {{"bert.", ""}};
  layout.ignored = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
                    "cls.seq_relationship*", "*.position_ids"};
  return layout;
}

}  // namespace mammoth::models
