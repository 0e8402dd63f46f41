// Mixtral's expert parallelism (Mixtral::set_expert_parallel) against one process, under mpirun
// with W ranks = dp (W / ep) x ep. The ranks lie ep-innermost: world rank = d * ep + e, so the
// expert group of a rank is its block of ep consecutive ranks and its expert-data-parallel group
// is the ranks with the same e (they hold the same experts).
//
// Every rank builds the model twice from one seed. The reference model runs the W micro-batches
// one after the other, as one process with gradient accumulation does: loss = mean of the W
// micro-batch losses, one backward. The expert-parallel model runs micro-batch `rank` only,
// divides its loss by W and backpropagates; then the non-expert gradients are summed over the
// world and the local experts' over the expert-data-parallel group (what a trainer's reduction
// does). The summed loss and every gradient a rank holds must equal the reference's.
//
// Routers: random (top-2, dropless and with a capacity that drops), and two crafted ones whose
// gate makes the router logits (x0, -x0, x1, 0) or (x0, -x0, 0, 0) over the normed hidden
// state's channels x0, x1: expert 3, or experts 2 and 3 (the whole second ep rank), never win
// a top-1 choice. The reference's expert load confirms they got no tokens.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/mixtral/mixtral.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"

namespace mammoth {
namespace {

using engine::Tensor;

parallel::MpiCommunicator& world() {
  static std::unique_ptr<parallel::MpiCommunicator> w =
      parallel::mpi_world(parallel::CommOptions{.timeout_s = 60});
  return *w;
}

enum class Router { kRandom, kNoExpert3, kNoRank1 };

struct Case {
  int64_t top_k;
  double capacity;
  Router router;
};

std::shared_ptr<models::Mixtral> build(const models::ModelConfig& c, Router router) {
  auto m = std::dynamic_pointer_cast<models::Mixtral>(models::build_model(c, 7));
  REQUIRE(m);
  if (router != Router::kRandom) {
    const int64_t E = c.moe_experts, C = c.d_model;
    std::vector<double> w(static_cast<size_t>(E * C), 0.0);
    w[0 * C + 0] = 1.0;                                    // expert 0: x0
    w[1 * C + 0] = -1.0;                                   // expert 1: -x0
    if (router == Router::kNoExpert3) w[2 * C + 1] = 1.0;  // expert 2: x1
    engine::NoGradGuard ng;
    for (size_t l = 0; l < m->model->layers->size(); ++l) {
      engine::copy_((*m->model->layers)[l].block_sparse_moe->gate->weight,
                    Tensor::from_vector(w, {E, C}, c.dtype));
    }
  }
  m->train();
  return m;
}

Tensor micro_batch(int q, const models::ModelConfig& c) {
  const int64_t B = 2, T = 8;
  std::vector<int64_t> ids(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) ids[i] = (q * 131 + i * 17 + 5) % c.vocab_size;
  return Tensor::from_ints(ids, {B, T});
}

// "model.layers.0.block_sparse_moe.experts.3.w1.weight" -> 3; -1 for a non-expert parameter.
int64_t expert_of(const std::string& name) {
  const std::string key = ".experts.";
  const size_t at = name.find(key);
  if (at == std::string::npos) return -1;
  return std::stoll(name.substr(at + key.size()));
}

double max_rel_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  REQUIRE(x.size() == y.size());
  double scale = 1e-12, diff = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    scale = std::max(scale, std::fabs(y[i]));
    diff = std::max(diff, std::fabs(x[i] - y[i]));
  }
  return diff / scale;
}

void run_case(int ep, const Case& cs) {
  parallel::MpiCommunicator& w = world();
  const int W = w.size(), r = w.rank();
  REQUIRE(W % ep == 0);
  auto ep_group = w.split(r / ep, r, "ep");
  auto edp_group = w.split(r % ep, r, "edp");
  models::ModelConfig c = models::resolve_config("mixtral-tiny");
  c.dtype = DType::kF32;
  c.moe_top_k = cs.top_k;
  c.moe_capacity_factor = cs.capacity;
  c.moe_aux_loss = true;
  c.moe_aux_loss_coef = 0.02;
  c.moe_z_loss_coef = 0.001;
  const int64_t E = c.moe_experts;

  // One process: W micro-batches, the mean of their losses.
  auto ref = build(c, cs.router);
  Tensor ref_loss;
  std::vector<int64_t> tokens(static_cast<size_t>(E), 0);
  int64_t dropped = 0;
  for (int q = 0; q < W; ++q) {
    const Tensor l = ref->loss(micro_batch(q, c)) / static_cast<double>(W);
    ref_loss = ref_loss.defined() ? ref_loss + l : l;
    for (const models::ExpertLoad& load : ref->expert_load()) {
      for (int64_t e = 0; e < E; ++e) tokens[e] += load.tokens[e];
      dropped += load.dropped;
    }
  }
  ref_loss.backward();
  if (cs.router == Router::kNoExpert3) {
    CHECK(tokens[3] == 0);
    CHECK(tokens[2] > 0);
  }
  if (cs.router == Router::kNoRank1) CHECK(tokens[2] + tokens[3] == 0);
  if (cs.capacity > 0) CHECK(dropped > 0);

  // Expert parallel: micro-batch `r` here, its experts spread over the ep group.
  auto par = build(c, cs.router);
  par->set_expert_parallel(ep_group.get());
  const Tensor loss = par->loss(micro_batch(r, c)) / static_cast<double>(W);
  loss.backward();
  Tensor total = loss.detach().clone();
  w.all_reduce(total);
  const double rel_loss = max_rel_diff(total, ref_loss.detach());
  INFO("ep " << ep << " world " << W << " rank " << r << " loss " << total.to_vector()[0]
             << " reference " << ref_loss.to_vector()[0]);
  CHECK(rel_loss <= 1e-6);

  const int64_t L = E / ep, first = (r % ep) * L;
  std::map<std::string, Tensor> ref_grads;
  for (const auto& [name, p] : ref->named_parameters()) ref_grads[name] = p.grad();
  int compared = 0;
  double worst = 0;
  for (const auto& [name, p] : par->named_parameters()) {
    const int64_t e = expert_of(name);
    if (e >= 0 && (e < first || e >= first + L)) {
      CHECK_FALSE(p.grad().defined());  // not this rank's expert: never touched
      continue;
    }
    Tensor g = p.grad().defined() ? p.grad().clone() : Tensor::zeros(p.shape(), p.dtype());
    (e >= 0 ? *edp_group : static_cast<parallel::Communicator&>(w)).all_reduce(g);
    const Tensor want =
        ref_grads[name].defined() ? ref_grads[name] : Tensor::zeros(p.shape(), p.dtype());
    const double d = max_rel_diff(g, want);
    worst = std::max(worst, d);
    INFO(name);
    CHECK(d <= 1e-5);
    ++compared;
  }
  // Every non-expert parameter and this rank's experts (3 weights each, per layer).
  CHECK(compared == static_cast<int>(par->named_parameters().size()) -
                        static_cast<int>((E - L) * 3 * c.n_layer));
  if (r == 0)
    WARN("ep " << ep << " x dp " << W / ep << ": loss rel diff " << rel_loss
               << ", worst gradient rel diff " << worst);
}

const Case kCases[] = {
    {2, 0.0, Router::kRandom},
    {2, 0.5, Router::kRandom},  // capacity ceil(0.5 * 16 * 2 / 4) = 4 rows per expert: drops
    {1, 0.0, Router::kNoExpert3},
    {1, 0.0, Router::kNoRank1},
};

TEST_CASE("ep 2: loss and gradients equal one process") {
  for (const Case& cs : kCases) run_case(2, cs);
}

TEST_CASE("an expert group that does not divide the experts is refused by name") {
  REQUIRE(world().size() == 3);  // run on 3 ranks: 4 experts do not split over them
  models::ModelConfig c = models::resolve_config("mixtral-tiny");
  auto m = build(c, Router::kRandom);
  try {
    m->set_expert_parallel(&world());
    FAIL("3 ranks accepted for 4 experts");
  } catch (const Error& e) {
    CHECK_THAT(e.message(), Catch::Contains("--ep 3 must divide the 4 experts"));
  }
}

}  // namespace
}  // namespace mammoth
