// The tensor / sequence parallel parity check shared by the model families' tests
// (gpt2_parity_test.cc, llama_parity_test.cc, bert_parity_test.cc, vit_parity_test.cc).
//
// Every rank also trains the single-device model on the whole batch; the sharded model must
// keep the single-device parameter names, start from the same parameters (shard, then gather
// back: exact), hold 1/tp of the transformer's linear weights (or the family's stated share),
// give the same loss at each of 10 AdamW steps and, at the end, the same (gathered, unpadded)
// parameters and logits. A family's test supplies the model, the batch and its extra checks
// through a Family object (below); each Catch test case needs the number of ranks its mesh has
// (BUILD.bazel runs it by name under mpirun).
//
// The models run in f64 so the tolerances can be tight: losses 1e-10, parameters and logits
// 1e-9 (absolute). tp and sp change the order of floating-point sums (row-parallel partial
// sums, the vocab-parallel softmax, the ring's online softmax), so results are not bitwise
// equal; in f32 the same runs drift by ~2e-5 in the loss after 10 steps at lr 1e-2. Ring
// attention is exact softmax algebra, but the reference's fused engine::attention has a backward
// accurate to ~1e-7 only (even in f64; see sequence_parallel_test), so ring runs, which never
// call it, are compared to 1e-6 (losses) and 1e-5 (parameters). Adam's eps is 1e-5 (as in the
// DP test) so that gradients that are zero up to rounding are not amplified to lr-sized steps.
//
// A Family provides (const member functions; M is the single-device model type, S the sharded;
// language-model families derive shard, linear_share, unused and the checks from
// LanguageFamily below and override what differs):
//   std::string tag;                                       // "[<tag> parity ...]" in messages
//   std::shared_ptr<M> make_model() const;                 // f64, the same seed every call
//   std::shared_ptr<S> shard(const M&, const parallel::DeviceMesh&,
//                            const models::ShardOptions&) const;
//   Inputs batch(const models::ModelConfig&, int64_t step, int64_t first, int64_t count) const;
//       // rows [first, first + count) of step `step`'s batch (a dp rank's rows are the
//       // matching rows of the whole batch)
//   bool tp_linear(const std::string& name, const Tensor& t) const;  // the weights tp divides
//   double linear_share(const models::ModelConfig&, int tp) const;    // their per-rank share
//   bool unused(const std::string& name) const;   // takes no part in the loss: no gradient
//   void check_layout(const S&, const M& full, const parallel::MeshShape&) const;
//   void check_trained(const S&, const parallel::DeviceMesh&, const models::ModelConfig&) const;
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "models/policies/policy.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/mesh.h"

namespace mammoth::test_tp {

using engine::Tensor;

inline constexpr int64_t kBatch = 4, kSteps = 10;

// A batch: inputs x (token ids or pixels) and targets y (undefined: a language model's
// next-token targets from x).
struct Inputs {
  Tensor x, y;
};

inline std::shared_ptr<parallel::MpiCommunicator> world() {
  static std::shared_ptr<parallel::MpiCommunicator> w = parallel::mpi_world({.timeout_s = 120});
  return w;
}

inline engine::optim::AdamWOptions adamw() {
  engine::optim::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  o.eps = 1e-5;
  return o;
}

template <class Model>
Tensor loss_of(Model& model, const Inputs& b) {
  if constexpr (requires { model.loss(b.x); }) {
    if (!b.y.defined()) return model.loss(b.x);
  }
  return model.loss(b.x, b.y);
}

struct Run {
  std::vector<double> losses;
  std::map<std::string, Tensor> params;
};

// The single-device run on the whole batch.
template <class Family>
Run reference(const Family& f) {
  auto model = f.make_model();
  engine::optim::AdamW opt(model->named_parameters(), adamw());
  Run r;
  for (int64_t s = 0; s < kSteps; ++s) {
    Tensor l = loss_of(*model, f.batch(model->config(), s, 0, kBatch));
    l.backward();
    opt.step();
    opt.zero_grad();
    r.losses.push_back(l.item());
  }
  for (auto& [n, p] : model->named_parameters()) r.params[n] = p.detach().clone();
  return r;
}

template <class Family>
int64_t linear_weight_bytes(const Family& f, const engine::nn::NamedTensors& params) {
  int64_t n = 0;
  for (const auto& [name, t] : params) {
    if (f.tp_linear(name, t)) n += static_cast<int64_t>(t.nbytes());
  }
  return n;
}

template <class Family>
void parity(const Family& f, const parallel::MeshShape& shape, models::SpMode mode,
            bool recompute = false) {
  auto w = world();
  REQUIRE(w->size() == shape.product());  // run this case with -np = dp*tp*sp
  parallel::DeviceMesh mesh(w, shape);
  const Run ref = reference(f);
  const bool ring = mode == models::SpMode::kRing;
  const double loss_tol = ring ? 1e-6 : 1e-10, param_tol = ring ? 1e-5 : 1e-9;
  const std::string tag = "[" + f.tag + " parity " + shape.str() +
                          " sp_mode=" + models::sp_mode_name(mode) +
                          (recompute ? " recompute" : "") + "]";

  auto full = f.make_model();
  const models::ModelConfig& cfg = full->config();
  full->set_recompute_blocks(recompute ? -1 : 0);
  auto sharded = f.shard(*full, mesh, {.sp_mode = mode});
  REQUIRE(sharded->recompute_blocks() == (recompute ? -1 : 0));
  // Same names as the single-device model.
  std::set<std::string> names, full_names;
  for (auto& [n, t] : sharded->named_parameters()) names.insert(n);
  for (auto& [n, t] : full->named_parameters()) full_names.insert(n);
  REQUIRE(names == full_names);
  // Per-rank parameter memory of the linear layers.
  const double ratio = double(linear_weight_bytes(f, sharded->named_parameters())) /
                       double(linear_weight_bytes(f, full->named_parameters()));
  if (mesh.rank() == 0) {
    std::printf("%s linear weights per rank: %.4f of single device (1/tp = %.4f)\n", tag.c_str(),
                ratio, 1.0 / shape.tp);
  }
  REQUIRE(std::abs(ratio - f.linear_share(cfg, shape.tp)) < 1e-9);
  f.check_layout(*sharded, *full, shape);
  // Parameters start equal to the single device's (shard, then gather back: exact).
  {
    std::map<std::string, Tensor> start;
    for (auto& [n, t] : full->named_parameters()) start[n] = t;
    for (auto& [n, t] : sharded->full_parameters()) {
      CAPTURE(n);
      REQUIRE(t.shape() == start.at(n).shape());
      REQUIRE(engine::max_abs(engine::sub(t, start.at(n))) == 0.0);
    }
  }

  // Training: the model-parallel gradient sums (sync_grads), then the dp average.
  engine::optim::AdamW opt(sharded->named_parameters(), adamw());
  parallel::Communicator& dp = mesh.group(parallel::Axis::kDp);
  const int64_t per_dp = kBatch / shape.dp;
  double first_loss = 0, last_loss = 0;
  for (int64_t s = 0; s < kSteps; ++s) {
    Tensor l = loss_of(*sharded, f.batch(cfg, s, mesh.coord(parallel::Axis::kDp) * per_dp, per_dp));
    l.backward();
    sharded->sync_grads();
    Tensor lv = l.detach().clone();
    dp.all_reduce(lv, parallel::ReduceOp::kAvg);
    for (auto& [n, p] : sharded->named_parameters()) {
      Tensor g = p.grad();
      CAPTURE(n);
      REQUIRE(g.defined() != f.unused(n));  // as on one device
      if (!g.defined()) continue;
      g = g.contiguous().clone();
      dp.all_reduce(g, parallel::ReduceOp::kAvg);
      p.set_grad(g);
    }
    opt.step();
    opt.zero_grad();
    CAPTURE(s, lv.item(), ref.losses[s]);
    REQUIRE(std::abs(lv.item() - ref.losses[s]) < loss_tol);
    if (s == 0) first_loss = lv.item();
    last_loss = lv.item();
  }
  double worst = 0;
  for (auto& [n, t] : sharded->full_parameters()) {
    const double d = engine::max_abs(engine::sub(t, ref.params.at(n)));
    CAPTURE(n, d);
    REQUIRE(d < param_tol);
    worst = std::max(worst, d);
  }
  // The parameters moved (so the comparison above is not of two untrained models).
  auto trained = f.make_model();
  double moved = 0;
  for (auto& [n, t] : trained->named_parameters()) {
    moved = std::max(moved, engine::max_abs(engine::sub(t, ref.params.at(n))));
  }
  REQUIRE(moved > 1e-3);
  f.check_trained(*sharded, mesh, cfg);
  // Logits of the sharded forward (gathered) against the single-device model's.
  {
    engine::NoGradGuard ng;
    auto tp_params = sharded->full_parameters();
    for (auto& [n, p] : trained->named_parameters()) {
      for (auto& [m, t] : tp_params)
        if (m == n) engine::copy_(p, t);
    }
    const Tensor x = f.batch(cfg, 99, 0, 2).x;
    const Tensor mine = sharded->forward(x), want = trained->forward(x);
    REQUIRE(mine.shape() == want.shape());
    const double dl = engine::max_abs(engine::sub(mine, want));
    CAPTURE(dl);
    REQUIRE(dl < param_tol);
  }
  if (mesh.rank() == 0) {
    std::printf("%s %lld steps, loss %.6f -> %.6f (ref %.6f -> %.6f), max param diff %.3g\n",
                tag.c_str(), (long long)kSteps, first_loss, last_loss, ref.losses.front(),
                ref.losses.back(), worst);
  }
}

// What most language-model families share (apply_policy, 1/tp of the linear weights, every
// parameter in the loss, no extra checks); a family derives from it and overrides the rest.
struct LanguageFamily {
  std::shared_ptr<models::ShardedLanguageModel> shard(const models::LanguageModel& full,
                                                      const parallel::DeviceMesh& mesh,
                                                      const models::ShardOptions& o) const {
    return models::apply_policy(full, mesh, o);
  }
  double linear_share(const models::ModelConfig&, int tp) const { return 1.0 / tp; }
  bool unused(const std::string&) const { return false; }
  void check_layout(const models::ShardedLanguageModel&, const models::LanguageModel&,
                    const parallel::MeshShape&) const {}
  void check_trained(const models::ShardedLanguageModel&, const parallel::DeviceMesh&,
                     const models::ModelConfig&) const {}
};

// Token ids [count, seq] for rows [first, first + count) of step `step` (a language model's
// batch; `vocab` bounds the ids).
inline Tensor token_batch(int64_t step, int64_t first, int64_t count, int64_t seq, int64_t vocab) {
  std::vector<int64_t> ids;
  for (int64_t b = first; b < first + count; ++b)
    for (int64_t t = 0; t < seq; ++t) ids.push_back((step * 3 + b * 7 + t * (b % 3 + 1)) % vocab);
  return Tensor::from_ints(ids, {count, seq});
}

inline bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

}  // namespace mammoth::test_tp
