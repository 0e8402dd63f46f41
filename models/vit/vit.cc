#include "models/vit/vit.h"

#include <utility>
#include <vector>

#include "engine/ops.h"
#include "parallel/sequence_parallel/sequence_parallel.h"

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
  return engine::linear(patches(pixels), matrix(), bias);
}

Tensor PatchProjection::matrix() const {
  return weight.reshape({weight.size(0), weight.size(1) * patch_ * patch_});
}

Tensor PatchProjection::patches(const Tensor& pixels) const {
  const int64_t C = weight.size(1), P = patch_;
  MAMMOTH_CHECK(pixels.dim() == 4 && pixels.size(1) == C && pixels.size(2) % P == 0 &&
                pixels.size(3) % P == 0)
      << "[Vit::forward] pixels must be [B, " << C << ", H, W] with H, W multiples of " << P
      << ", got " << engine::shape_str(pixels.shape());
  const int64_t B = pixels.size(0), h = pixels.size(2) / P, w = pixels.size(3) / P;
  // [B, C, h, P, w, P] -> [B, h, w, C, P, P] -> [B, h*w, C*P*P]
  return pixels.reshape({B, C, h, P, w, P})
      .permute({0, 2, 4, 1, 3, 5})
      .reshape({B, h * w, C * P * P});
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

Tensor VitEmbeddings::forward(const Tensor& pixels, const parallel::SequenceLayout& layout,
                              int part) const {
  const PatchProjection& proj = *patch_embeddings->projection;
  Tensor patches = proj.patches(pixels);  // [B, N, C*P*P]
  const int64_t B = patches.size(0), N = patches.size(1), K = patches.size(2);
  MAMMOTH_CHECK(N + 1 == position_embeddings.size(1) && N + 1 == layout.length())
      << "[Vit::forward] " << N << " patches, but the position table has "
      << position_embeddings.size(1) - 1 << " (image_size / patch_size squared)";
  // A zero row stands in for the class token ahead of the patches, so that position p of the
  // sequence is row p and each rank projects only its own rows.
  Tensor tokens =
      engine::concat({Tensor::zeros({B, 1, K}, pixels.dtype(), pixels.device()), patches}, 1);
  Tensor x =
      engine::linear(parallel::shard_sequence(tokens, 1, layout, part), proj.matrix(), proj.bias);
  // Position 0 takes the class token instead of the projection of its zero row (whose
  // gradient the 0 factor stops: the projection's bias is not used there on one device).
  const std::vector<int64_t> pos = layout.positions(part);
  const int64_t n = static_cast<int64_t>(pos.size());
  std::vector<double> is_cls(static_cast<size_t>(n)), not_cls(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    is_cls[i] = pos[i] == 0 ? 1.0 : 0.0;
    not_cls[i] = 1.0 - is_cls[i];
  }
  const auto column = [&](const std::vector<double>& v) {
    return Tensor::from_vector(v, {1, n, 1}, x.dtype()).to(x.device());
  };
  x = x * column(not_cls) + cls_token * column(is_cls) +
      parallel::shard_sequence(position_embeddings, 1, layout, part);
  return dropout->forward(x);
}

VitDense::VitDense(const ModelConfig& c, std::shared_ptr<Linear> linear, bool with_dropout) {
  dense = register_module("dense", std::move(linear));
  if (with_dropout) dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout));
}

Tensor VitDense::forward(const Tensor& x) const {
  Tensor y = dense->forward(x);
  return dropout_ ? dropout_->forward(y) : y;
}

VitAttention::VitAttention(const ModelConfig& c, const Layers& L) {
  attention = register_module("attention", std::make_shared<EncoderSelfAttention>(c, L));
  output = register_module(
      "output", std::make_shared<VitDense>(c, L.row(c.d_model, c.d_model, true, c.dtype), true));
}

Tensor VitAttention::forward(const Tensor& x, const SeqContext& seq) const {
  return output->forward(attention->forward(x, seq));
}

VitLayer::VitLayer(const ModelConfig& c, const Layers& L) {
  layernorm_before = register_module("layernorm_before",
                                     std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
  attention = register_module("attention", std::make_shared<VitAttention>(c, L));
  layernorm_after = register_module("layernorm_after",
                                    std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
  intermediate = register_module(
      "intermediate",
      std::make_shared<VitDense>(c, L.column(c.d_model, c.d_ff, true, c.dtype), false));
  output = register_module(
      "output", std::make_shared<VitDense>(c, L.row(c.d_ff, c.d_model, true, c.dtype), true));
}

Tensor VitLayer::forward(const Tensor& x, const SeqContext& seq) const {
  Tensor h = x + attention->forward(layernorm_before->forward(x), seq);
  return h + output->forward(engine::gelu(intermediate->forward(layernorm_after->forward(h))));
}

VitEncoder::VitEncoder(const ModelConfig& c, const Layers& L) {
  layer = register_module("layer", std::make_shared<ModuleList<VitLayer>>());
  for (int64_t l = 0; l < c.n_layer; ++l) layer->add(std::make_shared<VitLayer>(c, L));
}

VitModel::VitModel(const ModelConfig& c, const Layers& L) {
  embeddings = register_module("embeddings", std::make_shared<VitEmbeddings>(c));
  encoder = register_module("encoder", std::make_shared<VitEncoder>(c, L));
  layernorm =
      register_module("layernorm", std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
}

Tensor VitModel::forward(const Tensor& pixels) const {
  Tensor x = embeddings->forward(pixels);
  const ModuleList<VitLayer>& layers = *encoder->layer;
  for (size_t l = 0; l < layers.size(); ++l) x = layers[l].forward(x, SeqContext{});
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

Tensor Vit::pipeline_batch(const Tensor& pixels, const Tensor& labels) const {
  MAMMOTH_CHECK(pixels.dim() == 4 && labels.dim() == 1 && labels.size(0) == pixels.size(0))
      << "[Vit::pipeline_batch] pixels [B, C, H, W] and labels [B], got "
      << engine::shape_str(pixels.shape()) << " and " << engine::shape_str(labels.shape());
  const int64_t B = pixels.size(0);
  return engine::concat({engine::cast(pixels, DType::kF32).reshape({B, -1}),
                         engine::cast(labels, DType::kF32).reshape({B, 1})},
                        1);
}

namespace {
// The pixels [B, C, H, W] and labels i64 [B] of a packed micro-batch.
std::pair<Tensor, Tensor> unpack(const Tensor& batch, const ModelConfig& c) {
  const int64_t pixels = c.num_channels * c.image_size * c.image_size;
  MAMMOTH_CHECK(batch.dim() == 2 && batch.dtype() == DType::kF32 && batch.size(1) == pixels + 1)
      << "[Vit::pipeline] a micro-batch is f32 [B, " << pixels + 1
      << "] (pixels, then the label), got " << engine::shape_str(batch.shape());
  const int64_t B = batch.size(0);
  return {batch.slice(1, 0, pixels).reshape({B, c.num_channels, c.image_size, c.image_size}),
          engine::cast(batch.slice(1, pixels, pixels + 1).reshape({B}), DType::kI64)};
}
}  // namespace

Tensor Vit::pipeline_embed(const Tensor& batch) {
  return vit->embeddings->forward(unpack(batch, config_).first);
}

Tensor Vit::pipeline_block(int64_t l, const Tensor& x, const Tensor&) {
  return (*vit->encoder->layer)[static_cast<size_t>(l)].forward(x, SeqContext{});
}

Tensor Vit::pipeline_loss(const Tensor& x, const Tensor& batch) {
  const Tensor logits = classifier->forward(vit->layernorm->forward(x).select(1, 0));
  return engine::cross_entropy(logits, unpack(batch, config_).second);
}

Model::PipelinePart Vit::pipeline_part(const std::string& name) const {
  const std::string layers = "vit.encoder.layer.";
  if (name.rfind(layers, 0) == 0) {
    const size_t at = layers.size();
    return {.block = std::stoll(name.substr(at, name.find('.', at) - at))};
  }
  if (name.rfind("vit.embeddings.", 0) == 0) return {.embed = true};
  if (name.rfind("vit.layernorm.", 0) == 0 || name.rfind("classifier.", 0) == 0)
    return {.head = true};
  MAMMOTH_THROW() << "[Vit::pipeline_part] parameter '" << name << "' belongs to no part";
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
