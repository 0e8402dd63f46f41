// The time model's structure: its bound holds, its parts add up, the schedule simulator's
// bubble comes through, link levels and repeated blocks behave as the model says.
#include "plan/time_model.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <string>

#include "models/registry.h"
#include "plan/cluster.h"
#include "plan/memory_model.h"
#include "plan/offload_traffic.h"
#include "test/plan/published_models.h"

namespace mammoth::plan {
namespace {

ParallelPlan layout(int dp, int pp, int tp, int64_t mb, int64_t accum, int64_t seq) {
  ParallelPlan p;
  p.dp = dp;
  p.pp = pp;
  p.tp = tp;
  p.micro_batch = mb;
  p.grad_accum = accum;
  p.seq_len = seq;
  p.amp = "bf16";
  p.device = "cuda";
  return p;
}

TEST_CASE("the compute bound holds and the parts add up", "[plan][time]") {
  const models::ModelConfig config = models::resolve_config("llama-13b");
  TimeModel model(config, load_cluster("dgx_a100_80gb"));
  int checked = 0;
  for (int pp : {1, 2, 4, 8}) {
    for (int tp : {1, 2, 4, 8, 16}) {
      for (const char* schedule : {"1f1b", "gpipe", "zb", "interleaved"}) {
        for (int zero : {0, 1, 3}) {
          for (const char* offload : {"none", "host"}) {
            ParallelPlan p = layout(4, pp, tp, 2, 8, 2048);
            if (std::string(schedule) == "interleaved") {
              if (pp == 1) continue;
              p.virtual_stages = 2;
            }
            p.pp_schedule = schedule;
            p.zero = zero;
            p.offload = offload;
            p.recompute_blocks = zero == 1 ? -1 : 0;
            const TimePrediction t = model.predict(p);
            INFO(plan_summary(p) << " " << schedule);
            CHECK(model.compute_lower_bound(p) <= t.step_time * (1 + 1e-12));
            CHECK(t.parts.total() == Approx(t.step_time));
            CHECK(t.mfu > 0);
            CHECK(t.mfu <= load_cluster("dgx_a100_80gb").matmul_efficiency);
            CHECK(t.hfu >= t.mfu);
            ++checked;
          }
        }
      }
    }
  }
  CHECK(checked > 300);
}

// The chunk moves themselves are checked against the runtime's in offload_traffic_test.sh;
// here, that the time model charges them.
TEST_CASE("paging within --device-mem costs what the dry run moves", "[plan][time]") {
  const models::ModelConfig config = models::resolve_config("gpt2");
  const Cluster cluster = load_cluster("dgx_a100_80gb");
  TimeModel model(config, cluster);
  ParallelPlan p = layout(1, 1, 1, 4, 2, 1024);
  // Parameters, gradients and the two moments, and room for the chunks' padding.
  const int64_t state =
      models::count_parameters(config) * static_cast<int64_t>(dtype_size(config.dtype)) * 4 * 5 / 4;
  const TimePrediction whole = model.predict(p);
  CHECK(whole.parts.offload == 0);
  double previous = 0;
  for (int64_t budget : {state, state / 3, state / 6}) {
    p.device_mem = budget;
    const OffloadTraffic t =
        simulate_offload(offload_setup(predict_memory(config, p).stages[0], p));
    REQUIRE(t.error.empty());
    const TimePrediction paged = model.predict(p);
    INFO("device-mem " << budget << ": " << describe(t.compute) << "; " << describe(t.optimizer));
    CHECK(paged.parts.total() == Approx(paged.step_time));
    if (budget == state) {
      // Everything has a home on the device: nothing moves, nothing is charged.
      CHECK(t.compute.total() + t.optimizer.total() == 0);
      CHECK(paged.parts.offload == 0);
    } else {
      // Every forward reads each parameter chunk: at least the evicted ones come back.
      CHECK(t.compute.device_in > 0);
      CHECK(paged.parts.offload > previous);
      CHECK(paged.step_time > whole.step_time);
      previous = paged.parts.offload;
    }
  }
}

TEST_CASE("the pipeline bubble is the simulator's", "[plan][time]") {
  // Without communication or memory-bound work the bubble of 1F1B is (p - 1) / (m + p - 1).
  models::ModelConfig config = testing::megatron_gpt(32, 4096, 32);
  TimeModel model(config, load_cluster("h200_node"));
  ParallelPlan p = layout(1, 4, 1, 1, 12, 2048);
  const TimePrediction t = model.predict(p);
  // The head sits on the last stage, so the bottleneck rank's share is a little over 1/4; the
  // bubble is within a few points of the uniform formula.
  CHECK(t.bubble_fraction == Approx(3.0 / 15.0).margin(0.03));
  p.pp_schedule = "interleaved";
  p.virtual_stages = 2;
  CHECK(model.predict(p).bubble_fraction < t.bubble_fraction);
  p.pp_schedule = "gpipe";
  p.virtual_stages = 1;
  CHECK(model.predict(p).step_time == Approx(t.step_time).epsilon(0.02));
}

TEST_CASE("a tp group beyond a node pays the inter-node link", "[plan][time]") {
  const models::ModelConfig config = testing::megatron_gpt(16, 8192, 64);
  const Cluster cluster = load_cluster("dgx_a100_80gb");
  TimeModel model(config, cluster);
  const TimePrediction in_node = model.predict(layout(1, 1, 8, 1, 1, 2048));
  const TimePrediction across = model.predict(layout(1, 1, 16, 1, 1, 2048));
  // Twice the ranks halve the compute; the ring's bytes per rank stay ~the same but move at
  // 25 GB/s instead of 300 GB/s.
  CHECK(across.parts.compute < in_node.parts.compute);
  CHECK(across.parts.tp_comm > 8 * in_node.parts.tp_comm);
}

TEST_CASE("expert parallelism pays its token exchanges and holds 1/ep of the experts",
          "[plan][time]") {
  const models::ModelConfig config = models::resolve_config("mixtral-8x7b");
  const Cluster cluster = load_cluster("dgx_a100_80gb");
  TimeModel model(config, cluster);
  ParallelPlan one = layout(8, 1, 1, 1, 4, 4096);
  one.device = "cpu";  // --ep runs on the CPU backend; the model costs it on the cluster
  one.amp = "fp32";    // the rows travel in the activations' dtype, which is then the model's
  REQUIRE(check(one, {.model = &config}).empty());
  ParallelPlan ep = one;
  ep.ep = 4;
  REQUIRE(check(ep, {.model = &config}).empty());
  const TimePrediction a = model.predict(one), b = model.predict(ep);
  // The exchanges' bytes are expert_exchange_bytes_per_step's, at the NVLink rate (4 consecutive
  // dp ranks of one 8-GPU node); each exchange also waits one latency per peer, and the row
  // counts' all_to_all one more per block forward.
  const Link& l = cluster.intra_node;
  const double L = static_cast<double>(config.n_layer), m = 4, peers = 3;
  const double expected =
      static_cast<double>(expert_exchange_bytes_per_step(ep, config)) / l.bandwidth +
      m * L * (4 + 1) * peers * l.latency;
  CHECK(b.parts.tp_comm - a.parts.tp_comm == Approx(expected).epsilon(1e-9));
  CHECK(a.parts.tp_comm == 0);
  // The same compute; the optimizer walks a quarter of the experts (ZeRO 0: no other sharding),
  // and the experts' gradients reduce over 2 ranks instead of 8.
  CHECK(b.parts.compute == Approx(a.parts.compute));
  CHECK(b.parts.optimizer < 0.5 * a.parts.optimizer);
  CHECK(b.parts.dp_comm < a.parts.dp_comm);
}

TEST_CASE("repeated blocks share one cost", "[plan][time]") {
  models::ModelConfig a = testing::megatron_gpt(24, 4096, 32);
  models::ModelConfig b = a;
  b.n_layer = 48;
  const Cluster cluster = load_cluster("h100_cluster");
  const ParallelPlan p = layout(1, 1, 1, 1, 4, 2048);
  TimeModel ma(a, cluster), mb(b, cluster);
  const TimePrediction ta = ma.predict(p), tb = mb.predict(p);
  models::ModelConfig one = a;
  one.n_layer = 1;
  const TimePrediction t1 = TimeModel(one, cluster).predict(p);
  // compute(L) = L * block + head: doubling 24 blocks adds 24 blocks' worth.
  const double block = (ta.parts.compute - t1.parts.compute) / 23;
  CHECK(tb.parts.compute == Approx(ta.parts.compute + 24 * block).epsilon(1e-9));
}

TEST_CASE("dp overlap and the system options", "[plan][time]") {
  const models::ModelConfig config = testing::megatron_gpt(24, 2304, 24);
  const Cluster cluster = load_cluster("dgx_a100_80gb");
  const ParallelPlan p = layout(32, 1, 1, 1, 16, 2048);
  const TimePrediction ours = predict_time(config, p, cluster);
  const TimePrediction megatron =
      predict_time(config, p, cluster, {.flash_attention = false, .overlap_dp = false});
  CHECK(megatron.parts.dp_comm > ours.parts.dp_comm);
  CHECK(megatron.parts.compute > ours.parts.compute);  // the scores go through HBM
  CHECK(megatron.step_time > ours.step_time);
}

// A calibrated CPU-like cluster: per-call costs and a fitted GEMM time, as plan --calibrate
// writes (the figures are round, not measured: the test checks the model's structure).
Cluster calibrated_like() {
  Cluster c = load_cluster("h200_node");
  c.peak_fp32 = c.peak_tf32 = c.peak_bf16 = c.peak_fp16 = 100e9;
  c.op_overhead = 1e-6;
  c.device_memory_bandwidth = 20e9;
  c.gemm = {.per_flop = 1e-11,
            .per_flop_k = 0,
            .per_flop_mn = 1e-10,
            .call = 4e-7,
            .tile_rows = 6,
            .tile_cols = 64};
  c.attention_rates = {{16, 15e9}, {64, 40e9}};
  c.overlaps_communication = false;
  return c;
}

TEST_CASE("ring attention is costed blockwise on a calibrated machine", "[plan][time]") {
  const models::ModelConfig gpt2 = models::resolve_config("gpt2-tiny");
  Cluster c = calibrated_like();
  ParallelPlan p = layout(1, 1, 1, 8, 2, 64);
  p.amp = "fp32";
  p.device = "cpu";
  p.sp = 2;
  p.sp_mode = "ulysses";
  const TimePrediction fused = TimeModel(gpt2, c).predict(p);
  p.sp_mode = "ring";
  const TimePrediction ring = TimeModel(gpt2, c).predict(p);
  // Five chunk pairs of small ops and GEMMs per block cost more than one fused kernel call.
  CHECK(ring.parts.compute > fused.parts.compute);
  // The broadcast ops' measured rate is used where given: a slower one costs more.
  const double before = ring.parts.compute;
  c.broadcast_op_per_element = 1e-8;
  const double slow = TimeModel(gpt2, c).predict(p).parts.compute;
  c.broadcast_op_per_element = 2e-8;
  const double slower = TimeModel(gpt2, c).predict(p).parts.compute;
  CHECK(slower > slow);
  CHECK(slow != Approx(before));
  // Grouped queries add the K / V copies to every head in each ring step, not to Ulysses (its
  // fused kernel reads the key heads as they are).
  const models::ModelConfig llama = models::resolve_config("llama-tiny");
  REQUIRE(llama.n_kv_head < llama.n_head);
  models::ModelConfig llama_mha = llama;
  llama_mha.n_kv_head = llama.n_head;
  const double grouped = TimeModel(llama, c).predict(p).parts.compute;
  const double whole = TimeModel(llama_mha, c).predict(p).parts.compute;
  CHECK(grouped > whole);
  p.sp_mode = "ulysses";
  CHECK(TimeModel(llama, c).predict(p).parts.compute <=
        TimeModel(llama_mha, c).predict(p).parts.compute);
}

}  // namespace
}  // namespace mammoth::plan
