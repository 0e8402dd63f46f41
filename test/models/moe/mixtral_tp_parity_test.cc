// Mixtral under tensor parallelism (models/policies/mixtral_policy.cc) against a single-process
// run, by the shared check of test/parallel/tp/parity_harness.h: the same loss (cross-entropy
// plus both router losses) for 10 AdamW steps, the same parameters and logits, in f64.
// mixtral-tiny with a vocabulary of 37 (padded under tp), 13 tokens, 4 query and 2 KV heads:
// at tp 2 the KV heads are split, at tp 4 each rank holds a copy of one. Only the attention is
// split; the experts and the router are whole on every rank and must stay identical there.
// (No dp case here: the harness's reference takes the whole batch's router losses, a dp rank
// its own rows'; dp x tp is checked through `mammoth train` against gradient accumulation.)
#include "models/mixtral/mixtral.h"
#include "models/registry.h"
#include "parallel/tensor_parallel/mappings.h"
#include "test/parallel/tp/parity_harness.h"

using namespace mammoth;
using namespace mammoth::test_tp;

namespace {

constexpr int64_t kSeq = 13, kVocab = 37;

bool in_attention(const std::string& name) { return name.find(".self_attn.") != std::string::npos; }

struct Mixtral : LanguageFamily {
  bool tied = false;
  std::string tag = "mixtral";
  explicit Mixtral(bool tie) : tied(tie) {
    if (tied) tag += " tied";
  }
  std::shared_ptr<models::LanguageModel> make_model() const {
    models::ModelOptions mo;
    mo.vocab_size = kVocab;
    mo.max_seq = 32;
    mo.dtype = DType::kF64;
    models::ModelConfig c = models::apply_options(models::resolve_config("mixtral-tiny"), mo);
    c.tie_embeddings = tied;
    // Both router losses, large enough to move the router.
    c.moe_aux_loss_coef = 0.05;
    c.moe_z_loss_coef = 0.01;
    c.validate();
    auto m = std::dynamic_pointer_cast<models::LanguageModel>(models::build_model(c, 5));
    REQUIRE(m != nullptr);
    return m;
  }
  Inputs batch(const models::ModelConfig&, int64_t step, int64_t first, int64_t count) const {
    return {token_batch(step, first, count, kSeq, kVocab), Tensor()};
  }
  // The weights tp divides: the attention projections.
  bool tp_linear(const std::string& name, const Tensor& t) const {
    return in_attention(name) && t.dim() == 2;
  }
  double linear_share(const models::ModelConfig& c, int tp) const {
    const double D = static_cast<double>(c.head_dim()), C = static_cast<double>(c.d_model);
    const double q = c.n_head * D * C, kv = 2 * c.n_kv_head * D * C, o = q;
    const double kv_local = c.n_kv_head >= tp ? kv / tp : 2 * D * C;
    return ((q + o) / tp + kv_local) / (q + kv + o);
  }
  void check_layout(const models::ShardedLanguageModel& sharded, const models::LanguageModel&,
                    const parallel::MeshShape& shape) const {
    for (auto& [n, t] : sharded.named_parameters()) {
      // Whole: the norms, the router and the experts; split: the attention and the
      // vocabulary tables.
      const bool split =
          in_attention(n) || n == "model.embed_tokens.weight" || n == "lm_head.weight";
      CAPTURE(n);
      REQUIRE(sharded.holds_full(n) == (!split || shape.tp == 1));
    }
  }
  // Every tp rank routed alike: the router and experts are bitwise the same on each, and the
  // router losses of the last forward too.
  void check_trained(const models::ShardedLanguageModel& sharded, const parallel::DeviceMesh& mesh,
                     const models::ModelConfig& cfg) const {
    parallel::Communicator& tp = mesh.group(parallel::Axis::kTp);
    const int size = tp.size();
    int checked = 0;
    for (auto& [n, t] : sharded.named_parameters()) {
      if (n.find(".block_sparse_moe.") == std::string::npos) continue;
      Tensor all = parallel::comm_ops::all_gather(t.detach().contiguous().reshape({1, -1}), tp, 0);
      for (int r = 1; r < size; ++r) {
        CAPTURE(n, r);
        REQUIRE(engine::max_abs(engine::sub(all.select(0, r), all.select(0, 0))) == 0.0);
      }
      ++checked;
    }
    // 2 layers x (gate + 4 experts x 3 projections).
    REQUIRE(checked == cfg.n_layer * (1 + 3 * cfg.moe_experts));
    const double aux = models::moe_aux_loss(models::router_sums(sharded)).item();
    const Tensor every =
        parallel::comm_ops::all_gather(Tensor::from_vector({aux}, {1}, DType::kF64), tp, 0);
    for (int r = 0; r < size; ++r) REQUIRE(every.to_vector()[r] == aux);
    REQUIRE(aux > 0.0);
  }
};

}  // namespace

TEST_CASE("mixtral tp2") { test_tp::parity(Mixtral(false), {.tp = 2}, models::SpMode::kNone); }
TEST_CASE("mixtral tp4 tied") { test_tp::parity(Mixtral(true), {.tp = 4}, models::SpMode::kNone); }
// The policy's own refusal (the plan refuses it first, by name, for `mammoth train`).
TEST_CASE("mixtral sequence parallelism refused") {
  auto w = world();
  REQUIRE(w->size() == 2);
  auto model = Mixtral(false).make_model();
  parallel::DeviceMesh tp2(w, {.tp = 2});
  REQUIRE_THROWS_WITH(models::apply_policy(*model, tp2, {.sp_mode = models::SpMode::kSplitGather}),
                      Catch::Contains("router losses"));
  parallel::DeviceMesh sp2(w, {.sp = 2});
  REQUIRE_THROWS_WITH(models::apply_policy(*model, sp2, {.sp_mode = models::SpMode::kRing}),
                      Catch::Contains("router losses"));
}
