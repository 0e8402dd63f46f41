// ViT (image classification) under tensor / sequence parallelism against a single-process run
// (vit_policy.cc), by the shared check of parity_harness.h. vit-tiny has 16 patches + the class
// token = 17 positions, which divide by neither tp (2, 4) nor sp (2): the sequence is padded and
// the padded keys must be hidden from the bidirectional attention, and the class token
// (position 0) lives on one rank of the sequence group only.
#include "models/registry.h"
#include "models/vit/vit.h"
#include "test/parallel/tp/parity_harness.h"

using namespace mammoth;
using namespace mammoth::test_tp;

namespace {

struct VitFamily {
  std::string tag = "vit";
  std::shared_ptr<models::Vit> make_model() const {
    models::ModelOptions mo;
    mo.dropout = 0.0;
    mo.seed = 5;
    mo.dtype = DType::kF64;
    auto vit = std::dynamic_pointer_cast<models::Vit>(models::create_model("vit-tiny", mo));
    REQUIRE(vit != nullptr);
    return vit;
  }
  std::shared_ptr<models::ShardedVit> shard(const models::Vit& full,
                                            const parallel::DeviceMesh& mesh,
                                            const models::ShardOptions& o) const {
    // ViT is not a language model: apply_policy refuses it, naming vit_policy.
    REQUIRE_THROWS_WITH(models::apply_policy(full, mesh, o), Catch::Contains("vit_policy"));
    return models::vit_policy(full, mesh, o);
  }
  // Row b's pixels and label depend on b and the step only: noise around a brightness that
  // depends on the label (10 steps of 4 images are too few to learn it: the loss need not
  // fall; what matters is that both runs agree).
  Inputs batch(const models::ModelConfig& c, int64_t step, int64_t first, int64_t count) const {
    std::vector<Tensor> rows;
    std::vector<int64_t> labels;
    for (int64_t b = first; b < first + count; ++b) {
      const int64_t label = (step * 3 + b * 7) % c.num_labels;
      rows.push_back(Tensor::randn({1, c.num_channels, c.image_size, c.image_size},
                                   static_cast<uint64_t>(1000 + step * 31 + b),
                                   2.0 * double(label) / double(c.num_labels) - 1.0, 0.5,
                                   DType::kF64));
      labels.push_back(label);
    }
    return {engine::concat(rows, 0), Tensor::from_ints(labels, {count})};
  }
  // The encoder layers' linear weights.
  bool tp_linear(const std::string& name, const Tensor& t) const {
    return starts_with(name, "vit.encoder.layer.") && t.dim() == 2;
  }
  double linear_share(const models::ModelConfig&, int tp) const { return 1.0 / tp; }
  bool unused(const std::string&) const { return false; }  // every parameter is in the loss
  void check_layout(const models::ShardedVit&, const models::Vit& full,
                    const parallel::MeshShape&) const {
    REQUIRE((full.config().num_patches() + 1) % 2 != 0);  // divides by no tp / sp here
  }
  void check_trained(const models::ShardedVit&, const parallel::DeviceMesh&,
                     const models::ModelConfig&) const {}
};

void parity(const parallel::MeshShape& shape, models::SpMode mode, bool recompute = false) {
  test_tp::parity(VitFamily{}, shape, mode, recompute);
}

}  // namespace

TEST_CASE("vit tp2") { parity({.tp = 2}, models::SpMode::kNone); }
TEST_CASE("vit tp4") { parity({.tp = 4}, models::SpMode::kNone); }
TEST_CASE("vit tp2 split_gather") { parity({.tp = 2}, models::SpMode::kSplitGather); }
TEST_CASE("vit tp4 split_gather") { parity({.tp = 4}, models::SpMode::kSplitGather); }
TEST_CASE("vit sp2 ulysses") { parity({.sp = 2}, models::SpMode::kUlysses); }
TEST_CASE("vit sp2 ring") { parity({.sp = 2}, models::SpMode::kRing); }
TEST_CASE("vit dp2 tp2") { parity({.dp = 2, .tp = 2}, models::SpMode::kNone); }
TEST_CASE("vit tp2 sp2 ring") { parity({.tp = 2, .sp = 2}, models::SpMode::kRing); }
TEST_CASE("vit tp2 sp2 ulysses") { parity({.tp = 2, .sp = 2}, models::SpMode::kUlysses); }
// Activation checkpointing: every layer recomputed (collectives included) in backward.
TEST_CASE("vit tp2 split_gather recompute") {
  parity({.tp = 2}, models::SpMode::kSplitGather, true);
}
