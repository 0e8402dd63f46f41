// Data parallelism and ZeRO 1/2/3 against a single-process run: every rank also trains the
// reference (the whole global batch, no communication) and the two must agree step by step
// in loss and, at the end, in every parameter; the allocator's measured peak per stage; the
// event trace that shows the reductions overlapping the backward. Run under mpirun with 2 and
// 4 ranks.
#include "parallel/data_parallel.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <map>

#include "engine/amp/amp.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "memory/allocator.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"

using namespace mammoth;
using engine::Tensor;

namespace {

constexpr int64_t kSeq = 8, kVocab = 40, kGlobalBatch = 8, kSteps = 10;

std::shared_ptr<models::LanguageModel> make_model() {
  models::ModelOptions mo;
  mo.vocab_size = kVocab;
  mo.max_seq = kSeq;
  mo.seed = 5;
  return models::create_language_model("gpt2-tiny", mo);
}

// Sequence i of step s: a deterministic pattern the model can learn.
Tensor batch(int64_t step, int64_t first, int64_t count) {
  std::vector<int64_t> ids;
  for (int64_t b = first; b < first + count; ++b) {
    for (int64_t t = 0; t < kSeq; ++t) ids.push_back((step * 3 + b * 7 + t * (b % 3 + 1)) % kVocab);
  }
  return Tensor::from_ints(ids, {count, kSeq});
}

engine::optim::AdamWOptions adamw(double lr = 1e-2) {
  engine::optim::AdamWOptions o;
  o.lr = lr;
  o.weight_decay = 0.1;
  // Adam divides by sqrt(v) + eps: with the default 1e-8, a gradient that is zero up to
  // rounding (1e-9) still moves its parameter by ~lr, so float-level differences in the
  // reduction order would be amplified to lr-sized parameter differences. A larger eps keeps
  // the comparison about the algorithm rather than about rounding noise.
  o.eps = 1e-5;
  return o;
}

// Under bf16 autocast the runs are compared at a 10x smaller learning rate: see the bf16 test.
double bf16_lr(engine::amp::Precision p) {
  return p == engine::amp::Precision::kBF16 ? 1e-3 : 1e-2;
}

struct Run {
  std::vector<double> losses;
  std::vector<std::vector<double>> params;
  std::vector<std::vector<double>> state;  // optimizer state in the single-process layout
};

// Single process: the whole global batch, `accum` micro-batches (matmuls in `precision`).
Run reference(int accum, engine::amp::Precision precision = engine::amp::Precision::kF32) {
  engine::amp::AutocastGuard autocast(precision);
  auto model = make_model();
  engine::optim::AdamW opt(model->named_parameters(), adamw(bf16_lr(precision)));
  Run r;
  const int64_t micro = kGlobalBatch / accum;
  for (int64_t s = 0; s < kSteps; ++s) {
    double loss = 0;
    for (int m = 0; m < accum; ++m) {
      Tensor ids = batch(s, m * micro, micro);
      Tensor l = engine::mul_scalar(model->loss(ids), 1.0 / accum);
      loss += l.item();
      l.backward();
    }
    const double clip = engine::optim::clip_factor(engine::optim::grad_norm(opt.params()), 1.0);
    opt.step(clip);
    opt.zero_grad();
    r.losses.push_back(loss);
  }
  for (auto& [n, p] : model->named_parameters()) r.params.push_back(p.to_vector());
  for (auto& [n, t] : opt.state()) r.state.push_back(t.to_vector());
  return r;
}

// Parameters and optimizer state in the single-process layout, from every rank's checkpoint
// pieces: each element is written by exactly one rank, so summing zero-filled tensors that
// hold each rank's pieces is exact.
std::map<std::string, Tensor> assemble(parallel::DataParallel& dp,
                                       const engine::nn::NamedTensors& state,
                                       const engine::nn::NamedTensors& params,
                                       const std::vector<std::string>& suffixes,
                                       parallel::Communicator& world) {
  std::map<std::string, Tensor> full;
  for (const auto& [n, p] : params) {
    full[n] = Tensor::zeros(p.shape(), p.dtype());
    for (const std::string& s : suffixes) full[n + "." + s] = Tensor::zeros(p.shape(), p.dtype());
  }
  for (const auto& piece : dp.checkpoint_pieces(state, suffixes, /*writing=*/true)) {
    const int64_t k = piece.data.numel();
    engine::copy_(full.at(piece.name).reshape({-1}).slice(0, piece.offset, piece.offset + k),
                  piece.data.reshape({-1}));
  }
  for (auto& [n, t] : full) world.all_reduce(t, parallel::ReduceOp::kSum);
  return full;
}

// Data parallel: rank r takes its contiguous share of each global batch, in `accum` micro-batches.
Run data_parallel(parallel::Communicator& world, int stage, int accum, double bucket_mb,
                  engine::amp::Precision precision = engine::amp::Precision::kF32) {
  engine::amp::AutocastGuard autocast(precision);
  auto model = make_model();
  parallel::DataParallel dp(model->named_parameters(), world,
                            {.zero_stage = stage, .bucket_mb = bucket_mb});
  dp.broadcast_parameters();
  engine::optim::AdamW opt(dp.optimizer_params(), adamw(bf16_lr(precision)),
                           [&](const std::string& name, const Tensor&) { return dp.decays(name); });
  Run r;
  const int64_t share = kGlobalBatch / world.size(), micro = share / accum;
  for (int64_t s = 0; s < kSteps; ++s) {
    double loss = 0;
    for (int m = 0; m < accum; ++m) {
      dp.begin_backward(m == accum - 1);
      Tensor ids = batch(s, world.rank() * share + m * micro, micro);
      Tensor l = engine::mul_scalar(model->loss(ids), 1.0 / accum);
      loss += l.item();
      l.backward();
    }
    dp.finish_backward();
    opt.step(engine::optim::clip_factor(dp.grad_norm(), 1.0));
    opt.zero_grad();
    dp.after_step();
    Tensor lt = Tensor::from_vector({loss}, {1}, DType::kF64);
    world.all_reduce(lt, parallel::ReduceOp::kAvg);
    r.losses.push_back(lt.item());
  }
  for (auto& [n, p] : model->named_parameters()) r.params.push_back(p.to_vector());
  // The single-process optimizer state from every rank's checkpoint pieces (what a sharded
  // checkpoint holds), in the reference's order: exp_avg and exp_avg_sq per parameter.
  const std::vector<std::string> suffixes = {"exp_avg", "exp_avg_sq"};
  const auto full = assemble(dp, opt.state(), model->named_parameters(), suffixes, world);
  for (auto& [n, p] : model->named_parameters()) {
    for (const std::string& suffix : suffixes)
      r.state.push_back(full.at(n + "." + suffix).to_vector());
  }
  // Loading the full state back into this rank's pieces must reproduce its own state exactly.
  const auto own = opt.state();
  std::vector<std::vector<double>> before;
  for (auto& [n, t] : own) before.push_back(t.to_vector());
  for (auto& [n, t] : own) engine::fill_(t, 0.0);
  for (const auto& piece : dp.checkpoint_pieces(own, suffixes, /*writing=*/false)) {
    const int64_t k = piece.data.numel();
    engine::copy_(piece.data.reshape({-1}),
                  full.at(piece.name).reshape({-1}).slice(0, piece.offset, piece.offset + k));
  }
  dp.pieces_loaded();
  for (size_t i = 0; i < own.size(); ++i) CHECK(own[i].second.to_vector() == before[i]);
  return r;
}

void check_same(const Run& dp, const Run& ref, double tol) {
  REQUIRE(dp.losses.size() == ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    INFO("step " << s);
    CHECK(dp.losses[s] == Approx(ref.losses[s]).epsilon(tol));
  }
  REQUIRE(dp.params.size() == ref.params.size());
  double worst = 0;
  for (size_t i = 0; i < ref.params.size(); ++i) {
    for (size_t k = 0; k < ref.params[i].size(); ++k) {
      worst = std::max(worst, std::fabs(dp.params[i][k] - ref.params[i][k]));
    }
  }
  INFO("largest parameter difference " << worst);
  CHECK(worst < tol);
  REQUIRE(dp.state.size() == ref.state.size());
  double worst_state = 0;
  for (size_t i = 0; i < ref.state.size(); ++i) {
    for (size_t k = 0; k < ref.state[i].size(); ++k) {
      worst_state = std::max(worst_state, std::fabs(dp.state[i][k] - ref.state[i][k]));
    }
  }
  INFO("largest optimizer-state difference " << worst_state);
  CHECK(worst_state < tol);
}

}  // namespace

TEST_CASE("DP and ZeRO 1/2/3 match the single-process run") {
  auto world = parallel::mpi_world();
  const int n = world->size();
  REQUIRE(kGlobalBatch % (2 * n) == 0);
  const Run ref1 = reference(1);
  const Run ref2 = reference(2);
  // Reductions sum in a different order than one process does (the weight-gradient GEMMs sum
  // over each rank's rows, then the all-reduce over ranks), and the fused f32 kernels
  // accumulate in f32: 10 AdamW steps (lr 1e-2) turn that rounding into parameter differences
  // of ~2e-5 at 4 ranks. 1e-4 is 1% of one step's update.
  const double tol = 1e-4;
  for (int stage : {0, 1, 2, 3}) {
    for (int accum : {1, 2}) {
      // A small bucket size forces many buckets (and shards that cut through parameters).
      for (double bucket_mb : {0.05, 25.0}) {
        DYNAMIC_SECTION("zero " << stage << " accum " << accum << " bucket " << bucket_mb) {
          check_same(data_parallel(*world, stage, accum, bucket_mb), accum == 1 ? ref1 : ref2, tol);
        }
      }
    }
  }
}

TEST_CASE("DP and ZeRO 1/2/3 under bf16 autocast match the single-process bf16 run") {
  // Autocast rounds each matmul input to bf16, so a rounding-level difference in a weight (the
  // reductions run in another order) can flip one input's bf16 rounding (2^-8 relative), and
  // Adam turns such flips into lr-sized steps: at lr 1e-2 the runs drift apart by 1e-2 within
  // 10 steps, at lr 1e-3 (used here) by ~1e-4 (measured at 4 ranks: losses 6e-5 relative,
  // parameters 9e-5, optimizer states 4e-5). The tolerance is 1e-3, far below bf16's 7.8e-3.
  auto world = parallel::mpi_world();
  REQUIRE(kGlobalBatch % (2 * world->size()) == 0);
  const Run ref = reference(2, engine::amp::Precision::kBF16);
  const Run f32 = reference(2);
  REQUIRE(ref.losses.back() != f32.losses.back());  // autocast really changed the numerics
  for (int stage : {0, 1, 2, 3}) {
    DYNAMIC_SECTION("bf16 zero " << stage << " accum 2") {
      check_same(data_parallel(*world, stage, 2, 0.05, engine::amp::Precision::kBF16), ref, 1e-3);
    }
  }
}

TEST_CASE("an overflow on one rank makes every rank skip the step") {
  // The averaged gradient's norm is the found-inf flag: an inf or NaN in any rank's gradient
  // reaches the global norm on every rank (through the all-reduce or reduce-scatter of the
  // gradients and the all-reduce of the squared sums), so every rank skips together and the
  // replicas never diverge. Here the last rank's loss overflows at step 1.
  auto world = parallel::mpi_world();
  const int n = world->size(), rank = world->rank();
  for (int stage : {0, 1, 2, 3}) {
    for (double poison : {INFINITY, NAN}) {
      DYNAMIC_SECTION("zero " << stage << (std::isnan(poison) ? " nan" : " inf")) {
        auto model = make_model();
        parallel::DataParallel dp(model->named_parameters(), *world,
                                  {.zero_stage = stage, .bucket_mb = 0.05});
        dp.broadcast_parameters();
        engine::optim::AdamW opt(dp.optimizer_params(), adamw());
        const int64_t share = kGlobalBatch / n;
        std::vector<int> skipped;
        for (int64_t s = 0; s < 3; ++s) {
          dp.begin_backward(true);
          Tensor l = model->loss(batch(s, rank * share, share));
          if (s == 1 && rank == n - 1) l = engine::mul_scalar(l, poison);
          l.backward();
          dp.finish_backward();
          const double norm = dp.grad_norm();
          if (std::isfinite(norm)) {
            opt.step(engine::optim::clip_factor(norm, 1.0));
            dp.after_step();
          } else {
            skipped.push_back(static_cast<int>(s));
          }
          opt.zero_grad();
        }
        CHECK(skipped == std::vector<int>{1});
        // Every rank holds rank 0's parameters bit for bit (ZeRO-3 gathers them on read), and
        // they are finite.
        for (auto& [name, p] : model->named_parameters()) {
          Tensor mine = p.contiguous().clone();
          Tensor root = mine.clone();
          world->broadcast(root, 0);
          INFO(name);
          CHECK(mine.to_vector() == root.to_vector());
          for (double v : mine.to_vector()) REQUIRE(std::isfinite(v));
        }
      }
    }
  }
}

TEST_CASE("ZeRO-3 per-rank memory is within 10% of 1/N of one process") {
  // Whole buckets are gathered, so the target needs a model whose largest parameter is small
  // next to the model: gpt2-tiny's shapes with 24 layers (~19 MB of parameters).
  auto world = parallel::mpi_world();
  const int n = world->size();
  models::ModelConfig cfg = models::resolve_config("gpt2-tiny");
  cfg.vocab_size = kVocab;
  cfg.n_layer = 24;
  auto model = models::build_model(cfg, 5);
  const double full = 4.0 * static_cast<double>(model->num_parameters());
  parallel::DataParallel dp(model->named_parameters(), *world,
                            {.zero_stage = 3, .bucket_mb = 0.05});
  const auto mem = dp.memory();
  // Parameters + gradients + AdamW's two states: 4 copies of 4 bytes per parameter.
  const double ideal = 4.0 * full / n;
  const double ours = static_cast<double>(mem.params + mem.grads + mem.optimizer);
  INFO("per-rank bytes " << ours << ", ideal " << ideal << " (" << ours / ideal << "x)");
  CHECK(ours <= 1.1 * ideal);
}

TEST_CASE("ZeRO shards optimizer states and gradients") {
  auto world = parallel::mpi_world();
  const int n = world->size();
  auto model = make_model();
  const int64_t full = model->num_parameters() * 4;
  for (int stage : {0, 1, 2, 3}) {
    auto m = make_model();
    parallel::DataParallel dp(m->named_parameters(), *world,
                              {.zero_stage = stage, .bucket_mb = 0.05});
    const auto mem = dp.memory();
    INFO("stage " << stage);
    if (stage < 3) {
      CHECK(mem.params >= full);
      CHECK(mem.params <= full + dp.num_buckets() * n * 4);  // padding only
    } else {
      // Shards plus at most resident_buckets gathered buckets.
      REQUIRE(dp.num_buckets() > 2 * parallel::DataParallelOptions{}.resident_buckets);
      CHECK(mem.params < full);
    }
    if (stage == 0) CHECK(mem.optimizer == 2 * mem.params);
    const int64_t padded_full = mem.grads * (stage >= 2 ? n : 1);
    if (stage >= 1) CHECK(mem.optimizer * n == 2 * padded_full);
    if (stage >= 2) CHECK(mem.grads * n == padded_full);
    int64_t opt_elems = 0;
    for (auto& [name, t] : dp.optimizer_params()) opt_elems += t.numel();
    if (stage >= 1) CHECK(opt_elems <= padded_full / 4 / n);
  }
}

namespace {

// The allocator's peak over steady-state steps of training `cfg` under `stage` (the first step
// allocates the optimizer states; steps 2 and 3 are measured from their start to their end:
// forward, backward with the reductions, the norm, the optimizer step and the gathers after it).
struct Measured {
  int64_t peak = 0;
  int64_t param_bytes = 0;     // the model's parameters (fp32, bucket padding included)
  int64_t largest_bucket = 0;  // bytes
  int num_buckets = 0;
};

Measured measure_peak(parallel::Communicator& world, const models::ModelConfig& cfg, int stage,
                      double bucket_mb) {
  auto model = std::dynamic_pointer_cast<models::LanguageModel>(models::build_model(cfg, 5));
  REQUIRE(model != nullptr);
  Measured m;
  {
    parallel::DataParallel dp(model->named_parameters(), world,
                              {.zero_stage = stage, .bucket_mb = bucket_mb});
    dp.broadcast_parameters();
    engine::optim::AdamW opt(dp.optimizer_params(), adamw(),
                             [&](const std::string& n, const Tensor&) { return dp.decays(n); });
    const int64_t rows = 2, seq = 32;
    for (int64_t s = 0; s < 3; ++s) {
      memory::Allocator& a = memory::allocator_for(Device::cpu());
      a.reset_peak();
      dp.begin_backward(true);
      std::vector<int64_t> ids;
      for (int64_t i = 0; i < rows * seq; ++i)
        ids.push_back((s * 5 + world.rank() * 11 + i * 7) % cfg.vocab_size);
      model->loss(Tensor::from_ints(ids, {rows, seq})).backward();
      dp.finish_backward();
      opt.step(engine::optim::clip_factor(dp.grad_norm(), 1.0));
      opt.zero_grad();
      dp.after_step();
      if (s > 0) m.peak = std::max(m.peak, a.stats().peak_bytes);
    }
    const auto mem = dp.memory();
    m.param_bytes = mem.grads * (stage >= 2 ? world.size() : 1);
    m.num_buckets = dp.num_buckets();
    m.largest_bucket = dp.largest_bucket_bytes();
  }
  // The peak on the rank that reached the most.
  Tensor t = Tensor::from_vector({static_cast<double>(m.peak)}, {1}, DType::kF64);
  world.all_reduce(t, parallel::ReduceOp::kMax);
  m.peak = static_cast<int64_t>(t.item());
  return m;
}

}  // namespace

// Hidden from the default run (BUILD.bazel runs it as its own test, data_parallel_memory_np4).
TEST_CASE("ZeRO peak memory falls stage by stage by what sharding saves", "[.][memory]") {
  // Measured with the allocator, not the formula of memory(). What sharding over N ranks should
  // save, stage over stage (P: the parameters' bytes, B: the largest bucket's):
  //   ZeRO-1: (N-1)/N of AdamW's two states, 2P (N-1)/N;
  //   ZeRO-2: (N-1)/N of the gradients, less the two full-size buckets in flight: P (N-1)/N - 2B;
  //   ZeRO-3: (N-1)/N of the parameters, less the two gathered buckets: P (N-1)/N - 2B.
  // Each stage must save at least 80% of that. gpt2-tiny's shapes with 8 layers (6.3 MB of
  // parameters, buckets of 0.25 MB) so that parameters outweigh the activations of 2 x 32 tokens.
  auto world = parallel::mpi_world();
  const int n = world->size();
  models::ModelConfig cfg = models::resolve_config("gpt2-tiny");
  cfg.vocab_size = kVocab;
  cfg.n_layer = 8;
  std::vector<Measured> m;
  for (int stage : {0, 1, 2, 3}) m.push_back(measure_peak(*world, cfg, stage, 0.25));
  const double p = static_cast<double>(m[0].param_bytes), share = (n - 1.0) / n;
  const double b = static_cast<double>(m[3].largest_bucket);
  REQUIRE(m[3].num_buckets >= 8);
  const double should[4] = {0, 2 * p * share, p * share - 2 * b, p * share - 2 * b};
  for (int stage = 0; stage < 4; ++stage) {
    if (world->rank() == 0) {
      std::printf(
          "[zero memory] %d ranks, ZeRO-%d: peak %.2f MB (parameters %.2f MB, %d buckets, "
          "largest %.3f MB)\n",
          n, stage, m[stage].peak / 1e6, p / 1e6, m[stage].num_buckets,
          m[stage].largest_bucket / 1e6);
    }
  }
  for (int stage = 1; stage < 4; ++stage) {
    const double saved = static_cast<double>(m[stage - 1].peak - m[stage].peak);
    INFO("ZeRO-" << stage << " saves " << saved / 1e6 << " MB over ZeRO-" << stage - 1
                 << "; sharding should save " << should[stage] / 1e6 << " MB");
    CHECK(m[stage].peak < m[stage - 1].peak);
    CHECK(saved >= 0.8 * should[stage]);
  }
}

TEST_CASE("a bucket's reduction is posted while backward is still running") {
  // The trace of one synchronised backward: the first collective must be posted before the
  // last gradient of the step is final (overlap), every bucket exactly once and in order, and
  // under ZeRO-2/3 no more than kMaxInFlight full-size buffers in flight at once.
  auto world = parallel::mpi_world();
  const int n = world->size(), rank = world->rank();
  using Ev = parallel::DpTraceEvent;
  for (int stage : {0, 1, 2, 3}) {
    DYNAMIC_SECTION("zero " << stage) {
      auto model = make_model();
      const int num_params = static_cast<int>(model->named_parameters().size());
      parallel::DataParallel dp(model->named_parameters(), *world,
                                {.zero_stage = stage, .bucket_mb = 0.05});
      dp.broadcast_parameters();
      dp.set_tracing(true);
      REQUIRE(dp.num_buckets() >= 3);
      const int64_t share = kGlobalBatch / n;
      dp.begin_backward(true);
      model->loss(batch(0, rank * share, share)).backward();
      dp.finish_backward();
      const std::vector<Ev>& trace = dp.trace();
      int first_post = -1, last_ready = -1, ready = 0, next_post = 0, in_flight = 0, most = 0;
      for (int i = 0; i < static_cast<int>(trace.size()); ++i) {
        switch (trace[i].kind) {
          case Ev::kGradReady:
            last_ready = i;
            ++ready;
            break;
          case Ev::kPost:
            if (first_post < 0) first_post = i;
            CHECK(trace[i].index == next_post++);
            most = std::max(most, ++in_flight);
            break;
          case Ev::kComplete:
            --in_flight;
            break;
        }
      }
      INFO("first post at event " << first_post << ", last gradient ready at " << last_ready);
      CHECK(ready == num_params);
      CHECK(next_post == dp.num_buckets());
      CHECK(first_post >= 0);
      CHECK(first_post < last_ready);
      if (stage >= 2) CHECK(most <= parallel::DataParallel::kMaxInFlight);
    }
  }
}
