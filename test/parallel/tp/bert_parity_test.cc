// BERT (masked LM) under tensor / sequence parallelism against a single-process run
// (bert_policy.cc), by the shared check of parity_harness.h. The vocabulary (37) and sequence
// (13 tokens) divide by neither tp nor sp, so padded keys must be hidden from the bidirectional
// attention. A third of the positions are masked (input token 36, the target the original
// token); the pooler and classifier take no part in the loss and must stay untouched, as on one
// device.
#include "models/registry.h"
#include "test/parallel/tp/parity_harness.h"

using namespace mammoth;
using namespace mammoth::test_tp;

namespace {

constexpr int64_t kSeq = 13, kVocab = 37, kMask = kVocab - 1;

struct Bert : LanguageFamily {
  std::string tag = "bert";
  std::shared_ptr<models::LanguageModel> make_model() const {
    models::ModelOptions mo;
    mo.vocab_size = kVocab;
    mo.max_seq = 32;
    mo.dropout = 0.0;
    mo.seed = 5;
    mo.dtype = DType::kF64;
    return models::create_language_model("bert-tiny", mo);
  }
  // 4 positions of each row masked (the same count in every row, so the mean over dp ranks'
  // means is the whole batch's mean).
  Inputs batch(const models::ModelConfig&, int64_t step, int64_t first, int64_t count) const {
    std::vector<int64_t> ids, targets;
    for (int64_t b = first; b < first + count; ++b) {
      for (int64_t t = 0; t < kSeq; ++t) {
        const int64_t token = (step * 3 + b * 7 + t * (b % 3 + 1)) % (kVocab - 1);
        const bool masked = t < 12 && (t + b + step) % 3 == 0;
        ids.push_back(masked ? kMask : token);
        targets.push_back(masked ? token : -100);
      }
    }
    return {Tensor::from_ints(ids, {count, kSeq}), Tensor::from_ints(targets, {count, kSeq})};
  }
  // The encoder layers' linear weights.
  bool tp_linear(const std::string& name, const Tensor& t) const {
    return starts_with(name, "bert.encoder.layer.") && t.dim() == 2;
  }
  bool unused(const std::string& name) const {
    return starts_with(name, "bert.pooler.") || starts_with(name, "classifier.");
  }
  void check_layout(const models::ShardedLanguageModel& sharded, const models::LanguageModel&,
                    const parallel::MeshShape&) const {
    int classifiers = 0;
    for (auto& [n, t] : sharded.named_parameters()) classifiers += n == "classifier.weight";
    REQUIRE(classifiers == 1);
  }
};

void parity(const parallel::MeshShape& shape, models::SpMode mode, bool recompute = false) {
  test_tp::parity(Bert{}, shape, mode, recompute);
}

}  // namespace

TEST_CASE("bert tp2") { parity({.tp = 2}, models::SpMode::kNone); }
TEST_CASE("bert tp4") { parity({.tp = 4}, models::SpMode::kNone); }
TEST_CASE("bert tp2 split_gather") { parity({.tp = 2}, models::SpMode::kSplitGather); }
TEST_CASE("bert tp4 split_gather") { parity({.tp = 4}, models::SpMode::kSplitGather); }
TEST_CASE("bert sp2 ulysses") { parity({.sp = 2}, models::SpMode::kUlysses); }
TEST_CASE("bert sp2 ring") { parity({.sp = 2}, models::SpMode::kRing); }
TEST_CASE("bert dp2 tp2") { parity({.dp = 2, .tp = 2}, models::SpMode::kNone); }
TEST_CASE("bert tp2 sp2 ring") { parity({.tp = 2, .sp = 2}, models::SpMode::kRing); }
// Activation checkpointing: every layer recomputed (collectives included) in backward.
TEST_CASE("bert tp2 split_gather recompute") {
  parity({.tp = 2}, models::SpMode::kSplitGather, true);
}
