// ViT (Dosovitskiy et al. 2020) as in Hugging Face's ViTForImageClassification: patch embedding,
// class token, learned positions, pre-LN encoder with exact GELU, final LayerNorm, linear
// classifier on the class token.
//
// The patch embedding is HF's Conv2d(kernel = stride = patch) with weight [D, C, P, P]; such a
// convolution is a linear map on non-overlapping patches, so we keep HF's parameter as is and
// apply it as [D, C*P*P] to patches flattened in (c, y, x) order. Names are HF's:
// "vit.embeddings.cls_token", "vit.embeddings.patch_embeddings.projection.weight",
// "vit.encoder.layer.0.attention.attention.query.weight", "vit.layernorm.weight",
// "classifier.weight".
//
// The encoder blocks are built from a Layers (models/layers.h): Layers() is the single-device
// model; the tensor / sequence-parallel form (models/policies/vit_policy.cc) builds the same
// classes from Layers(tp, mode): query/key/value and intermediate.dense column-parallel,
// attention.output.dense and output.dense row-parallel, n_head / tp heads per rank.
#pragma once

#include <memory>

#include "engine/nn/module.h"
#include "models/encoder.h"
#include "models/layers.h"
#include "models/model.h"

namespace mammoth::parallel {
class SequenceLayout;
}

namespace mammoth::models {

// HF's Conv2d "projection": weight [D, C, P, P], bias [D].
class PatchProjection : public engine::nn::Module {
 public:
  explicit PatchProjection(const ModelConfig& c);
  // pixels [B, C, H, W] -> [B, N, D], N = (H/P) * (W/P) in row-major patch order.
  engine::Tensor forward(const engine::Tensor& pixels) const;
  // pixels [B, C, H, W] -> the flattened patches [B, N, C*P*P] in (c, y, x) order (checked).
  engine::Tensor patches(const engine::Tensor& pixels) const;
  // The weight as the linear map on flattened patches, [D, C*P*P].
  engine::Tensor matrix() const;
  engine::Tensor weight, bias;

 private:
  int64_t patch_;
};

class VitPatchEmbeddings : public engine::nn::Module {
 public:
  explicit VitPatchEmbeddings(const ModelConfig& c);
  std::shared_ptr<PatchProjection> projection;
};

class VitEmbeddings : public engine::nn::Module {
 public:
  explicit VitEmbeddings(const ModelConfig& c);
  engine::Tensor forward(const engine::Tensor& pixels) const;  // -> [B, N+1, D]
  // The embeddings of part `part` of `layout` over the N + 1 positions only, [B, n, D]: one
  // rank's rows when the sequence is split (the sharded form); rows past the end are padding,
  // hidden from attention by the key mask or the layout. Each rank projects only the patches
  // of its own positions.
  engine::Tensor forward(const engine::Tensor& pixels, const parallel::SequenceLayout& layout,
                         int part) const;
  engine::Tensor cls_token;            // [1, 1, D]
  engine::Tensor position_embeddings;  // [1, N+1, D]
  std::shared_ptr<VitPatchEmbeddings> patch_embeddings;
  std::shared_ptr<engine::nn::Dropout> dropout;
};

// `linear` (a Layers column or row layer) registered as "dense", followed by dropout when
// `with_dropout` (ViTSelfOutput, ViTIntermediate, ViTOutput).
class VitDense : public engine::nn::Module {
 public:
  VitDense(const ModelConfig& c, std::shared_ptr<engine::nn::Linear> linear, bool with_dropout);
  engine::Tensor forward(const engine::Tensor& x) const;
  std::shared_ptr<engine::nn::Linear> dense;

 private:
  std::shared_ptr<engine::nn::Dropout> dropout_;
};

class VitAttention : public engine::nn::Module {
 public:
  explicit VitAttention(const ModelConfig& c, const Layers& L = Layers());
  engine::Tensor forward(const engine::Tensor& x, const SeqContext& seq) const;
  std::shared_ptr<EncoderSelfAttention> attention;
  std::shared_ptr<VitDense> output;
};

// Pre-LN: h = x + attention(LN(x)); out = h + output(gelu(intermediate(LN(h)))). x [B, n, D]:
// every position, or this rank's under split_gather / ulysses / ring (seq).
class VitLayer : public engine::nn::Module {
 public:
  explicit VitLayer(const ModelConfig& c, const Layers& L = Layers());
  engine::Tensor forward(const engine::Tensor& x, const SeqContext& seq) const;
  std::shared_ptr<engine::nn::LayerNorm> layernorm_before, layernorm_after;
  std::shared_ptr<VitAttention> attention;
  std::shared_ptr<VitDense> intermediate, output;
};

class VitEncoder : public engine::nn::Module {
 public:
  explicit VitEncoder(const ModelConfig& c, const Layers& L = Layers());
  std::shared_ptr<ModuleList<VitLayer>> layer;
};

class VitModel : public engine::nn::Module {
 public:
  explicit VitModel(const ModelConfig& c, const Layers& L = Layers());
  // -> normed hidden [B, N+1, D] (the single-device path; the sharded form runs its blocks
  // itself, on its part of the sequence)
  engine::Tensor forward(const engine::Tensor& pixels) const;
  std::shared_ptr<VitEmbeddings> embeddings;
  std::shared_ptr<VitEncoder> encoder;
  std::shared_ptr<engine::nn::LayerNorm> layernorm;
};

class Vit : public Model {
 public:
  explicit Vit(ModelConfig config);
  // pixels [B, C, H, W] (H = W = image_size) -> class logits [B, num_labels]
  engine::Tensor forward(const engine::Tensor& pixels);
  // Mean cross-entropy of forward(pixels) against labels i64 [B].
  engine::Tensor loss(const engine::Tensor& pixels, const engine::Tensor& labels);
  const ModelConfig& config() const override { return config_; }
  HfLayout hf_layout() const override;

  // Pipeline stages: a micro-batch is f32 [B, C*H*W + 1], each image's pixels flattened and
  // then its label (exact in f32 below 2^24), since a stage receives one tensor per micro-batch
  // (pipeline_batch). The embeddings go with the first stage, the final LayerNorm and the
  // classifier with the last.
  engine::Tensor pipeline_batch(const engine::Tensor& pixels,
                                const engine::Tensor& labels) const override;
  bool supports_pipeline() const override { return true; }
  engine::Tensor pipeline_embed(const engine::Tensor& batch) override;
  engine::Tensor pipeline_block(int64_t l, const engine::Tensor& x,
                                const engine::Tensor& batch) override;
  engine::Tensor pipeline_loss(const engine::Tensor& x, const engine::Tensor& batch) override;
  PipelinePart pipeline_part(const std::string& name) const override;

  std::shared_ptr<VitModel> vit;
  std::shared_ptr<engine::nn::Linear> classifier;

 private:
  ModelConfig config_;
};

}  // namespace mammoth::models
