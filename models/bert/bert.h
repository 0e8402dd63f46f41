// BERT (Devlin et al. 2018) as in Hugging Face's BertModel + BertForMaskedLM's head +
// BertForSequenceClassification's head: post-LN encoder, word + position + token-type
// embeddings, exact GELU, MLM head tied to the word embeddings, tanh pooler, classifier.
//
// Parameter names are HF's: "bert.embeddings.word_embeddings.weight",
// "bert.encoder.layer.0.attention.self.query.weight", "bert.pooler.dense.weight",
// "cls.predictions.transform.dense.weight", "cls.predictions.bias", "classifier.weight".
//
// The encoder blocks are built from a Layers (models/layers.h): Layers() is the single-device
// model; the tensor / sequence-parallel form (models/policies/bert_policy.cc) builds the same
// blocks from Layers(tp, mode): query/key/value and intermediate.dense column-parallel, the
// two output.dense row-parallel, n_head / tp heads per rank.
#pragma once

#include <memory>

#include "engine/nn/module.h"
#include "models/encoder.h"
#include "models/layers.h"
#include "models/model.h"

namespace mammoth::models {

class BertEmbeddings : public engine::nn::Module {
 public:
  explicit BertEmbeddings(const ModelConfig& c);
  engine::Tensor forward(const engine::Tensor& ids, const engine::Tensor& token_type_ids) const;
  std::shared_ptr<engine::nn::Embedding> word_embeddings, position_embeddings,
      token_type_embeddings;
  std::shared_ptr<engine::nn::LayerNorm> LayerNorm;  // NOLINT: HF's name
  std::shared_ptr<engine::nn::Dropout> dropout;
};

// dense (row-parallel under tp) -> dropout -> LayerNorm(x + residual): BertSelfOutput and
// BertOutput.
class BertResidualOutput : public engine::nn::Module {
 public:
  BertResidualOutput(const ModelConfig& c, int64_t in, const Layers& L = Layers());
  engine::Tensor forward(const engine::Tensor& x, const engine::Tensor& residual) const;
  std::shared_ptr<engine::nn::Linear> dense;
  std::shared_ptr<engine::nn::LayerNorm> LayerNorm;  // NOLINT: HF's name
  std::shared_ptr<engine::nn::Dropout> dropout;
};

class BertAttention : public engine::nn::Module {
 public:
  explicit BertAttention(const ModelConfig& c, const Layers& L = Layers());
  engine::Tensor forward(const engine::Tensor& x, const SeqContext& seq) const;
  std::shared_ptr<EncoderSelfAttention> self;
  std::shared_ptr<BertResidualOutput> output;
};

// dense (column-parallel under tp) + GELU, as a module so that the parameter reads
// "intermediate.dense.weight".
class BertIntermediate : public engine::nn::Module {
 public:
  explicit BertIntermediate(const ModelConfig& c, const Layers& L = Layers());
  engine::Tensor forward(const engine::Tensor& x) const;
  std::shared_ptr<engine::nn::Linear> dense;
};

class BertLayer : public engine::nn::Module {
 public:
  explicit BertLayer(const ModelConfig& c, const Layers& L = Layers());
  // x [B, n, C]: every position, or this rank's under split_gather / ulysses / ring (seq).
  engine::Tensor forward(const engine::Tensor& x, const SeqContext& seq) const;
  std::shared_ptr<BertAttention> attention;
  std::shared_ptr<BertIntermediate> intermediate;
  std::shared_ptr<BertResidualOutput> output;
};

class BertEncoder : public engine::nn::Module {
 public:
  explicit BertEncoder(const ModelConfig& c, const Layers& L = Layers());
  std::shared_ptr<ModuleList<BertLayer>> layer;
};

// tanh(dense(hidden[:, 0]))
class BertPooler : public engine::nn::Module {
 public:
  explicit BertPooler(const ModelConfig& c);
  engine::Tensor forward(const engine::Tensor& hidden) const;
  std::shared_ptr<engine::nn::Linear> dense;
};

class BertModel : public engine::nn::Module {
 public:
  explicit BertModel(const ModelConfig& c);
  std::shared_ptr<BertEmbeddings> embeddings;
  std::shared_ptr<BertEncoder> encoder;
  std::shared_ptr<BertPooler> pooler;
};

// dense -> GELU -> LayerNorm
class BertPredictionHeadTransform : public engine::nn::Module {
 public:
  explicit BertPredictionHeadTransform(const ModelConfig& c);
  engine::Tensor forward(const engine::Tensor& x) const;
  std::shared_ptr<engine::nn::Linear> dense;
  std::shared_ptr<engine::nn::LayerNorm> LayerNorm;  // NOLINT: HF's name
};

// "cls.predictions": transform, then the tied decoder plus its own bias [vocab]: vocab_size
// on one device, one rank's vocabulary shard (Vp / tp) in the tensor-parallel form.
class BertLMPredictionHead : public engine::nn::Module {
 public:
  BertLMPredictionHead(const ModelConfig& c, int64_t vocab);
  std::shared_ptr<BertPredictionHeadTransform> transform;
  engine::Tensor bias;
};

class BertOnlyMLMHead : public engine::nn::Module {
 public:
  BertOnlyMLMHead(const ModelConfig& c, int64_t vocab);
  std::shared_ptr<BertLMPredictionHead> predictions;
};

class Bert : public LanguageModel {
 public:
  explicit Bert(ModelConfig config);
  // Masked-LM logits [B, T, V] with token types 0 and no padding.
  engine::Tensor forward(const engine::Tensor& ids) override;
  // Masked-LM loss against targets [B, T] (-100 = not masked); targets are required.
  engine::Tensor loss(const engine::Tensor& ids,
                      const engine::Tensor& targets = engine::Tensor()) override;
  const ModelConfig& config() const override { return config_; }
  HfLayout hf_layout() const override;

  // ids i64 [B, T]; token_type_ids i64 [B, T] or undefined (zeros); attention_mask [B, T]
  // (bool, or integers with 1 = token, 0 = padding) or undefined. -> hidden [B, T, C]
  engine::Tensor encode(const engine::Tensor& ids, const engine::Tensor& token_type_ids,
                        const engine::Tensor& attention_mask) const;
  engine::Tensor mlm_logits(const engine::Tensor& hidden) const;  // [B, T, V]
  engine::Tensor pooled(const engine::Tensor& hidden) const;      // [B, C]
  engine::Tensor classify(const engine::Tensor& hidden) const;    // [B, num_labels]

  // Pipeline stages, since a stage receives one tensor per micro-batch: the masked LM's is
  // [B, 2T], the masked ids [B, T] then their targets [B, T] (-100 = not masked);
  // classification's is [B, 2T + 1] (pipeline_batch): the ids, the attention mask (padding is
  // the config's pad id, 0) and the label. The word embeddings are also the MLM decoder
  // (embedding and head); the pooler and the classifier go with the head.
  bool supports_pipeline() const override { return true; }
  engine::Tensor pipeline_batch(const engine::Tensor& ids,
                                const engine::Tensor& labels) const override;
  engine::Tensor pipeline_embed(const engine::Tensor& batch) override;
  engine::Tensor pipeline_block(int64_t l, const engine::Tensor& x,
                                const engine::Tensor& batch) override;
  engine::Tensor pipeline_loss(const engine::Tensor& x, const engine::Tensor& batch) override;
  PipelinePart pipeline_part(const std::string& name) const override;

  std::shared_ptr<BertModel> bert;
  std::shared_ptr<BertOnlyMLMHead> cls;
  std::shared_ptr<engine::nn::Linear> classifier;  // null when num_labels == 0

 private:
  ModelConfig config_;
  std::shared_ptr<engine::nn::Dropout> dropout_;
};

}  // namespace mammoth::models
