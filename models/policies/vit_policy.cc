// ViT's sharding policy. The model is models/vit's own VitModel built from Layers(tp, sp_mode),
// so the embeddings and encoder blocks are written once; this file keeps what only the sharded
// form has, with Hugging Face's parameter names:
//
//   attention.attention.query/key/value  column-parallel by heads: rank r holds heads
//                                        [r H/tp, (r+1) H/tp) of each (weights and biases)
//   attention.output.dense               row-parallel over the same heads
//   intermediate.dense                   column-parallel (d_ff / tp), output.dense row-parallel
//                                        (these four from Layers; their specs read off the
//                                        layers)
//   embeddings (class token, positions, the patch projection: a convolution applied as a
//   linear map on flattened patches), layernorm_before/after, vit.layernorm, classifier
//                                        replicated
//
// The token sequence is the class token (position 0) and the N patches: N + 1 positions, split
// as BERT's are (split_gather over tp; ulysses or ring over sp; padded at the end when it does
// not divide; padded positions are keys nobody attends to). A rank embeds only the patches of
// the positions it holds (VitEmbeddings' part forward). The classifier reads the final hidden
// state of position 0, which one rank of the sequence group holds: every rank applies the
// classifier to its own first row and scales the result by 1 on the holder and 0 elsewhere,
// and the logits are summed over the group (reduce_from_group). The graph is thus the same on
// every rank (sync_grads needs that), the classifier's and final LayerNorm's gradients are the
// holder's alone until sync_grads sums them, and every rank returns the same logits and loss.
//
// Attention dropout under ulysses/ring is refused (Layers::attention); the other dropouts draw
// from each rank's own stream, so only dropout-free runs match one device exactly.
#include <memory>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/layers.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "models/vit/vit.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mammoth::models {

using engine::Tensor;
using engine::nn::Linear;
using parallel::Axis;
using parallel::Communicator;

namespace {

class TpVit : public ShardedVit {
 public:
  TpVit(const ModelConfig& config, const parallel::DeviceMesh& mesh, const ShardOptions& options)
      : ShardedVit(mesh, options), config_(config) {
    const ModelConfig& c = config_;
    vit = register_module(
        "vit", std::make_shared<VitModel>(c, Layers(mesh.group(Axis::kTp), options.sp_mode)));
    classifier = register_module("classifier",
                                 std::make_shared<Linear>(c.d_model, c.num_labels, true, c.dtype));
    set_layer_specs();
  }

  const ModelConfig& config() const override { return config_; }
  HfLayout hf_layout() const override { return build_model(config_)->hf_layout(); }

  Tensor forward(const Tensor& pixels) override {
    const SeqPlan plan = plan_sequence(config_.num_patches() + 1);
    const int64_t B = pixels.dim() == 4 ? pixels.size(0) : 0;
    const SeqContext seq = encoder_context(plan, B, pixels.device());
    Tensor x = vit->embeddings->forward(pixels, *plan.layout, plan.part);
    for (size_t l = 0; l < vit->encoder->layer->size(); ++l) {
      const VitLayer* layer = &(*vit->encoder->layer)[l];
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

  std::shared_ptr<VitModel> vit;
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
