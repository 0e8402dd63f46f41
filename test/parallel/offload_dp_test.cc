// engine/offload's own data parallelism (parallel/offload_group.h over the MPI world): an fp16
// overflow in one rank's backward makes every rank skip that step, so the replicas stay equal,
// and the AdamW state chunks are split between the ranks exactly (chunk k on rank k % N).
#include <catch2/catch.hpp>
#include <cmath>

#include "engine/data/token_shard.h"
#include "engine/offload/offload.h"
#include "engine/ops.h"
#include "engine/train/trainer.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/offload_group.h"
#include "test/testing/test_dir.h"
#include "test/testing/token_data.h"

using namespace mammoth;
using engine::Tensor;
using engine::offload::Offload;
using engine::offload::OffloadOptions;

namespace {

std::shared_ptr<models::LanguageModel> tiny_model() {
  models::ModelOptions mo;
  mo.vocab_size = 48;
  mo.max_seq = 16;
  mo.seed = 3;
  return models::create_language_model("gpt2-tiny", mo);
}

OffloadOptions chunked(engine::offload::ChunkGroup* group) {
  OffloadOptions o;
  o.mode = engine::offload::Mode::kHost;
  o.chunk_bytes = 16 << 10;
  o.group = group;
  return o;
}

// Every rank's copy of `values` equals rank 0's (a NaN matches a NaN: the skipped step's loss).
bool same_on_every_rank(parallel::Communicator& world, const std::vector<double>& values) {
  Tensor mine = Tensor::from_vector(values, {static_cast<int64_t>(values.size())}, DType::kF64);
  Tensor root = mine.clone();
  world.broadcast(root, 0);
  const std::vector<double> theirs = root.to_vector();
  bool same = true;
  for (size_t i = 0; i < values.size(); ++i) {
    same = same && (theirs[i] == values[i] || (std::isnan(theirs[i]) && std::isnan(values[i])));
  }
  Tensor differs = Tensor::from_vector({same ? 0.0 : 1.0}, {1}, DType::kF64);
  world.all_reduce(differs, parallel::ReduceOp::kMax);
  return differs.item() == 0.0;
}

}  // namespace

TEST_CASE("an fp16 overflow on one rank makes every rank skip the step") {
  auto world = parallel::mpi_world();
  const int n = world->size(), rank = world->rank();
  testing::TestDir dir;
  const auto data = data::TokenDataset::open(testing::write_tiny_tokens(dir));
  for (double poison : {INFINITY, NAN}) {
    DYNAMIC_SECTION((std::isnan(poison) ? "nan" : "inf")) {
      auto model = tiny_model();
      parallel::OffloadGroup group(*world);
      Offload offload(model->named_parameters(), chunked(&group));
      REQUIRE(offload.data_parallel() == &offload);
      engine::train::TrainOptions o;
      o.steps = 4;
      o.micro_batch = 2;
      o.seq_len = 16;
      o.lr = 3e-3;
      o.warmup = 1;
      o.eval_every = 0;
      o.quiet = true;
      o.amp = "fp16";
      o.init_loss_scale = 1024;  // small: no overflow but the injected one
      o.offload = &offload;
      o.dp = offload.data_parallel();
      int64_t calls = 0;
      const auto result = engine::train::train(
          *model,
          [&](const Tensor& in, const Tensor& tg) {
            Tensor l = model->loss(in, tg);
            // Step 1's backward overflows on the last rank only.
            if (calls++ == 1 && rank == n - 1) l = engine::mul_scalar(l, poison);
            return l;
          },
          data, data::TokenDataset(), o, json::Value::object());
      CHECK(result.skipped_steps == 1);
      CHECK(result.loss_scale == 512);  // halved once
      CHECK(same_on_every_rank(*world, result.losses));
      for (const auto& [name, p] : model->named_parameters()) {
        INFO(name);
        const std::vector<double> v = p.contiguous().to_vector();
        CHECK(same_on_every_rank(*world, v));
        for (double x : v) REQUIRE(std::isfinite(x));
      }
    }
  }
}

TEST_CASE("the AdamW state chunks are split between the ranks, chunk k on rank k % N") {
  auto world = parallel::mpi_world();
  const int n = world->size(), rank = world->rank();
  auto model = tiny_model();
  parallel::OffloadGroup group(*world);
  Offload sharded(model->named_parameters(), chunked(&group));
  const int64_t mine = sharded.memory().optimizer;
  Tensor total = Tensor::from_vector({static_cast<double>(mine)}, {1}, DType::kF64);
  world->all_reduce(total, parallel::ReduceOp::kSum);
  // One process's full state, from the same layout.
  auto other = tiny_model();
  const Offload whole(other->named_parameters(), chunked(nullptr));
  REQUIRE(sharded.num_chunks() == whole.num_chunks());
  REQUIRE(sharded.num_chunks() >= 2 * n);
  CHECK(total.item() == static_cast<double>(whole.memory().optimizer));
  CHECK(mine < whole.memory().optimizer);
  for (int k = 0; k < sharded.num_chunks(); ++k) CHECK(sharded.owner(k) == k % n);
  // The state this rank's optimizer exposes is exactly its chunks' parameters.
  auto& opt = sharded.optimizer({});
  const auto chunk_of = sharded.chunk_of_params();
  size_t owned = 0;
  for (int c : chunk_of) owned += c % n == rank;
  CHECK(opt.state().size() == 2 * owned);
}
