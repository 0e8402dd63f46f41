// Data-parallel reductions overlap the backward inside the training loop (engine::train::train),
// with dp alone and with dp x tp / dp x sp, proved by event order: DataParallel's trace shows a
// bucket's collective posted before the last gradient of the step is final. Under tp/sp the
// model-parallel gradient sums run per bucket just before its reduction
// (TrainOptions::sync_grad); that path must give bit for bit the losses and parameters of the
// path that sums everything after the backward (after_backward) and reduces afterwards, and
// without dp the loop runs sync_grad over every parameter after the backward.
// Run under mpirun with 4 ranks.
#include <catch2/catch.hpp>
#include <memory>

#include "engine/data/token_shard.h"
#include "engine/train/trainer.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "test/testing/test_dir.h"
#include "test/testing/token_data.h"

using namespace mammoth;
using engine::Tensor;
using Ev = parallel::DpTraceEvent;

namespace {

struct Result {
  std::vector<double> losses;
  std::vector<std::vector<double>> params;
  std::vector<Ev> trace;  // the last step's
};

engine::train::TrainOptions options() {
  engine::train::TrainOptions o;
  o.steps = 4;
  o.micro_batch = 2;
  o.seq_len = 16;
  o.lr = 3e-3;
  o.warmup = 1;
  o.eval_every = 0;
  o.quiet = true;
  o.seed = 7;
  return o;
}

std::shared_ptr<models::LanguageModel> make_model() {
  models::ModelOptions mo;
  mo.vocab_size = 48;
  mo.max_seq = 16;
  mo.seed = 3;
  return models::create_language_model("gpt2-tiny", mo);
}

// How the model-parallel sums are given to the loop: after_backward alone, both (the loop
// runs them per bucket when dp can), or sync_grad alone.
enum class Sums { kAfterBackward, kBoth, kSyncGradOnly };

// Trains on `shape` (dp alone when tp = sp = 1; no DataParallel when dp = 1).
Result train(const parallel::MeshShape& shape, models::SpMode sp_mode, int zero, Sums sums) {
  testing::TestDir dir;
  const auto data = data::TokenDataset::open(testing::write_tiny_tokens(dir));
  parallel::DeviceMesh mesh(parallel::mpi_world(), shape);
  auto model = make_model();
  std::shared_ptr<models::ShardedLanguageModel> sharded;
  models::LanguageModel* trained = model.get();
  engine::train::TrainOptions o = options();
  if (shape.tp * shape.sp > 1) {
    sharded = models::apply_policy(*model, mesh, {.sp_mode = sp_mode});
    trained = sharded.get();
    if (sums != Sums::kSyncGradOnly) o.after_backward = [&] { sharded->sync_grads(); };
    if (sums != Sums::kAfterBackward) {
      o.sync_grad = [&](const std::string& n, const Tensor& t) { sharded->sync_grad(n, t); };
    }
  }
  std::unique_ptr<parallel::DataParallel> dp;
  if (shape.dp > 1) {
    dp = std::make_unique<parallel::DataParallel>(
        trained->named_parameters(), mesh.group(parallel::Axis::kDp),
        parallel::DataParallelOptions{.zero_stage = zero, .bucket_mb = 0.05});
    dp->broadcast_parameters();
    dp->set_tracing(true);
    o.dp = dp.get();
  }
  const engine::train::TrainResult r = engine::train::train(
      *trained, [&](const Tensor& in, const Tensor& tg) { return trained->loss(in, tg); }, data,
      data::TokenDataset(), o, json::Value::object());
  Result out;
  out.losses = r.losses;
  for (const auto& [name, p] : trained->named_parameters()) out.params.push_back(p.to_vector());
  if (dp) out.trace = dp->trace();
  return out;
}

// Event positions of the trace: the first post and the last gradient-ready.
void check_overlap(const std::vector<Ev>& trace) {
  int first_post = -1, last_ready = -1, posts = 0;
  for (int i = 0; i < static_cast<int>(trace.size()); ++i) {
    if (trace[i].kind == Ev::kPost && first_post < 0) first_post = i;
    if (trace[i].kind == Ev::kPost) ++posts;
    if (trace[i].kind == Ev::kGradReady) last_ready = i;
  }
  INFO("first collective posted at event " << first_post << ", last gradient final at event "
                                           << last_ready << " (" << trace.size() << " events)");
  REQUIRE(posts >= 3);
  CHECK(first_post >= 0);
  CHECK(first_post < last_ready);
}

}  // namespace

TEST_CASE("dp alone: reductions start during the loop's backward") {
  for (int zero : {0, 2}) {
    DYNAMIC_SECTION("zero " << zero) {
      const Result r = train({.dp = 4}, models::SpMode::kNone, zero, Sums::kBoth);
      check_overlap(r.trace);
    }
  }
}

TEST_CASE("dp x tp / dp x sp: reductions start during the loop's backward, same results") {
  struct Layout {
    const char* name;
    parallel::MeshShape shape;
    models::SpMode mode;
  };
  const Layout layouts[] = {
      {"dp2 tp2", {.dp = 2, .tp = 2}, models::SpMode::kNone},
      {"dp2 tp2 split_gather", {.dp = 2, .tp = 2}, models::SpMode::kSplitGather},
      {"dp2 sp2 ring", {.dp = 2, .sp = 2}, models::SpMode::kRing},
  };
  for (const Layout& l : layouts) {
    for (int zero : {0, 2}) {
      DYNAMIC_SECTION(l.name << " zero " << zero) {
        const Result overlapped = train(l.shape, l.mode, zero, Sums::kBoth);
        const Result after = train(l.shape, l.mode, zero, Sums::kAfterBackward);
        check_overlap(overlapped.trace);
        // Summed after the backward, dp reduces only once the backward is over: no gradient
        // became final while it was synchronising.
        int ready = 0;
        for (const Ev& e : after.trace) ready += e.kind == Ev::kGradReady;
        CHECK(ready == 0);
        CHECK(overlapped.losses == after.losses);
        CHECK(overlapped.params == after.params);
      }
    }
  }
}

TEST_CASE("without dp, sync_grad alone runs after the backward") {
  // The loop's fallback: no dp runtime to run the sums per bucket, no after_backward given.
  const Result sync_only = train({.tp = 4}, models::SpMode::kSplitGather, 0, Sums::kSyncGradOnly);
  const Result after = train({.tp = 4}, models::SpMode::kSplitGather, 0, Sums::kAfterBackward);
  CHECK(sync_only.losses == after.losses);
  CHECK(sync_only.params == after.params);
}
