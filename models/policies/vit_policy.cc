// ViT's sharding policy: the encoder of models/vit rebuilt from tensor-parallel layers, with
// Hugging Face's parameter names.
//
//   attention.attention.query/key/value  column-parallel by heads: rank r holds heads
//                                        [r H/tp, (r+1) H/tp) of each (weights and biases)
//   attention.output.dense               row-parallel over the same heads
//   intermediate.dense                   column-parallel (d_ff / tp), output.dense row-parallel
//   embeddings (class token, positions, the patch projection: a convolution applied as a
//   linear map on flattened patches), layernorm_before/after, vit.layernorm, classifier
//                                        replicated
//
// The token sequence is the class token (position 0) and the N patches: N + 1 positions, split
// as BERT's are (split_gather over tp; ulysses or ring over sp; padded at the end when it does
// not divide; padded positions are keys nobody attends to). A rank embeds only the patches of
// the positions it holds. The classifier reads the final hidden state of position 0, which one
// rank of the sequence group holds: every rank applies the classifier to its own first row and
// scales the result by 1 on the holder and 0 elsewhere, and the logits are summed over the
// group (reduce_from_group). The graph is thus the same on every rank (sync_grads needs that),
// the classifier's and final LayerNorm's gradients are the holder's alone until sync_grads sums
// them, and every rank returns the same logits and loss.
//
// Dropout inside ulysses/ring attention is not applied (as for the other families); the other
// dropouts draw from each rank's own stream, so only dropout-free runs match one device exactly.
#include <memory>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/layers.h"
#include "models/policies/encoder_attention.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "models/vit/vit.h"
#include "parallel/sequence_parallel/sequence_parallel.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mammoth::models {

using engine::Tensor;
using engine::nn::Dropout;
using engine::nn::LayerNorm;
using engine::nn::Linear;
using parallel::Axis;
using parallel::ColumnParallelLinear;
using parallel::Communicator;
using parallel::RowParallelLinear;

namespace {

// What the attention needs to know about the sequence layout of its input.
using SeqContext = EncoderSeqContext;

class TpVitEmbeddings : public engine::nn::Module {
 public:
  explicit TpVitEmbeddings(const ModelConfig& c) : config_(c) {
    cls_token = register_parameter("cls_token", Tensor::zeros({1, 1, c.d_model}, c.dtype));
    position_embeddings = register_parameter(
        "position_embeddings", Tensor::zeros({1, c.num_patches() + 1, c.d_model}, c.dtype));
    patch_embeddings = register_module("patch_embeddings", std::make_shared<VitPatchEmbeddings>(c));
    dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout));
  }

  // pixels [B, C, H, W] -> [B, n, D]: the embeddings of this rank's part `part` of `layout`
  // over the N + 1 tokens (zeros past the end before dropout's scaling: padding).
  Tensor forward(const Tensor& pixels, const parallel::SequenceLayout& layout, int part) const {
    const int64_t C = config_.num_channels, P = config_.patch_size, D = config_.d_model;
    MAMMOTH_CHECK(pixels.dim() == 4 && pixels.size(1) == C && pixels.size(2) % P == 0 &&
                  pixels.size(3) % P == 0)
        << "[ShardedVit::forward] pixels must be [B, " << C << ", H, W] with H, W multiples of "
        << P << ", got " << engine::shape_str(pixels.shape());
    const int64_t B = pixels.size(0), h = pixels.size(2) / P, w = pixels.size(3) / P;
    const int64_t N = h * w;
    MAMMOTH_CHECK(N + 1 == position_embeddings.size(1) && N + 1 == layout.length())
        << "[ShardedVit::forward] " << N << " patches, but the position table has "
        << position_embeddings.size(1) - 1 << " (image_size / patch_size squared)";
    // Flattened patches in (c, y, x) order as the single-device PatchProjection, behind a zero
    // row standing in for the class token, so that position p of the sequence is row p.
    Tensor patches =
        pixels.reshape({B, C, h, P, w, P}).permute({0, 2, 4, 1, 3, 5}).reshape({B, N, C * P * P});
    Tensor tokens = engine::concat(
        {Tensor::zeros({B, 1, C * P * P}, pixels.dtype(), pixels.device()), patches}, 1);
    const PatchProjection& proj = *patch_embeddings->projection;
    Tensor x = engine::linear(parallel::shard_sequence(tokens, 1, layout, part),
                              proj.weight.reshape({D, C * P * P}), proj.bias);
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

  Tensor cls_token;            // [1, 1, D]
  Tensor position_embeddings;  // [1, N+1, D]
  std::shared_ptr<VitPatchEmbeddings> patch_embeddings;
  std::shared_ptr<Dropout> dropout;

 private:
  const ModelConfig& config_;
};

// A row-parallel Linear named "dense" followed by dropout (ViTSelfOutput, ViTOutput).
class TpVitRowDense : public engine::nn::Module {
 public:
  TpVitRowDense(const ModelConfig& c, int64_t in, Communicator& tp, bool sequence_parallel) {
    dense = register_module(
        "dense", std::make_shared<RowParallelLinear>(
                     in, c.d_model, true, c.dtype, tp,
                     RowParallelLinear::Options{.sequence_parallel = sequence_parallel}));
    dropout_ = register_module("dropout", std::make_shared<Dropout>(c.dropout));
  }
  Tensor forward(const Tensor& x) const { return dropout_->forward(dense->forward(x)); }
  std::shared_ptr<RowParallelLinear> dense;

 private:
  std::shared_ptr<Dropout> dropout_;
};

// ViTIntermediate: a column-parallel "dense" (no dropout).
class TpVitIntermediate : public engine::nn::Module {
 public:
  TpVitIntermediate(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    dense = register_module(
        "dense", std::make_shared<ColumnParallelLinear>(
                     c.d_model, c.d_ff, true, c.dtype, tp,
                     ColumnParallelLinear::Options{.sequence_parallel = sequence_parallel}));
  }
  std::shared_ptr<ColumnParallelLinear> dense;
};

class TpVitAttention : public engine::nn::Module {
 public:
  TpVitAttention(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    attention = register_module("attention", std::make_shared<TpEncoderSelfAttention>(
                                                 c, tp, sequence_parallel, "vit_policy"));
    output = register_module("output",
                             std::make_shared<TpVitRowDense>(c, c.d_model, tp, sequence_parallel));
  }
  Tensor forward(const Tensor& x, const SeqContext& seq) const {
    return output->forward(attention->forward(x, seq));
  }
  std::shared_ptr<TpEncoderSelfAttention> attention;
  std::shared_ptr<TpVitRowDense> output;
};

// Pre-LN: h = x + attention(LN(x)); out = h + output(gelu(intermediate(LN(h)))). Under
// split_gather x, h and the LayerNorms hold this rank's positions only.
class TpVitLayer : public engine::nn::Module {
 public:
  TpVitLayer(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    layernorm_before = register_module("layernorm_before",
                                       std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
    attention =
        register_module("attention", std::make_shared<TpVitAttention>(c, tp, sequence_parallel));
    layernorm_after = register_module("layernorm_after",
                                      std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
    intermediate = register_module("intermediate",
                                   std::make_shared<TpVitIntermediate>(c, tp, sequence_parallel));
    output = register_module("output",
                             std::make_shared<TpVitRowDense>(c, c.d_ff, tp, sequence_parallel));
  }
  Tensor forward(const Tensor& x, const SeqContext& seq) const {
    Tensor h = x + attention->forward(layernorm_before->forward(x), seq);
    return h +
           output->forward(engine::gelu(intermediate->dense->forward(layernorm_after->forward(h))));
  }
  std::shared_ptr<LayerNorm> layernorm_before, layernorm_after;
  std::shared_ptr<TpVitAttention> attention;
  std::shared_ptr<TpVitIntermediate> intermediate;
  std::shared_ptr<TpVitRowDense> output;
};

class TpVitModel : public engine::nn::Module {
 public:
  TpVitModel(const ModelConfig& c, Communicator& tp, bool sequence_parallel) {
    embeddings = register_module("embeddings", std::make_shared<TpVitEmbeddings>(c));
    encoder = register_module("encoder",
                              std::make_shared<TpEncoder<TpVitLayer>>(c, tp, sequence_parallel));
    layernorm =
        register_module("layernorm", std::make_shared<LayerNorm>(c.d_model, c.norm_eps, c.dtype));
  }
  std::shared_ptr<TpVitEmbeddings> embeddings;
  std::shared_ptr<TpEncoder<TpVitLayer>> encoder;
  std::shared_ptr<LayerNorm> layernorm;
};

class TpVit : public ShardedVit {
 public:
  TpVit(const ModelConfig& config, const parallel::DeviceMesh& mesh, const ShardOptions& options)
      : ShardedVit(mesh, options), config_(config) {
    Communicator& tp = mesh.group(Axis::kTp);
    const bool sg = options.sp_mode == SpMode::kSplitGather;
    const ModelConfig& c = config_;
    vit = register_module("vit", std::make_shared<TpVitModel>(c, tp, sg));
    classifier = register_module("classifier",
                                 std::make_shared<Linear>(c.d_model, c.num_labels, true, c.dtype));
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const std::string p = "vit.encoder.layer." + std::to_string(l) + ".";
      const TpVitLayer& layer = (*vit->encoder->layer)[l];
      const TpEncoderSelfAttention& self = *layer.attention->attention;
      for (const auto& [name, spec] : self.shard_specs(p + "attention.attention."))
        set_spec(name, spec);
      set_spec(p + "attention.output.dense.weight", layer.attention->output->dense->weight_spec());
      set_spec(p + "intermediate.dense.weight", layer.intermediate->dense->weight_spec());
      set_spec(p + "intermediate.dense.bias", layer.intermediate->dense->weight_spec());
      set_spec(p + "output.dense.weight", layer.output->dense->weight_spec());
    }
  }

  const ModelConfig& config() const override { return config_; }
  HfLayout hf_layout() const override { return build_model(config_)->hf_layout(); }

  Tensor forward(const Tensor& pixels) override {
    const int64_t T = config_.num_patches() + 1;
    const SeqPlan plan = plan_sequence(T);
    const SpMode mode = options_.sp_mode;
    const int64_t B = pixels.dim() == 4 ? pixels.size(0) : 0;
    SeqContext seq{mode, plan.layout, &mesh_.group(Axis::kSp), Tensor()};
    const int64_t padded = plan.layout->padded();
    if (mode == SpMode::kSplitGather && padded > T) {
      std::vector<double> keep(static_cast<size_t>(B * padded));
      for (size_t i = 0; i < keep.size(); ++i) {
        keep[i] = static_cast<int64_t>(i) % padded < T ? 1.0 : 0.0;
      }
      seq.key_mask = Tensor::from_vector(keep, {B, padded}, DType::kBool).to(pixels.device());
    }
    Tensor x = vit->embeddings->forward(pixels, *plan.layout, plan.part);
    for (size_t l = 0; l < vit->encoder->layer->size(); ++l) {
      const TpVitLayer* layer = &(*vit->encoder->layer)[l];
      x = run_block(
          recomputes(static_cast<int64_t>(l)),
          [layer, seq](const Tensor& in) { return layer->forward(in, seq); }, x);
    }
    x = vit->layernorm->forward(x);
    // The class token's row: at local index `at` on the rank holding position 0.
    int64_t at = -1;
    for (size_t i = 0; i < plan.local.size(); ++i) {
      if (plan.local[i] == 0) at = static_cast<int64_t>(i);
    }
    Communicator& group = sequence_group();
    if (group.size() == 1) {
      MAMMOTH_CHECK(at == 0) << "[ShardedVit::forward] position 0 not first on a single rank";
      return classifier->forward(x.select(1, 0));
    }
    Tensor mine = classifier->forward(x.select(1, at >= 0 ? at : 0)) * (at >= 0 ? 1.0 : 0.0);
    return parallel::reduce_from_group(mine, group);
  }

  Tensor loss(const Tensor& pixels, const Tensor& labels) override {
    return engine::cross_entropy(forward(pixels), labels);
  }

  std::shared_ptr<TpVitModel> vit;
  std::shared_ptr<Linear> classifier;

 private:
  ModelConfig config_;
};

}  // namespace

std::shared_ptr<ShardedVit> vit_policy(const Vit& model, const parallel::DeviceMesh& mesh,
                                       const ShardOptions& options) {
  return adopt(std::make_shared<TpVit>(model.config(), mesh, options), model);
}

}  // namespace mammoth::models
