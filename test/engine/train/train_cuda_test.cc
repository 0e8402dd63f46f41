// The training loop on a CUDA device against the CPU (needs a GPU: tagged "gpu"; CI builds it,
// tools/gpu_check.sh runs it on a lent one). gpt2-tiny and llama-tiny, f32, start from the same
// host-initialised weights and read the same batches (engine::train::train with
// TrainOptions::device); the model moves with engine::train::move_to_device, exactly as
// `mammoth train --device cuda` does:
//   - fp32: per-step losses within kF32Tolerance (relative) of the CPU's, the loss falls, and
//     the trained parameters within kParamTolerance (relative L2) of the CPU's. TF32 is off
//     (kernels/cuda/gemm.h: f32 GEMMs run in full fp32 unless set_allow_tf32), asserted here;
//     what remains is summation order (cuBLASLt, reductions, AdamW) and libm vs CUDA math.
//   - dropout 0.1 (gpt2-tiny): the CUDA dropout draws the CPU's Philox masks, so the curves
//     agree as tightly; this also runs models::attend's causal mask made on the device.
//   - checkpoints cross devices: 3 steps on CUDA saved, resumed on the CPU for 3 more, and the
//     reverse; each continuation matches the uninterrupted 6-step run of the device it resumes
//     on within kF32Tolerance (the schedule is constant after warmup so a 3-step run's learning
//     rates are the 6-step run's).
//   - bf16 autocast: within kBf16Tolerance of the CPU's bf16 run (both round the matmul inputs
//     to bf16 and accumulate in fp32; they differ by summation order, which can flip a later
//     bf16 rounding, as in the dp tests). The bound is below the gap between this model's bf16
//     and fp32 runs on the CPU (<= 1.6e-3 relative over the 6 steps, measured 2026-11-30), so a
//     device matmul that ignored autocast would fail it.
// Every run prints one "[train_cuda]" line with the losses, which gpu_check.sh puts in its
// summary.
//
// Built a second time with TRAIN_TEST_ON_CPU (train_device_cpu_test, run in CI): the same
// harness with the CPU standing in for the device, where every comparison must be bitwise.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/data/token_shard.h"
#include "engine/train/device.h"
#include "engine/train/trainer.h"
#include "models/layers.h"
#include "models/registry.h"
#include "test/testing/test_dir.h"
#include "test/testing/token_data.h"
#ifndef TRAIN_TEST_ON_CPU
#include "kernels/cuda/gemm.h"
#include "memory/cuda/device.h"
#endif

using namespace mammoth;
using engine::train::TrainOptions;

namespace {

constexpr int64_t kSteps = 6, kSplit = 3;
#ifdef TRAIN_TEST_ON_CPU
constexpr double kF32Tolerance = 0, kParamTolerance = 0, kBf16Tolerance = 0;
const Device kDevice = Device::cpu();
void require_gpu() {}
#else
// Relative. fp32 on both sides; 6 AdamW steps on a tiny model keep the curves within ~1e-5 in
// practice; 1e-3 leaves room for reduction order and still catches a wrong kernel or a batch
// or weight that differs (those move the loss by far more).
constexpr double kF32Tolerance = 1e-3, kParamTolerance = 1e-2, kBf16Tolerance = 1e-3;
const Device kDevice = Device::cuda(0);
// Fails the test case (cleanly, with the reason) on a machine without a usable GPU.
void require_gpu() {
  std::string why;
  if (!memory::cuda::cuda_available(&why)) FAIL("no CUDA device: " << why);
  memory::cuda::set_device(0);
  kernels::cuda::set_allow_tf32(false);
  REQUIRE_FALSE(kernels::cuda::allow_tf32());
}
#endif

struct Run {
  std::vector<double> losses;
  engine::nn::NamedTensors params;  // host copies after training
};

struct RunSpec {
  std::string model = "gpt2-tiny";
  Device device = Device::cpu();
  double dropout = 0.0;
  std::string amp = "fp32";
  int64_t steps = kSteps;
  std::string save_dir;  // non-empty: checkpoint at the end
  bool resume = false;
};

Run train_once(const std::string& data_path, const RunSpec& s) {
  models::ModelOptions mo;
  mo.vocab_size = 48;
  mo.max_seq = 16;
  mo.dropout = s.dropout;
  mo.seed = 3;
  auto model = models::create_language_model(s.model, mo);
  engine::train::move_to_device(model->named_parameters(), s.device);
  REQUIRE(models::module_device(*model) == s.device);
  TrainOptions o;
  o.steps = s.steps;
  o.micro_batch = 4;
  o.seq_len = 16;
  o.grad_accum = 2;
  o.lr = 3e-3;
  o.warmup = 2;
  o.schedule = "constant";
  o.eval_every = 0;
  o.quiet = true;
  o.seed = 11;
  o.amp = s.amp;
  o.device = s.device;
  o.save_dir = s.save_dir;
  o.resume = s.resume;
  const auto data = data::TokenDataset::open(data_path);
  json::Value config = json::Value::object();
  config.set("model", s.model);
  const engine::train::TrainResult r = engine::train::train(
      *model,
      [&](const engine::Tensor& in, const engine::Tensor& tg) {
        REQUIRE(in.device() == s.device);
        return model->loss(in, tg);
      },
      data, data::TokenDataset(), o, config);
  Run out{r.losses, engine::train::to_host(model->named_parameters())};
  std::string line = "[train_cuda] " + s.model + " " + s.amp + (s.dropout > 0 ? " dropout" : "") +
                     " on " + s.device.str() + (s.resume ? " (resumed)" : "") + ": losses";
  for (double l : r.losses) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), " %.6f", l);
    line += buf;
  }
  std::printf("%s\n", line.c_str());
  return out;
}

void require_close(const std::vector<double>& a, const std::vector<double>& b, double rel,
                   const std::string& what) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(what << ": step " << i << " loss " << a[i] << " vs " << b[i] << " (relative tolerance "
              << rel << ")");
    REQUIRE(std::isfinite(a[i]));
    CHECK(std::abs(a[i] - b[i]) <= rel * std::abs(b[i]));
  }
}

// ||a - b|| / ||b|| over all parameters.
double relative_distance(const engine::nn::NamedTensors& a, const engine::nn::NamedTensors& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].first == b[i].first);
    const std::vector<double> x = a[i].second.to_vector(), y = b[i].second.to_vector();
    for (size_t j = 0; j < x.size(); ++j) {
      diff += (x[j] - y[j]) * (x[j] - y[j]);
      norm += y[j] * y[j];
    }
  }
  return std::sqrt(diff) / std::sqrt(norm);
}

void fp32_parity(const std::string& model, double dropout) {
  require_gpu();
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir, "data.bin", 8000);
  const Run cpu = train_once(data, {.model = model, .dropout = dropout});
  const Run dev = train_once(data, {.model = model, .device = kDevice, .dropout = dropout});
  require_close(dev.losses, cpu.losses, kF32Tolerance, model + " fp32 " + kDevice.str());
  CHECK(dev.losses.back() < dev.losses.front() - 0.1);  // it learns
  const double d = relative_distance(dev.params, cpu.params);
  INFO(model << ": trained parameters' relative distance " << d);
  CHECK(d <= kParamTolerance);
}

}  // namespace

TEST_CASE("gpt2-tiny fp32 trains on the device as on the CPU", "[train_cuda]") {
  fp32_parity("gpt2-tiny", 0.0);
}

TEST_CASE("llama-tiny fp32 trains on the device as on the CPU", "[train_cuda]") {
  fp32_parity("llama-tiny", 0.0);
}

TEST_CASE("gpt2-tiny with dropout: the device draws the CPU's masks", "[train_cuda]") {
  fp32_parity("gpt2-tiny", 0.1);
}

TEST_CASE("checkpoints saved on the device resume on the CPU and back", "[train_cuda]") {
  require_gpu();
  for (const std::string model : {"gpt2-tiny", "llama-tiny"}) {
    testing::TestDir dir;
    const std::string data = testing::write_tiny_tokens(dir, "data.bin", 8000);
    const Run cpu = train_once(data, {.model = model});
    const Run dev = train_once(data, {.model = model, .device = kDevice});
    const std::vector<double> cpu_tail(cpu.losses.begin() + kSplit, cpu.losses.end());
    const std::vector<double> dev_tail(dev.losses.begin() + kSplit, dev.losses.end());

    // device -> CPU
    const std::string a = dir.path() + "/from_device";
    train_once(data, {.model = model, .device = kDevice, .steps = kSplit, .save_dir = a});
    const Run on_cpu = train_once(data, {.model = model, .save_dir = a, .resume = true});
    require_close(on_cpu.losses, cpu_tail, kF32Tolerance, model + " saved on device, CPU resume");

    // CPU -> device
    const std::string b = dir.path() + "/from_cpu";
    train_once(data, {.model = model, .steps = kSplit, .save_dir = b});
    const Run on_dev =
        train_once(data, {.model = model, .device = kDevice, .save_dir = b, .resume = true});
    require_close(on_dev.losses, dev_tail, kF32Tolerance, model + " saved on CPU, device resume");
    // The resumed runs end where the uninterrupted ones do.
    CHECK(relative_distance(on_dev.params, dev.params) <= kParamTolerance);
    CHECK(relative_distance(on_cpu.params, cpu.params) <= kParamTolerance);
  }
}

TEST_CASE("bf16 autocast on the device stays near the CPU's bf16 run", "[train_cuda]") {
  require_gpu();
  testing::TestDir dir;
  const std::string data = testing::write_tiny_tokens(dir, "data.bin", 8000);
  const Run cpu = train_once(data, {.amp = "bf16"});
  const Run dev = train_once(data, {.device = kDevice, .amp = "bf16"});
  require_close(dev.losses, cpu.losses, kBf16Tolerance, "gpt2-tiny bf16 " + kDevice.str());
  CHECK(dev.losses.back() < dev.losses.front() - 0.1);
}
