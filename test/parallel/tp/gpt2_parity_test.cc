// GPT-2 under tensor / sequence parallelism against a single-process run (gpt2_policy.cc), by
// the shared check of parity_harness.h. The vocabulary (37) and sequence (13 tokens) divide by
// neither tp nor sp, so the padding paths are exercised.
#include "models/registry.h"
#include "test/parallel/tp/parity_harness.h"

using namespace mammoth;
using namespace mammoth::test_tp;

namespace {

constexpr int64_t kSeq = 13, kVocab = 37;

struct Gpt2 : LanguageFamily {
  std::string tag = "gpt2";
  std::shared_ptr<models::LanguageModel> make_model() const {
    models::ModelOptions mo;
    mo.vocab_size = kVocab;
    mo.max_seq = 32;
    mo.seed = 5;
    mo.dtype = DType::kF64;
    return models::create_language_model("gpt2-tiny", mo);
  }
  Inputs batch(const models::ModelConfig&, int64_t step, int64_t first, int64_t count) const {
    return {token_batch(step, first, count, kSeq, kVocab), Tensor()};
  }
  // The transformer blocks' linear weights.
  bool tp_linear(const std::string& name, const Tensor& t) const {
    return starts_with(name, "h.") && t.dim() == 2;
  }
};

void parity(const parallel::MeshShape& shape, models::SpMode mode, bool recompute = false) {
  test_tp::parity(Gpt2{}, shape, mode, recompute);
}

}  // namespace

TEST_CASE("gpt2 tp2") { parity({.tp = 2}, models::SpMode::kNone); }
TEST_CASE("gpt2 tp4") { parity({.tp = 4}, models::SpMode::kNone); }
TEST_CASE("gpt2 tp2 split_gather") { parity({.tp = 2}, models::SpMode::kSplitGather); }
TEST_CASE("gpt2 tp4 split_gather") { parity({.tp = 4}, models::SpMode::kSplitGather); }
TEST_CASE("gpt2 sp2 ulysses") { parity({.sp = 2}, models::SpMode::kUlysses); }
TEST_CASE("gpt2 sp2 ring") { parity({.sp = 2}, models::SpMode::kRing); }
TEST_CASE("gpt2 dp2 tp2") { parity({.dp = 2, .tp = 2}, models::SpMode::kNone); }
TEST_CASE("gpt2 tp2 sp2 ring") { parity({.tp = 2, .sp = 2}, models::SpMode::kRing); }
// Activation checkpointing: every block recomputed (collectives included) in backward.
TEST_CASE("gpt2 tp2 split_gather recompute") {
  parity({.tp = 2}, models::SpMode::kSplitGather, true);
}
