// plan/calibrate: a quick calibration of this machine (no MPI) gives a cluster the time model
// reads, its measured terms survive a JSON round trip, and they change CPU predictions only
// where they apply (published clusters, which lack them, predict as before).
#include "plan/calibrate.h"

#include <catch2/catch.hpp>

#include "base/json.h"
#include "kernels/cpu/gemm.h"
#include "models/registry.h"
#include "plan/cluster.h"
#include "plan/parallel_plan.h"
#include "plan/time_model.h"

namespace mammoth::plan {
namespace {

TEST_CASE("a quick calibration is a usable cluster", "[plan][calibrate]") {
  const Cluster c = calibrate_this_machine({.quick = true, .mpirun = "none", .verbose = false});
  CHECK(c.nodes == 1);
  CHECK(c.devices_per_node >= 1);
  CHECK(c.peak_fp32 > 1e9);
  CHECK(c.matmul_efficiency > 0);
  CHECK(c.matmul_efficiency <= 1);
  CHECK(c.gemm.calibrated());
  CHECK(c.op_overhead > 0);
  CHECK(c.op_overhead < 1e-3);
  CHECK(c.device_memory_bandwidth > 1e8);
  CHECK(!c.attention_rates.empty());
  CHECK_FALSE(c.overlaps_communication);
  CHECK(c.calibration.at("quick").as_bool());
  // The per-op cost and the in-step compute factor are the ones that make the time model's step
  // difference between a GPT-2 at two depths the measured one, at both calibrated widths
  // (unless a bound held: the chain of mul_scalar's cost, a factor in [1, 3]).
  const double chain = c.calibration.at("op_overhead_chain_us").as_double() * 1e-6;
  CHECK(c.op_overhead >= chain * (1 - 1e-12));
  CHECK(c.in_step_compute >= 1);
  CHECK(c.in_step_compute <= 3);
  const bool bounded =
      c.op_overhead <= chain * (1 + 1e-12) || c.in_step_compute == 1 || c.in_step_compute == 3;
  const json::Value& all_blocks = c.calibration.at("block_steps");
  REQUIRE(all_blocks.size() == 2);
  for (size_t w = 0; w < 2; ++w) {
    const json::Value& blocks = all_blocks[w];
    models::ModelConfig small = models::resolve_config("gpt2-tiny");
    small.vocab_size = blocks.at("vocab").as_int();
    small.d_model = blocks.at("d_model").as_int();
    small.n_head = blocks.at("heads").as_int();
    small.d_ff = 4 * small.d_model;
    small.max_seq = blocks.at("seq").as_int();
    small.dropout = small.attn_dropout = 0;
    ParallelPlan step;
    step.micro_batch = blocks.at("batch").as_int();
    step.seq_len = small.max_seq;
    double predicted = 0;
    for (int k = 0; k < 2; ++k) {
      small.n_layer = blocks.at("layers")[static_cast<size_t>(k)].as_int();
      predicted += (k == 0 ? -1 : 1) * predict_time(small, step, c).step_time;
    }
    const double measured =
        blocks.at("median_s")[1].as_double() - blocks.at("median_s")[0].as_double();
    CAPTURE(small.d_model, c.op_overhead, c.in_step_compute);
    CHECK(measured > 0);
    if (!bounded) CHECK(predicted == Approx(measured).epsilon(1e-6));
  }

  const Cluster again = cluster_from_json(json::parse(json::dump(cluster_to_json(c))));
  CHECK(again.op_overhead == Approx(c.op_overhead));
  CHECK(again.in_step_compute == Approx(c.in_step_compute));
  CHECK(again.gemm.per_flop == Approx(c.gemm.per_flop));
  CHECK(again.gemm.per_flop_mn == Approx(c.gemm.per_flop_mn));
  CHECK(again.attention_rates.size() == c.attention_rates.size());
  CHECK(again.overlaps_communication == c.overlaps_communication);
  CHECK(again.gemm_time(64, 384, 128, "fp32") == Approx(c.gemm_time(64, 384, 128, "fp32")));
  // The fit counts FLOPs over the active micro-kernel's register tile: an output one column
  // past a whole number of tiles costs a whole tile more.
  const kernels::cpu::GemmTile tile = kernels::cpu::sgemm_tile();
  CHECK(c.gemm.tile_rows == tile.rows);
  CHECK(c.gemm.tile_cols == tile.cols);
  CHECK(again.gemm.tile_cols == tile.cols);
  if (tile.cols > 1) {
    const double m = 100.0 * tile.rows, n = 4.0 * tile.cols;
    CHECK(c.gemm.padded_flops(m, n + 1, 64) == Approx(2.0 * m * (n + tile.cols) * 64));
    CHECK(c.gemm.padded_flops(m + 1, n, 64) == Approx(2.0 * (m + tile.rows) * n * 64));
    CHECK(c.gemm_time(m, n + 1, 64, "fp32") > c.gemm_time(m, n, 64, "fp32"));
  }
  // Thin outputs cost more per FLOP than wide ones (or the same, where the fit finds no term).
  CHECK(c.gemm_time(64, 512, 128, "fp32") / (64.0 * 512 * 128) >=
        c.gemm_time(1024, 512, 128, "fp32") / (1024.0 * 512 * 128));

  ParallelPlan p;
  p.micro_batch = 8;
  p.seq_len = 64;
  p.device = "cpu";
  const models::ModelConfig gpt2 = models::resolve_config("gpt2-tiny");
  const TimePrediction t = predict_time(gpt2, p, c);
  CHECK(t.step_time > 1e-3);  // thousands of kernel calls: milliseconds, not microseconds
  CHECK(t.step_time < 10);
  ParallelPlan more = p;
  more.micro_batch = 2;
  more.grad_accum = 4;  // the same tokens in four micro-batches: four times the calls
  CHECK(predict_time(gpt2, more, c).step_time > t.step_time);
}

TEST_CASE("calibrated keys are refused when malformed", "[plan][calibrate]") {
  json::Value v = cluster_to_json(load_cluster("h200_node"));
  v.set("gemm_time_model", json::Value::object().set("ns_per_flop", 0.02));
  CHECK_THROWS_WITH(cluster_from_json(v), Catch::Contains("ns_per_flop_times_k"));
  v.set("gemm_time_model", json::Value::object()
                               .set("ns_per_flop", 0.02)
                               .set("ns_per_flop_times_k", 0.0)
                               .set("ns_per_flop_times_mn", 0.0)
                               .set("call_us", 1.0));
  json::Value tiles = v;
  tiles.at("gemm_time_model").set("tile_cols", 0);
  CHECK_THROWS_WITH(cluster_from_json(tiles), Catch::Contains("tile_cols"));
  tiles.at("gemm_time_model").set("tile_cols", 64).set("tile_rows", 6).set("tile_depth", 2);
  CHECK_THROWS_WITH(cluster_from_json(tiles), Catch::Contains("tile_depth"));
  tiles.at("gemm_time_model").set("tile_depth", 2);
  json::Value factor = v;
  factor.set("in_step_compute_factor", 0.0);
  CHECK_THROWS_WITH(cluster_from_json(factor), Catch::Contains("in_step_compute_factor"));
  factor.set("in_step_compute_factor", 1.25);
  CHECK(cluster_from_json(factor).in_step_compute == 1.25);
  // It scales the calibrated kernels' times.
  const Cluster scaled = cluster_from_json(factor);
  factor.set("in_step_compute_factor", 1.0);
  const Cluster plain = cluster_from_json(factor);
  CHECK(scaled.gemm_time(256, 256, 256, "fp32") ==
        Approx(1.25 * plain.gemm_time(256, 256, 256, "fp32")));
  v.set("overlaps_communication", 1);
  CHECK_THROWS_WITH(cluster_from_json(v), Catch::Contains("overlaps_communication"));
}

}  // namespace
}  // namespace mammoth::plan
