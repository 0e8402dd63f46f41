// The training loop end to end on a tiny GPT-2: exact resume, gradient-accumulation
// equivalence, checkpoint integrity (flipped byte, missing manifest, pruning), clear errors.
#include "engine/train/trainer.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "engine/data/token_shard.h"
#include "engine/train/checkpoint.h"
#include "models/registry.h"
#include "test/testing/test_dir.h"
#include "test/testing/token_data.h"

using namespace mammoth;
namespace fs = std::filesystem;
using engine::train::TrainOptions;

namespace {

std::shared_ptr<models::LanguageModel> tiny_model(double dropout) {
  models::ModelOptions mo;
  mo.vocab_size = 48;
  mo.max_seq = 16;
  mo.dropout = dropout;
  mo.seed = 3;
  return models::create_language_model("gpt2-tiny", mo);
}

TrainOptions options() {
  TrainOptions o;
  o.steps = 6;
  o.micro_batch = 4;
  o.seq_len = 16;
  o.lr = 3e-3;
  o.warmup = 2;
  o.eval_every = 0;
  o.quiet = true;
  o.seed = 11;
  return o;
}

// dropout > 0 exercises the dropout RNG state across resume.
engine::train::TrainResult run(const std::string& data_path, const TrainOptions& o,
                               double dropout = 0.1) {
  auto model = tiny_model(dropout);
  const auto data = data::TokenDataset::open(data_path);
  json::Value config = json::Value::object();
  config.set("model", "gpt2-tiny");
  return engine::train::train(
      *model,
      [&](const engine::Tensor& in, const engine::Tensor& tg) { return model->loss(in, tg); }, data,
      data::TokenDataset(), o, config);
}

}  // namespace

TEST_CASE("resuming from a checkpoint continues the exact loss curve") {
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir);
  const auto straight = run(data, options());
  REQUIRE(straight.losses.size() == 6);
  CHECK(straight.losses.back() < straight.losses.front());

  TrainOptions first = options();
  first.save_dir = dir.file("ckpt");
  first.save_every = 3;
  const auto full_with_saves = run(data, first);
  REQUIRE(full_with_saves.losses == straight.losses);  // saving does not perturb training
  // Rewind `latest` to step 3 and resume: steps 4..6 must repeat bitwise.
  {
    std::ofstream latest(first.save_dir + "/latest");
    latest << "step_00000003\n";
  }
  TrainOptions resume = first;
  resume.resume = true;
  const auto resumed = run(data, resume);
  CHECK(resumed.first_step == 3);
  REQUIRE(resumed.losses.size() == 3);
  for (int i = 0; i < 3; ++i) CHECK(resumed.losses[i] == straight.losses[3 + i]);
}

TEST_CASE("k micro-batches of accumulation equal one batch k times larger") {
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir);
  TrainOptions big = options();
  big.micro_batch = 8;
  big.grad_accum = 1;
  TrainOptions acc = options();
  acc.micro_batch = 2;
  acc.grad_accum = 4;
  // Without dropout: a different split draws different masks.
  const auto a = run(data, big, 0.0), b = run(data, acc, 0.0);
  // Same sequences per step; only the summation order differs, so equal to rounding.
  for (size_t i = 0; i < a.losses.size(); ++i)
    CHECK(b.losses[i] == Approx(a.losses[i]).epsilon(1e-4));
}

TEST_CASE("a flipped byte in a checkpoint is detected by its checksum") {
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir);
  TrainOptions o = options();
  o.steps = 2;
  o.save_dir = dir.file("ckpt");
  run(data, o);
  const auto latest = engine::train::latest_checkpoint(o.save_dir);
  REQUIRE(latest.has_value());
  engine::train::verify_checkpoint(*latest);  // intact
  const std::string model_file = *latest + "/model.safetensors";
  {
    std::fstream f(model_file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(model_file) - 5));
    char c;
    f.read(&c, 1);
    f.seekp(static_cast<std::streamoff>(fs::file_size(model_file) - 5));
    c ^= 0x10;
    f.write(&c, 1);
  }
  try {
    engine::train::verify_checkpoint(*latest);
    FAIL("corruption not detected");
  } catch (const Error& e) {
    CHECK(std::string(e.message()).find("model.safetensors is corrupt") != std::string::npos);
  }
  TrainOptions resume = o;
  resume.resume = true;
  resume.steps = 4;
  CHECK_THROWS_AS(run(data, resume), Error);
}

TEST_CASE("only the last K checkpoints are kept, and latest points to the newest") {
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir);
  TrainOptions o = options();
  o.steps = 5;
  o.save_every = 1;
  o.keep_last = 2;
  o.save_dir = dir.file("ckpt");
  run(data, o);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(o.save_dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  // .lock: the job's claim on the directory (SaveDirLock), left behind unlocked.
  CHECK(names == std::vector<std::string>{".lock", "latest", "step_00000004", "step_00000005"});
  CHECK(*engine::train::latest_checkpoint(o.save_dir) == o.save_dir + "/step_00000005");
}

TEST_CASE("resume refuses a checkpoint with a different global batch") {
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir);
  TrainOptions o = options();
  o.steps = 2;
  o.save_dir = dir.file("ckpt");
  run(data, o);
  TrainOptions other = o;
  other.resume = true;
  other.steps = 4;
  other.micro_batch = 2;
  try {
    run(data, other);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(std::string(e.message()).find("global_batch") != std::string::npos);
  }
}

TEST_CASE("bad options are clear errors") {
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir);
  TrainOptions o = options();
  o.micro_batch = 0;
  CHECK_THROWS_WITH(run(data, o), Catch::Contains("--micro-batch"));
  o = options();
  o.resume = true;
  CHECK_THROWS_WITH(run(data, o), Catch::Contains("--save-dir"));
  o = options();
  o.schedule = "exponential";
  CHECK_THROWS_WITH(run(data, o), Catch::Contains("unknown schedule"));
}
