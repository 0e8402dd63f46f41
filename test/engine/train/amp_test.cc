// engine/amp: autocast matmul numerics (bf16 and fp16 rounding of the inputs, f32 accumulate),
// the dynamic loss scaler's schedule, and fp16 training that skips exactly the step whose
// gradients hold an inf, leaving parameters and optimizer state untouched by it.
#include "engine/amp/amp.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "engine/data/token_shard.h"
#include "engine/ops.h"
#include "engine/train/trainer.h"
#include "models/registry.h"
#include "test/testing/gradcheck.h"
#include "test/testing/test_dir.h"
#include "test/testing/token_data.h"

using namespace mammoth;
using engine::Tensor;
using engine::amp::AutocastGuard;
using engine::amp::Precision;

namespace {

// x rounded elementwise through a 16-bit float type and back to f32.
Tensor rounded(const Tensor& x, DType via) { return x.to(via).to(DType::kF32); }

double max_abs_diff(const Tensor& a, const Tensor& b) { return engine::max_abs(a - b); }

}  // namespace

TEST_CASE("bf16 autocast multiplies bf16-rounded inputs with f32 accumulation") {
  const Tensor a = Tensor::randn({3, 37, 70}, 1);
  const Tensor w = Tensor::randn({45, 70}, 2);  // used transposed, as linear() does
  const Tensor exact = engine::matmul(a, w.transpose(0, 1));
  const Tensor reference =
      engine::matmul(rounded(a, DType::kBF16), rounded(w, DType::kBF16).transpose(0, 1));
  Tensor cast;
  {
    AutocastGuard guard(Precision::kBF16);
    CHECK(engine::amp::autocast_precision() == Precision::kBF16);
    cast = engine::matmul(a, w.transpose(0, 1));
  }
  CHECK(engine::amp::autocast_precision() == Precision::kF32);
  // Same products of bf16 values, summed in f32 in a possibly different order.
  CHECK(testing::compare(cast, reference, 1e-5, 1e-5) == "");
  // ...and visibly not the f32 product (bf16 keeps 8 bits of mantissa).
  CHECK(max_abs_diff(cast, exact) > 1e-3);
  // Outside the guard the f32 kernel is back, bit for bit.
  CHECK(max_abs_diff(engine::matmul(a, w.transpose(0, 1)), exact) == 0.0);
}

TEST_CASE("bf16 autocast handles broadcast batches and row vectors, and backward") {
  const Tensor a = Tensor::randn({4, 5, 8}, 3);
  const Tensor b = Tensor::randn({8, 6}, 4);  // broadcast over the batch
  const Tensor reference = engine::matmul(rounded(a, DType::kBF16), rounded(b, DType::kBF16));
  Tensor leaf = Tensor::randn({8, 6}, 4).requires_grad_();
  Tensor out;
  {
    AutocastGuard guard(Precision::kBF16);
    out = engine::matmul(a, leaf);
    CHECK(testing::compare(out, reference, 1e-5, 1e-5) == "");
    engine::sum(out).backward();
  }
  // d(sum(a @ b))/db = sum over batch and rows of a, computed from bf16-rounded a and ones.
  const Tensor expected =
      engine::sum(rounded(a, DType::kBF16), {0, 1}).reshape({8, 1}) * Tensor::ones({8, 6});
  CHECK(testing::compare(leaf.grad(), expected, 1e-5, 1e-5) == "");
}

TEST_CASE("fp16 autocast rounds inputs to fp16, overflowing to inf beyond 65504") {
  const Tensor a = Tensor::randn({16, 24}, 5);
  const Tensor b = Tensor::randn({24, 8}, 6);
  const Tensor reference = engine::matmul(rounded(a, DType::kF16), rounded(b, DType::kF16));
  Tensor cast, big;
  {
    AutocastGuard guard(Precision::kF16);
    cast = engine::matmul(a, b);
    big = engine::matmul(a * 1e5, b);
  }
  CHECK(max_abs_diff(cast, reference) <= 1e-5);
  CHECK(max_abs_diff(cast, engine::matmul(a, b)) > 1e-5);
  CHECK_FALSE(engine::all_finite(big));
}

TEST_CASE("the dynamic loss scaler halves on overflow and grows after a clean window") {
  engine::amp::LossScalerOptions o;
  o.growth_interval = 3;
  engine::amp::DynamicLossScaler s(o);
  CHECK(s.scale() == 65536.0);
  CHECK(s.update(true));
  CHECK(s.update(true));
  CHECK_FALSE(s.update(false));  // skipped: scale halves, the clean count restarts
  CHECK(s.scale() == 32768.0);
  CHECK(s.skipped_steps() == 1);
  CHECK(s.update(true));
  CHECK(s.update(true));
  CHECK(s.scale() == 32768.0);
  CHECK(s.update(true));  // third clean step in a row
  CHECK(s.scale() == 65536.0);
  engine::amp::DynamicLossScaler restored;
  restored.load_state(s.state());
  CHECK(restored.scale() == s.scale());
  CHECK(restored.skipped_steps() == 1);
  CHECK_THROWS_WITH(engine::amp::parse_precision("fp8"), Catch::Contains("--amp"));
}

namespace {

struct AmpRun {
  engine::train::TrainResult result;
  std::string save_dir;
};

AmpRun train_tiny(const testing::TestDir& dir, const std::string& name, const std::string& amp,
                  int64_t inject_at) {
  const std::string data_path = testing::write_tiny_tokens(dir, name + ".bin");
  models::ModelOptions mo;
  mo.vocab_size = 48;
  mo.max_seq = 16;
  mo.seed = 3;
  auto model = models::create_language_model("gpt2-tiny", mo);
  engine::train::TrainOptions o;
  o.steps = 6;
  o.micro_batch = 4;
  o.seq_len = 16;
  o.lr = 3e-3;
  o.warmup = 2;
  o.eval_every = 0;
  o.quiet = true;
  o.amp = amp;
  o.inject_inf_grad_step = inject_at;
  o.save_dir = dir.file(name);
  o.save_every = 1;
  o.keep_last = 100;
  o.metrics_path = dir.file(name + ".jsonl");
  json::Value config = json::Value::object();
  config.set("model", "gpt2-tiny");
  const auto data = data::TokenDataset::open(data_path);
  auto r = engine::train::train(
      *model, [&](const Tensor& in, const Tensor& tg) { return model->loss(in, tg); }, data,
      data::TokenDataset(), o, config);
  return {r, o.save_dir};
}

std::string file_bytes(const std::string& path) { return testing::read_bytes(path); }

}  // namespace

TEST_CASE("fp16 with an injected inf skips exactly that step and leaves the weights alone") {
  testing::TestDir dir;
  // 0-based step 2 is the third step; its checkpoint is step_00000003.
  const AmpRun run = train_tiny(dir, "inf", "fp16", 2);
  CHECK(run.result.skipped_steps == 1);
  CHECK(run.result.loss_scale == 32768.0);
  auto ckpt = [&](int step, const char* file) {
    char name[64];
    std::snprintf(name, sizeof(name), "/step_%08d/%s", step, file);
    return file_bytes(run.save_dir + name);
  };
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    INFO(f);
    CHECK(ckpt(2, f) == ckpt(3, f));  // the skipped step changed nothing
    CHECK(ckpt(1, f) != ckpt(2, f));  // the steps around it did change the weights
    CHECK(ckpt(3, f) != ckpt(4, f));
  }
  // The metrics log the skip at that step: null grad norm, halved scale from the next step.
  std::ifstream metrics(dir.file("inf.jsonl"));
  std::string line;
  std::vector<json::Value> lines;
  while (std::getline(metrics, line)) lines.push_back(json::parse(line));
  REQUIRE(lines.size() == 6);
  for (int i = 0; i < 6; ++i) {
    INFO("metrics line " << i);
    CHECK(lines[i].at("skipped_steps").as_int() == (i >= 2 ? 1 : 0));
    CHECK(lines[i].contains("skipped") == (i == 2));
    CHECK(lines[i].at("grad_norm").is_null() == (i == 2));
    CHECK(lines[i].at("loss_scale").as_double() == (i <= 2 ? 65536.0 : 32768.0));
  }
  // The clean run without the injection skips nothing and ends with other weights.
  const AmpRun clean = train_tiny(dir, "clean", "fp16", -1);
  CHECK(clean.result.skipped_steps == 0);
  CHECK(clean.result.loss_scale == 65536.0);
  CHECK(clean.result.losses.back() < clean.result.losses.front());
  // fp16 rounding of the matmul inputs is visible in the losses, but small.
  const AmpRun f32 = train_tiny(dir, "f32", "fp32", -1);
  CHECK(clean.result.losses != f32.result.losses);
  for (size_t i = 0; i < f32.result.losses.size(); ++i)
    CHECK(clean.result.losses[i] == Approx(f32.result.losses[i]).epsilon(1e-2));
  // fp32 training does not tolerate an inf: it is an error naming the step.
  CHECK_THROWS_WITH(train_tiny(dir, "f32inf", "fp32", 1), Catch::Contains("not finite"));
}

TEST_CASE("bf16 autocast trains, close to but not identical with fp32") {
  testing::TestDir dir;
  const AmpRun bf = train_tiny(dir, "bf16", "bf16", -1);
  const AmpRun f32 = train_tiny(dir, "f32", "fp32", -1);
  CHECK(bf.result.losses.back() < bf.result.losses.front());
  CHECK(bf.result.losses != f32.result.losses);
  for (size_t i = 0; i < f32.result.losses.size(); ++i)
    CHECK(bf.result.losses[i] == Approx(f32.result.losses[i]).epsilon(3e-2));
  CHECK(bf.result.skipped_steps == 0);
}
