// plan/memory_model: the scaling rules a planner relies on, a case checked by hand, and the
// published-size configurations it must handle analytically.
#include "plan/memory_model.h"

#include <catch2/catch.hpp>

#include "models/analyze.h"
#include "models/registry.h"

namespace mammoth::plan {
namespace {

models::ModelConfig gpt2_small_case() {
  models::ModelConfig c;
  c.name = "hand";
  c.family = models::Family::kGpt2;
  c.vocab_size = 16;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_kv_head = 2;
  c.d_model = 8;
  c.d_ff = 32;
  c.max_seq = 8;
  return c;
}

ParallelPlan plan_of(int64_t micro_batch, int64_t seq_len) {
  ParallelPlan p;
  p.micro_batch = micro_batch;
  p.seq_len = seq_len;
  return p;
}

TEST_CASE("memory_model: a one-block GPT-2 checked by hand") {
  const models::ModelConfig c = gpt2_small_case();
  const MemoryPrediction m = predict_memory(c, plan_of(1, 8));
  REQUIRE(m.stages.size() == 1);
  const StageMemory& s = m.stages[0];
  // Parameters: block 2*2*8 + 4*(64+8) + (8*32+32) + (32*8+8) = 872; wte 128, wpe 64, ln_f 16.
  const int64_t P = 872 + 128 + 64 + 16;
  REQUIRE(models::count_parameters(c) == P);
  CHECK(s.params == P * 4);
  CHECK(s.optimizer == P * 8);  // two f32 moments
  CHECK(s.model_copy == 0);
  // Saved for backward, N = 8 tokens, C = 8, F = 32, f32:
  //   block: x, ln_1 out, h1, ln_2 out (4 NC) + q, k, v, attention out, merged (5 NC)
  //          + lse (2 heads x 8 rows f32) + c_fc out, gelu out (2 NF) + 2 LayerNorms' mu, rstd
  const int64_t NC = 8 * 8 * 4;
  const int64_t block = 9 * NC + 2 * 8 * 4 + 2 * 8 * 32 * 4 + 4 * 8 * 4;
  // The peak is the block's backward: the head's tensors are gone and its gradients made
  // (ln_f 16 + the tied table 16 x 8); the block's saved tensors are live with the incoming
  // gradient (NC), the MLP's d_ff-wide input gradient (N F) and c_proj's weight gradient (C F).
  CHECK(s.activations == block);
  // Beside a fixed 4 KiB of small tensors: the batch's ids and targets and the position ids.
  CHECK(s.temporaries - 4 * 1024 - 2 * 8 * 8 - 8 * 8 == NC + 8 * 32 * 4 + 8 * 32 * 4);
  CHECK(s.grads == (16 + 16 * 8) * 4);
  CHECK(s.device_peak == s.params + s.grads + s.optimizer + s.activations + s.buffers +
                             s.temporaries + s.model_copy);
  CHECK(m.device_peak() == s.device_peak);
}

TEST_CASE("memory_model: ZeRO-3 holds about 1/dp of the parameters") {
  const models::ModelConfig c = models::resolve_config("gpt2");
  ParallelPlan p = plan_of(1, 128);
  const int64_t P = models::count_parameters(c) * 4;
  for (int dp : {2, 4, 8}) {
    p.dp = dp;
    p.zero = 3;
    const StageMemory s = predict_memory(c, p).stages[0];
    CHECK(s.params == Approx(static_cast<double>(P) / dp).epsilon(0.01));
    CHECK(s.optimizer == Approx(2.0 * P / dp).epsilon(0.01));
    p.zero = 1;
    const StageMemory z1 = predict_memory(c, p).stages[0];
    CHECK(z1.params == Approx(static_cast<double>(P)).epsilon(0.01));
    CHECK(z1.optimizer == Approx(2.0 * P / dp).epsilon(0.01));
  }
}

TEST_CASE("memory_model: tp halves the matrices, not the norms") {
  const models::ModelConfig c = models::resolve_config("llama-7b");
  ParallelPlan p = plan_of(1, 2048);
  const StageMemory one = predict_memory(c, p).stages[0];
  p.tp = 2;
  const StageMemory two = predict_memory(c, p).stages[0];
  // The trained form's parameters (the single-process copy is the runtime's, counted apart).
  CHECK(two.model_copy == one.params);
  CHECK(static_cast<double>(two.params) == Approx(one.params / 2.0).epsilon(0.001));
  CHECK(two.params > one.params / 2);  // replicated norms
  CHECK(two.optimizer * 2 > one.optimizer);
  CHECK(static_cast<double>(two.optimizer) == Approx(one.optimizer / 2.0).epsilon(0.001));
}

TEST_CASE("memory_model: recompute lowers activations") {
  // Batches whose activations outweigh the gradients (the peak is then in backward's start).
  for (const char* name : {"gpt2-tiny", "llama-tiny", "gpt2-medium"}) {
    const models::ModelConfig c = models::resolve_config(name);
    ParallelPlan p = plan_of(16, c.max_seq);
    const StageMemory plain = predict_memory(c, p).stages[0];
    p.recompute_blocks = -1;
    const StageMemory rc = predict_memory(c, p).stages[0];
    CHECK(rc.activations < plain.activations);
    CHECK(rc.device_peak < plain.device_peak);
    p.recompute_blocks = 1;
    const StageMemory some = predict_memory(c, p).stages[0];
    CHECK(some.activations <= plain.activations);
    CHECK(some.activations >= rc.activations);
  }
}

TEST_CASE("memory_model: 1f1b stage 0 holds pp micro-batches, gpipe all of them") {
  models::ModelConfig c = models::resolve_config("gpt2-medium");
  // Long sequences, so that a stage's activations outweigh its gradients at every moment.
  ParallelPlan p = plan_of(4, 1024);
  p.pp = 4;
  p.grad_accum = 8;
  p.pp_partition = "count";
  p.pp_schedule = "1f1b";
  const MemoryPrediction f = predict_memory(c, p);
  p.grad_accum = 1;
  const MemoryPrediction one = predict_memory(c, p);
  // Stage 1 (blocks only, as stage 0 but without the embedding): 3 micro-batches in flight.
  const double per_mb = static_cast<double>(one.stages[1].activations);
  CHECK(static_cast<double>(f.stages[1].activations) == Approx(3 * per_mb).epsilon(0.05));
  CHECK(f.stages[0].activations > f.stages[1].activations);
  CHECK(f.stages[0].activations > 3 * one.stages[0].activations);
  p.grad_accum = 8;
  p.pp_schedule = "gpipe";
  const MemoryPrediction g = predict_memory(c, p);
  CHECK(static_cast<double>(g.stages[1].activations) == Approx(8 * per_mb).epsilon(0.05));
}

TEST_CASE("memory_model: sequence parallelism divides activations") {
  const models::ModelConfig c = models::resolve_config("gpt2-medium");
  ParallelPlan p = plan_of(2, 1024);
  const StageMemory one = predict_memory(c, p).stages[0];
  p.sp = 4;
  p.sp_mode = "ulysses";
  const StageMemory four = predict_memory(c, p).stages[0];
  CHECK(four.activations < one.activations / 3);
}

TEST_CASE("memory_model: offload moves the states off the device") {
  const models::ModelConfig c = models::resolve_config("gpt2");
  ParallelPlan p = plan_of(2, 256);
  p.offload = "host";
  const StageMemory s = predict_memory(c, p).stages[0];
  const int64_t P = models::count_parameters(c);
  CHECK(s.host == P * 8);
  CHECK(s.chunks_device == 2 * P * 4);
  CHECK(s.optimizer == 0);
  p.offload = "nvme";
  const StageMemory n = predict_memory(c, p).stages[0];
  CHECK(n.nvme == P * 8);
}

TEST_CASE("memory_model: the placement table's homes follow the offload fields and budgets") {
  const models::ModelConfig c = models::resolve_config("gpt2");
  const int64_t P = models::count_parameters(c);
  using H = StageMemory::Homes;
  auto homes = [&](const ParallelPlan& p) { return predict_memory(c, p).stages[0].homes; };
  auto same = [](const H& a, const H& b) {
    return a.params == b.params && a.grads == b.grads && a.optimizer == b.optimizer;
  };
  ParallelPlan p = plan_of(2, 256);
  // No offload: everything on the device, ZeRO-3 over dp 2 about halves each.
  CHECK(same(homes(p)[kDeviceTier], H{P * 4, P * 4, P * 8}));
  CHECK(homes(p)[kHostTier].total() == 0);
  ParallelPlan z = p;
  z.dp = 2, z.zero = 3;
  CHECK(homes(z)[kDeviceTier].params < P * 4 * 6 / 10);
  CHECK(homes(z)[kDeviceTier].grads < P * 4 * 6 / 10);
  CHECK(homes(z)[kDeviceTier].optimizer < P * 8 * 6 / 10);
  // ZeRO-3 with its parameter shards on NVMe: the shard moves there, the rest stays.
  ParallelPlan zn = z;
  zn.offload_params = "nvme";
  CHECK(homes(zn)[kNvmeTier].params == homes(z)[kDeviceTier].params);
  CHECK(homes(zn)[kDeviceTier].params == 0);
  CHECK(homes(zn)[kDeviceTier].grads == homes(z)[kDeviceTier].grads);
  CHECK(homes(zn)[kDeviceTier].optimizer == homes(z)[kDeviceTier].optimizer);
  // Everything on NVMe: nothing homed on the device or the host.
  p.offload = "nvme", p.offload_params = "nvme";
  CHECK(same(homes(p)[kNvmeTier], H{P * 4, P * 4, P * 8}));
  CHECK(homes(p)[kDeviceTier].total() + homes(p)[kHostTier].total() == 0);
  // States on the host; parameters and gradients stay on the device while they fit its
  // budget, and move to the host (the device caching them) when they do not.
  p.offload = "host", p.offload_params = "none";
  CHECK(same(homes(p)[kDeviceTier], H{P * 4, P * 4, 0}));
  CHECK(same(homes(p)[kHostTier], H{0, 0, P * 8}));
  p.device_mem = P * 4;
  CHECK(homes(p)[kDeviceTier].total() == 0);
  CHECK(same(homes(p)[kHostTier], H{P * 4, P * 4, P * 8}));
  const std::string table = placement_table(predict_memory(c, p).stages[0], p);
  CHECK_THAT(table, Catch::Contains("device  params      0.00 MiB"));
  CHECK_THAT(table, Catch::Contains("budget 474.7 MiB"));
  CHECK_THAT(table, Catch::Contains("host    params    474.70 MiB"));
}

TEST_CASE("memory_model: published sizes are a formula, not a run") {
  // GPT-3 175B and Llama 3 405B shapes in bf16 under tp 8, pp 16 (Megatron-style layouts).
  models::ModelConfig gpt3 = models::resolve_config("gpt2");
  gpt3.n_layer = 96;
  gpt3.n_head = 96;
  gpt3.n_kv_head = 96;
  gpt3.d_model = 12288;
  gpt3.d_ff = 4 * 12288;
  gpt3.max_seq = 2048;
  gpt3.dtype = DType::kBF16;
  models::ModelConfig llama = models::resolve_config("llama3-70b");
  llama.n_layer = 126;
  llama.n_head = 128;
  llama.n_kv_head = 8;
  llama.d_model = 16384;
  llama.d_ff = 53248;
  llama.max_seq = 8192;
  llama.dtype = DType::kBF16;
  for (const models::ModelConfig& c : {gpt3, llama}) {
    ParallelPlan p = plan_of(1, c.max_seq);
    p.tp = 8;
    p.pp = 16;
    p.dp = 8;
    p.zero = 1;
    p.grad_accum = 16;
    p.recompute_blocks = -1;
    const MemoryPrediction m = predict_memory(c, p);
    REQUIRE(m.stages.size() == 16);
    // Each stage's trained parameters: ~1/128 of the model's 2 bytes per parameter.
    const double total = static_cast<double>(models::count_parameters(c)) * 2;
    INFO(m.explain());
    for (const StageMemory& s : m.stages) {
      CHECK(s.device_peak > 0);
      CHECK(s.optimizer < total * 6 / 128 / 8 * 1.5);
      // Both layouts ran on 80 GB devices (with full recompute).
      CHECK(s.planned_peak() < 80.0 * (1 << 30));
      CHECK(s.planned_peak() > 0.1 * (1 << 30));
    }
  }
}

}  // namespace
}  // namespace mammoth::plan
