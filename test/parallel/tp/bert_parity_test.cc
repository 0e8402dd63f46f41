// BERT (masked LM) under tensor / sequence parallelism against a single-process run
// (bert_policy.cc): every rank also trains the single-device model on the whole batch; the
// sharded model must give the same loss at each of 10 AdamW steps and, at the end, the same
// (gathered, unpadded) parameters and logits. The vocabulary (37) and sequence (13 tokens)
// divide by neither tp nor sp, so padded keys must be hidden from the bidirectional attention.
// A third of the positions are masked (input token 36, the target the original token); the
// pooler and classifier take no part in the loss and must stay untouched, as on one device.
//
// f64 and the tolerances of gpt2_parity_test.cc: losses 1e-10, parameters and logits 1e-9
// (absolute); 1e-6 / 1e-5 for ring attention, whose reference (the fused engine::attention)
// has a backward accurate to ~1e-7 only.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/mesh.h"

using namespace mammoth;
using engine::Tensor;

namespace {

constexpr int64_t kSeq = 13, kVocab = 37, kBatch = 4, kSteps = 10, kMask = kVocab - 1;

std::shared_ptr<parallel::MpiCommunicator> world() {
  static std::shared_ptr<parallel::MpiCommunicator> w = parallel::mpi_world({.timeout_s = 120});
  return w;
}

std::shared_ptr<models::LanguageModel> make_model() {
  models::ModelOptions mo;
  mo.vocab_size = kVocab;
  mo.max_seq = 32;
  mo.dropout = 0.0;
  mo.seed = 5;
  mo.dtype = DType::kF64;
  return models::create_language_model("bert-tiny", mo);
}

struct Batch {
  Tensor ids, targets;
};

// Rows [first, first + count) of step `step`'s batch: 4 positions of each row masked (the same
// count in every row, so the mean over dp ranks' means is the whole batch's mean).
Batch batch(int64_t step, int64_t first, int64_t count) {
  std::vector<int64_t> ids, targets;
  for (int64_t b = first; b < first + count; ++b) {
    for (int64_t t = 0; t < kSeq; ++t) {
      const int64_t token = (step * 3 + b * 7 + t * (b % 3 + 1)) % (kVocab - 1);
      const bool masked = t < 12 && (t + b + step) % 3 == 0;  // 4 per row
      ids.push_back(masked ? kMask : token);
      targets.push_back(masked ? token : -100);
    }
  }
  return {Tensor::from_ints(ids, {count, kSeq}), Tensor::from_ints(targets, {count, kSeq})};
}

engine::optim::AdamWOptions adamw() {
  engine::optim::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  o.eps = 1e-5;
  return o;
}

struct Run {
  std::vector<double> losses;
  std::map<std::string, Tensor> params;
};

Run reference() {
  auto model = make_model();
  engine::optim::AdamW opt(model->named_parameters(), adamw());
  Run r;
  for (int64_t s = 0; s < kSteps; ++s) {
    Batch b = batch(s, 0, kBatch);
    Tensor l = model->loss(b.ids, b.targets);
    l.backward();
    opt.step();
    opt.zero_grad();
    r.losses.push_back(l.item());
  }
  for (auto& [n, p] : model->named_parameters()) r.params[n] = p.detach().clone();
  return r;
}

// Bytes of the encoder layers' linear weights (the part tp divides).
int64_t linear_weight_bytes(const engine::nn::NamedTensors& params) {
  int64_t n = 0;
  for (const auto& [name, t] : params) {
    if (name.rfind("bert.encoder.layer.", 0) == 0 && t.dim() == 2) n += t.nbytes();
  }
  return n;
}

void parity(const parallel::MeshShape& shape, models::SpMode mode, bool recompute = false) {
  auto w = world();
  REQUIRE(w->size() == shape.product());  // run this case with -np = dp*tp*sp
  parallel::DeviceMesh mesh(w, shape);
  const Run ref = reference();
  const bool ring = mode == models::SpMode::kRing;
  const double loss_tol = ring ? 1e-6 : 1e-10, param_tol = ring ? 1e-5 : 1e-9;
  const std::string tag =
      "[bert parity " + shape.str() + " sp_mode=" + models::sp_mode_name(mode) + "]";
  double last_loss = 0;

  auto full = make_model();
  full->set_activation_checkpointing(recompute);
  auto sharded = models::apply_policy(*full, mesh, {.sp_mode = mode});
  REQUIRE(sharded->activation_checkpointing() == recompute);
  std::set<std::string> names, full_names;
  for (auto& [n, t] : sharded->named_parameters()) names.insert(n);
  for (auto& [n, t] : full->named_parameters()) full_names.insert(n);
  REQUIRE(names == full_names);
  REQUIRE(names.count("classifier.weight") == 1);
  const double ratio = double(linear_weight_bytes(sharded->named_parameters())) /
                       double(linear_weight_bytes(full->named_parameters()));
  if (mesh.rank() == 0) {
    std::printf("%s encoder linear weights per rank: %.4f of single device\n", tag.c_str(), ratio);
  }
  REQUIRE(std::abs(ratio - 1.0 / shape.tp) < 1e-9);
  {
    std::map<std::string, Tensor> start;
    for (auto& [n, t] : full->named_parameters()) start[n] = t;
    for (auto& [n, t] : sharded->full_parameters()) {
      CAPTURE(n);
      REQUIRE(t.shape() == start.at(n).shape());
      REQUIRE(engine::max_abs(engine::sub(t, start.at(n))) == 0.0);
    }
  }

  engine::optim::AdamW opt(sharded->named_parameters(), adamw());
  parallel::Communicator& dp = mesh.group(parallel::Axis::kDp);
  const int64_t per_dp = kBatch / shape.dp;
  for (int64_t s = 0; s < kSteps; ++s) {
    Batch b = batch(s, mesh.coord(parallel::Axis::kDp) * per_dp, per_dp);
    Tensor l = sharded->loss(b.ids, b.targets);
    l.backward();
    sharded->sync_grads();
    Tensor lv = l.detach().clone();
    dp.all_reduce(lv, parallel::ReduceOp::kAvg);
    for (auto& [n, p] : sharded->named_parameters()) {
      Tensor g = p.grad();
      const bool unused = n.rfind("bert.pooler.", 0) == 0 || n.rfind("classifier.", 0) == 0;
      CAPTURE(n);
      REQUIRE(g.defined() != unused);  // unused parameters keep no gradient, as on one device
      if (!g.defined()) continue;
      g = g.contiguous().clone();
      dp.all_reduce(g, parallel::ReduceOp::kAvg);
      p.set_grad(g);
    }
    opt.step();
    opt.zero_grad();
    CAPTURE(s, lv.item(), ref.losses[s]);
    REQUIRE(std::abs(lv.item() - ref.losses[s]) < loss_tol);
    last_loss = lv.item();
  }
  double worst = 0;
  for (auto& [n, t] : sharded->full_parameters()) {
    const double d = engine::max_abs(engine::sub(t, ref.params.at(n)));
    CAPTURE(n, d);
    REQUIRE(d < param_tol);
    worst = std::max(worst, d);
  }
  auto trained = make_model();
  {
    engine::NoGradGuard ng;
    auto tp_params = sharded->full_parameters();
    for (auto& [n, p] : trained->named_parameters()) {
      for (auto& [m, t] : tp_params)
        if (m == n) engine::copy_(p, t);
    }
    Tensor ids = batch(99, 0, 2).ids;
    const double dl = engine::max_abs(engine::sub(sharded->forward(ids), trained->forward(ids)));
    CAPTURE(dl);
    REQUIRE(dl < param_tol);
  }
  if (mesh.rank() == 0) {
    std::printf("%s %lld steps, final loss %.6f (ref %.6f), max param diff %.3g\n", tag.c_str(),
                (long long)kSteps, last_loss, ref.losses.back(), worst);
  }
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
