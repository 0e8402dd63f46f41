#include "models/vit/vit.h"

#include "engine/ops.h"

namespace mammoth::models {

using engine::Tensor;
using engine::nn::Dropout;
using engine::nn::LayerNorm;
using engine::nn::Linear;

PatchProjection::PatchProjection(const ModelConfig& c) : patch_(c.patch_size) {
  weight = register_parameter(
      "weight", Tensor::zeros({c.d_model, c.num_channels, c.patch_size, c.patch_size}, c.dtype));
  bias = register_parameter("bias", Tensor::zeros({c.d_model}, c.dtype));
}

Tensor PatchProjection::forward(const Tensor& pixels) const {
  const int64_t C = weight.size(1), D = weight.size(0), P = patch_;
  MAMMOTH_CHECK(pixels.dim() == 4 && pixels.size(1) == C && pixels.size(2) % P == 0 &&
                pixels.size(3) % P == 0)
      << "[Vit::forward] pixels must be [B, " << C << ", H, W] with H, W multiples of " << P
      << ", got " << engine::shape_str(pixels.shape());
  const int64_t B = pixels.size(0), h = pixels.size(2) / P, w = pixels.size(3) / P;
  // [B, C, h, P, w, P] -> [B, h, w, C, P, P] -> [B, h*w, C*P*P]
  Tensor patches =
      pixels.reshape({B, C, h, P, w, P}).permute({0, 2, 4, 1, 3, 5}).reshape({B, h * w, C * P * P});
  return engine::linear(patches, weight.reshape({D, C * P * P}), bias);
}

VitPatchEmbeddings::VitPatchEmbeddings(const ModelConfig& c) {
  projection = register_module("projection", std::make_shared<PatchProjection>(c));
}

VitEmbeddings::VitEmbeddings(const ModelConfig& c) {
  cls_token = register_parameter("cls_token", Tensor::zeros({1, 1, c.d_model}, c.dtype));
  position_embeddings = register_parameter(
      "position_embeddings", Tensor::zeros({1, c.num_patches() + 1, c.d_model}, c.dtype));
  patch_embeddings = register_module("patch_embeddings", std::make_shared<VitPatchEmbeddings>(c));
  dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor VitEmbeddings::forward(const Tensor& pixels) const {
  Tensor patches = patch_embeddings->projection->forward(pixels);  // [B, N, D]
  const int64_t B = patches.size(0), N = patches.size(1), D = patches.size(2);
  MAMMOTH_CHECK(N + 1 == position_embeddings.size(1))
      << "[Vit::forward] " << N << " patches, but the position table has "
      << position_embeddings.size(1) - 1 << " (image_size / patch_size squared)";
  // 16-bit tables widen to the patches' dtype, as the ops widen weights (engine/ops/common.h).
  Tensor x =
      engine::concat({engine::cast(cls_token, patches.dtype()).expand({B, 1, D}), patches}, 1);
  return dropout->forward(x + engine::cast(position_embeddings, x.dtype()));
}

VitSelfAttention::VitSelfAttention(const ModelConfig& c) : config_(c) {
  query = register_module("query", std::make_shared<Linear>(c.d_model, c.d_model, true, c.dtype));
  key = register_module("key", std::make_shared<Linear>(c.d_model, c.d_model, true, c.dtype));
  value = register_module("value", std::make_shared<Linear>(c.d_model, c.d_model, true, c.dtype));
}

Tensor VitSelfAttention::forward(const Tensor& x) const {
  const int64_t H = config_.n_head;
  return merge_heads(attend(split_heads(query->forward(x), H), split_heads(key->forward(x), H),
                            split_heads(value->forward(x), H), {}, config_.attn_dropout,
                            is_training()));
}

VitDense::VitDense(const ModelConfig& c, int64_t in, int64_t out, bool with_dropout) {
  dense = register_module("dense", std::make_shared<Linear>(in, out, true, c.dtype));
  if (with_dropout) dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor VitDense::forward(const Tensor& x) const {
  Tensor y = dense->forward(x);
  return dropout_ ? dropout_->forward(y) : y;
}

VitAttention::VitAttention(const ModelConfig& c) {
  attention = register_module("attention", std::make_shared<VitSelfAttention>(c));
  output = register_module("output", std::make_shared<VitDense>(c, c.d_model, c.d_model, true));
}

Tensor VitAttention::forward(const Tensor& x) const {
  return output->forward(attention->forward(x));
}

VitLayer::VitLayer(const ModelConfig& c) {
  layernorm_before = register_module("layernorm_before",
                                     std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
  attention = register_module("attention", std::make_shared<VitAttention>(c));
  layernorm_after = register_module("layernorm_after",
                                    std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
  intermediate =
      register_module("intermediate", std::make_shared<VitDense>(c, c.d_model, c.d_ff, false));
  output = register_module("output", std::make_shared<VitDense>(c, c.d_ff, c.d_model, true));
}

Tensor VitLayer::forward(const Tensor& x) const {
  Tensor h = x + attention->forward(layernorm_before->forward(x));
  return h + output->forward(engine::gelu(intermediate->forward(layernorm_after->forward(h))));
}

VitEncoder::VitEncoder(const ModelConfig& c) {
  layer = register_module("layer", std::make_shared<ModuleList<VitLayer>>());
  for (int64_t l = 0; l < c.n_layer; ++l) layer->add(std::make_shared<VitLayer>(c));
}

VitModel::VitModel(const ModelConfig& c) {
  embeddings = register_module("embeddings", std::make_shared<VitEmbeddings>(c));
  encoder = register_module("encoder", std::make_shared<VitEncoder>(c));
  layernorm =
      register_module("layernorm", std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
}

Tensor VitModel::forward(const Tensor& pixels) const {
  Tensor x = embeddings->forward(pixels);
  const ModuleList<VitLayer>& layers = *encoder->layer;
  for (size_t l = 0; l < layers.size(); ++l) x = layers[l].forward(x);
  return layernorm->forward(x);
}

Vit::Vit(ModelConfig config) : config_(std::move(config)) {
  config_.validate();
  MAMMOTH_CHECK(config_.num_labels > 0) << "[Vit] num_labels must be positive for the "
                                           "classification head, got "
                                        << config_.num_labels;
  vit = register_module("vit", std::make_shared<VitModel>(config_));
  classifier = register_module(
      "classifier",
      std::make_shared<Linear>(config_.d_model, config_.num_labels, true, config_.dtype));
}

Tensor Vit::forward(const Tensor& pixels) {
  return classifier->forward(vit->forward(pixels).select(1, 0));
}

Tensor Vit::loss(const Tensor& pixels, const Tensor& labels) {
  return engine::cross_entropy(forward(pixels), labels);
}

HfLayout Vit::hf_layout() const {
  HfLayout layout = Model::hf_layout();
  for (HfParam& p : layout.params) {
    if (p.param.rfind("classifier.", 0) == 0) p.optional = true;  // a fresh task head
  }
  layout.prefix_aliases = {{"vit.", ""}};  // ViTModel checkpoints have no "vit." prefix
  layout.ignored = {"vit.pooler*", "pooler*"};
  return layout;
}

}  // namespace mammoth::models
