// Pipeline parallelism against a single-process run: every rank also trains the reference
// (the same micro-batches accumulated in one process) and each rank's parameters must agree
// with the reference's parameters of the same name after 10 steps, the losses at every step.
// Run under mpirun: the world is the pp group (2 or 4 ranks).
#include "models/pipeline/pipeline.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <map>

#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "memory/allocator.h"
#include "models/gpt2/gpt2.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/pipeline/stage.h"

using namespace mammoth;
using engine::Tensor;
namespace pl = parallel::pipeline;

namespace {

constexpr int64_t kVocab = 40, kLayers = 8, kSteps = 10, kMicro = 4, kMicroBatch = 2;

// pp x tp's tolerance, from an error model rather than one machine's drift. Nothing here is
// bitwise: tp splits the K-sum of the two row-parallel GEMMs of every layer (attention's and
// the MLP's output projections, K = d and 4d) into per-rank partial sums that the all-reduce
// adds, and each kernel family (AVX-512, AVX2, portable: MAMMOTH_ISA) blocks its sums its own
// way. A sum of n f32 terms taken in another order differs by about sqrt(n) * u relative
// (u = 2^-24, the rounding errors a random walk); the longest is n = 4d = 512, so each layer
// adds ~sqrt(512) u and a forward/backward through the L = 8 layers ~L sqrt(4d) u. AdamW
// divides each step by sqrt(v) + eps, so it passes a relative gradient difference on to the
// step about unchanged, and the differences of k steps add: the losses and every parameter
// (|p| <= ~1: the LayerNorm gains) agree within k L sqrt(4d) u = 10 * 8 * 22.6 * 6e-8 =
// 1.1e-4, relative for the losses, absolute for the parameters. Measured: 2.5e-5 (losses) and
// 1.7e-5 (parameters) with the AVX2 kernels, 1.6e-5 and 1.2e-5 portable, while a missing
// reduction or a wrong scale changes a parameter's step by ~lr = 3e-3, 30 times the bound. (The
// pipeline alone reorders one sum, the tied wte's gradient: its cases keep 2e-5, and measure
// ~1e-6 with the AVX2 and the portable kernels.)
constexpr double kRounding = 0x1p-24;
constexpr int64_t kDModel = 128;  // gpt2-tiny's
const double kTpTol = kSteps * kLayers * std::sqrt(4.0 * kDModel) * kRounding;

std::shared_ptr<models::Gpt2> make_model(int64_t seq) {
  models::ModelOptions mo;
  mo.vocab_size = kVocab;
  mo.max_seq = seq;
  models::ModelConfig cfg = models::apply_options(models::resolve_config("gpt2-tiny"), mo);
  cfg.n_layer = kLayers;
  auto m = std::dynamic_pointer_cast<models::Gpt2>(models::build_model(cfg, 5));
  REQUIRE(m != nullptr);
  return m;
}

// Micro-batch `mb` of step `step`: a deterministic pattern the model can learn.
Tensor micro_batch(int64_t step, int64_t mb, int64_t rows, int64_t seq) {
  std::vector<int64_t> ids;
  for (int64_t b = mb * rows; b < (mb + 1) * rows; ++b) {
    for (int64_t t = 0; t < seq; ++t) ids.push_back((step * 3 + b * 7 + t * (b % 3 + 1)) % kVocab);
  }
  return Tensor::from_ints(ids, {rows, seq});
}

std::vector<Tensor> micro_batches(int64_t step, int64_t seq = 8) {
  std::vector<Tensor> out;
  for (int64_t m = 0; m < kMicro; ++m) out.push_back(micro_batch(step, m, kMicroBatch, seq));
  return out;
}

engine::optim::AdamWOptions adamw() {
  engine::optim::AdamWOptions o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  // As in the DP test: a larger eps keeps rounding-level gradient differences (a different
  // summation order of the tied wte gradient) from being amplified into lr-sized steps.
  o.eps = 1e-5;
  return o;
}

struct Run {
  std::vector<double> losses;
  std::map<std::string, std::vector<double>> params;
  int64_t deferred_weight_grads = 0;  // weight GEMMs the runtime moved from B to W
};

Run reference() {
  auto model = make_model(8);
  engine::optim::AdamW opt(model->named_parameters(), adamw());
  Run r;
  for (int64_t s = 0; s < kSteps; ++s) {
    double loss = 0;
    for (const Tensor& ids : micro_batches(s)) {
      Tensor l = engine::mul_scalar(model->loss(ids), 1.0 / kMicro);
      loss += l.item();
      l.backward();
    }
    opt.step(engine::optim::clip_factor(engine::optim::grad_norm(opt.params()), 1.0));
    opt.zero_grad();
    r.losses.push_back(loss);
  }
  for (auto& [n, p] : model->named_parameters()) r.params[n] = p.to_vector();
  return r;
}

Run pipeline(parallel::Communicator& pp, const pl::Schedule& schedule,
             pl::Partition partition = {}) {
  auto model = make_model(8);
  models::ModelPipeline pipe(model, schedule, pp, std::move(partition));
  engine::optim::AdamW opt(pipe.parameters(), adamw());
  Run r;
  for (int64_t s = 0; s < kSteps; ++s) {
    r.losses.push_back(pipe.step(micro_batches(s)));
    opt.step(engine::optim::clip_factor(pipe.grad_norm(), 1.0));
    opt.zero_grad();
  }
  for (auto& [n, p] : pipe.parameters()) r.params[n] = p.to_vector();
  r.deferred_weight_grads = pipe.runtime().stats().deferred_weight_grads;
  return r;
}

}  // namespace

TEST_CASE("pipeline schedules match the single-process run") {
  auto world = parallel::mpi_world();
  const int p = world->size();
  const Run ref = reference();
  // Float rounding only: the tied embedding's two gradient halves are summed in another order.
  const double tol = 2e-5;
  for (pl::ScheduleKind kind : {pl::ScheduleKind::kGPipe, pl::ScheduleKind::k1F1B,
                                pl::ScheduleKind::kInterleaved, pl::ScheduleKind::kZeroBubble}) {
    DYNAMIC_SECTION(pl::schedule_kind_name(kind) << " pp " << p) {
      const int v = kind == pl::ScheduleKind::kInterleaved ? 2 : 1;
      const pl::Schedule schedule =
          pl::make_schedule(kind, {.stages = p, .micro_batches = kMicro, .virtual_stages = v});
      const Run run = pipeline(*world, schedule);
      REQUIRE(run.losses.size() == ref.losses.size());
      for (size_t s = 0; s < ref.losses.size(); ++s) {
        INFO("step " << s);
        CHECK(run.losses[s] == Approx(ref.losses[s]).epsilon(tol));
      }
      // Zero-bubble really splits the backward: B leaves the weight GEMMs to W.
      if (kind == pl::ScheduleKind::kZeroBubble) {
        CHECK(run.deferred_weight_grads > 0);
      } else {
        CHECK(run.deferred_weight_grads == 0);
      }
      INFO("reference losses " << ref.losses.front() << " ... " << ref.losses.back());
      // The loss must actually fall, or agreement would prove little.
      CHECK(ref.losses.back() < 0.9 * ref.losses.front());
      double worst = 0;
      size_t elements = 0;
      for (const auto& [name, values] : run.params) {
        INFO("parameter " << name);
        REQUIRE(ref.params.count(name) == 1);
        const auto& want = ref.params.at(name);
        REQUIRE(values.size() == want.size());
        for (size_t k = 0; k < want.size(); ++k)
          worst = std::max(worst, std::fabs(values[k] - want[k]));
        elements += values.size();
      }
      INFO("largest parameter difference " << worst);
      CHECK(worst < tol);
      // Together the ranks hold every parameter (wte twice: first and last stage).
      Tensor count = Tensor::from_vector({static_cast<double>(elements)}, {1}, DType::kF64);
      world->all_reduce(count, parallel::ReduceOp::kSum);
      size_t total = 0;
      for (const auto& [name, values] : ref.params) total += values.size();
      const size_t wte = ref.params.at("wte.weight").size();
      CHECK(static_cast<size_t>(count.item()) == total + (p > 1 ? wte : 0));
    }
  }
}

TEST_CASE("an uneven partition matches the single-process run too") {
  // One layer on every stage but the last, which takes the rest (and the head).
  auto world = parallel::mpi_world();
  const int p = world->size();
  const Run ref = reference();
  pl::Partition partition;
  for (int s = 0; s < p; ++s) partition.push_back(s);
  partition.push_back(kLayers);
  const pl::Schedule schedule =
      pl::make_schedule(pl::ScheduleKind::k1F1B, {.stages = p, .micro_batches = kMicro});
  const Run run = pipeline(*world, schedule, partition);
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    INFO("step " << s);
    CHECK(run.losses[s] == Approx(ref.losses[s]).epsilon(2e-5));
  }
  double worst = 0;
  for (const auto& [name, values] : run.params) {
    const auto& want = ref.params.at(name);
    for (size_t k = 0; k < want.size(); ++k)
      worst = std::max(worst, std::fabs(values[k] - want[k]));
  }
  INFO("largest parameter difference " << worst);
  CHECK(worst < 2e-5);
  // The last rank holds layers p-1 .. kLayers-1: check it really got them.
  if (world->rank() == p - 1)
    CHECK(run.params.count("h." + std::to_string(kLayers - 1) + ".ln_1.weight"));
  if (world->rank() == 0) CHECK_FALSE(run.params.count("h.1.ln_1.weight"));
}

TEST_CASE("1F1B holds p - r micro-batches of activations, GPipe all of them") {
  auto world = parallel::mpi_world();
  const int p = world->size(), r = world->rank();
  constexpr int kM = 8;
  constexpr int64_t kSeq = 32, kRows = 4;  // activations dominate the step's memory
  std::map<pl::ScheduleKind, int64_t> peak;
  for (pl::ScheduleKind kind : {pl::ScheduleKind::kGPipe, pl::ScheduleKind::k1F1B}) {
    auto model = make_model(kSeq);
    const pl::Schedule schedule = pl::make_schedule(kind, {.stages = p, .micro_batches = kM});
    models::ModelPipeline pipe(model, schedule, *world);
    std::vector<Tensor> batches;
    for (int m = 0; m < kM; ++m) batches.push_back(micro_batch(0, m, kRows, kSeq));
    // A first step allocates the gradients; the second measures activations on top of them.
    pipe.step(batches);
    world->barrier();
    auto& alloc = memory::cpu_allocator();
    const int64_t base = alloc.stats().allocated_bytes;
    alloc.reset_peak();
    pipe.runtime().reset_stats();
    pipe.step(batches);
    peak[kind] = alloc.stats().peak_bytes - base;
    const int expect = kind == pl::ScheduleKind::kGPipe ? kM : std::min(p - r, kM);
    CHECK(pipe.runtime().stats().peak_stored == expect);
    world->barrier();
  }
  INFO("rank " << r << " peak bytes above the gradients: gpipe " << peak[pl::ScheduleKind::kGPipe]
               << ", 1f1b " << peak[pl::ScheduleKind::k1F1B]);
  // 1F1B keeps at most p of the m = 8 micro-batches: well under GPipe's footprint.
  CHECK(static_cast<double>(peak[pl::ScheduleKind::k1F1B]) <
        (static_cast<double>(p - r) + 1.0) / kM *
            static_cast<double>(peak[pl::ScheduleKind::kGPipe]));
}

// Hidden from the default run: needs 4 ranks (pipeline_dp_np4_test selects it by its tag).
TEST_CASE("pp 2 x dp 2 with ZeRO 0/1/2 matches the single-process run", "[.][hybrid]") {
  auto world = parallel::mpi_world();
  REQUIRE(world->size() == 4);
  const Run ref = reference();
  const double tol = 2e-5;
  for (int stage : {0, 1, 2}) {
    DYNAMIC_SECTION("zero " << stage) {
      parallel::DeviceMesh mesh(parallel::mpi_world(), {.dp = 2, .pp = 2});
      parallel::Communicator& dp_group = mesh.group(parallel::Axis::kDp);
      const int replica = dp_group.rank();
      auto model = make_model(8);
      // Each replica streams its half of the step's micro-batches through its pipeline.
      const pl::Schedule schedule =
          pl::make_schedule(pl::ScheduleKind::k1F1B, {.stages = 2, .micro_batches = kMicro / 2});
      models::ModelPipeline pipe(model, schedule, mesh.group(parallel::Axis::kPp));
      parallel::DataParallel dp(pipe.parameters(), dp_group,
                                {.zero_stage = stage, .bucket_mb = 0.05});
      dp.broadcast_parameters();
      engine::optim::AdamW opt(dp.optimizer_params(), adamw(),
                               [&](const std::string& n, const Tensor&) { return dp.decays(n); });
      Run run;
      for (int64_t s = 0; s < kSteps; ++s) {
        const std::vector<Tensor> all = micro_batches(s);
        const std::vector<Tensor> mine(all.begin() + replica * kMicro / 2,
                                       all.begin() + (replica + 1) * kMicro / 2);
        dp.begin_backward(false);
        const double loss = pipe.step(mine);
        dp.begin_backward(true);
        dp.finish_backward();
        const double norm = pipe.grad_norm(
            dp.grad_sq_sum([&](const std::string& n) { return pipe.counts_in_norm(n); }));
        opt.step(engine::optim::clip_factor(norm, 1.0));
        opt.zero_grad();
        dp.after_step();
        run.losses.push_back(dp.average(loss));
      }
      for (size_t s = 0; s < ref.losses.size(); ++s) {
        INFO("step " << s);
        CHECK(run.losses[s] == Approx(ref.losses[s]).epsilon(tol));
      }
      double worst = 0;
      for (const auto& [name, p] : pipe.parameters()) {
        INFO("parameter " << name);
        const auto& want = ref.params.at(name);
        const std::vector<double> got = p.to_vector();
        REQUIRE(got.size() == want.size());
        for (size_t k = 0; k < want.size(); ++k)
          worst = std::max(worst, std::fabs(got[k] - want[k]));
      }
      INFO("largest parameter difference " << worst);
      CHECK(worst < tol);
    }
  }
}

// Hidden from the default run: needs 4 ranks (pipeline_tp_np4_test selects it by its tag).
TEST_CASE("pp 2 x tp 2 matches the single-process run", "[.][hybrid_tp]") {
  auto world = parallel::mpi_world();
  REQUIRE(world->size() == 4);
  const Run ref = reference();
  for (models::SpMode mode : {models::SpMode::kNone, models::SpMode::kSplitGather}) {
    DYNAMIC_SECTION("sp mode " << models::sp_mode_name(mode)) {
      parallel::DeviceMesh mesh(parallel::mpi_world(), {.pp = 2, .tp = 2});
      auto model = make_model(8);
      auto sharded = models::apply_policy(*model, mesh, {.sp_mode = mode});
      const pl::Schedule schedule =
          pl::make_schedule(pl::ScheduleKind::k1F1B, {.stages = 2, .micro_batches = kMicro});
      models::ModelPipeline pipe(sharded, schedule, mesh.group(parallel::Axis::kPp));
      engine::optim::AdamW opt(pipe.parameters(), adamw());
      Run run;
      for (int64_t s = 0; s < kSteps; ++s) {
        run.losses.push_back(pipe.step(micro_batches(s)));
        sharded->sync_grads();
        // Sharded gradients everywhere, replicated ones once per tp group, the tied wte once.
        engine::nn::NamedTensors counted;
        for (const auto& [name, p] : pipe.parameters()) {
          if (sharded->grad_owner(name) && pipe.counts_in_norm(name)) counted.emplace_back(name, p);
        }
        Tensor sq = Tensor::from_vector({engine::optim::grad_sq_sum(counted)}, {1}, DType::kF64);
        mesh.group(parallel::Axis::kTp).all_reduce(sq, parallel::ReduceOp::kSum);
        opt.step(engine::optim::clip_factor(pipe.grad_norm(sq.item()), 1.0));
        opt.zero_grad();
      }
      // kTpTol (above): the error bound of f32 training with tp's reordered sums.
      for (size_t s = 0; s < ref.losses.size(); ++s) {
        INFO("step " << s);
        CHECK(run.losses[s] == Approx(ref.losses[s]).epsilon(kTpTol));
      }
      // This stage's parameters, gathered over tp, against the reference's.
      double worst = 0;
      for (const auto& [name, p] : pipe.parameters()) {
        const std::vector<double> got = sharded->full_tensor(name, p).to_vector();
        const auto& want = ref.params.at(name);
        REQUIRE(got.size() == want.size());
        for (size_t k = 0; k < want.size(); ++k)
          worst = std::max(worst, std::fabs(got[k] - want[k]));
      }
      INFO("largest parameter difference " << worst << " (tolerance " << kTpTol << ")");
      CHECK(worst < kTpTol);
    }
  }
}
