// `mammoth plan --model M --cluster C --world N --global-batch B --seq-len T [--amp bf16]
// [--top K] [--out FILE]`: the planner's search (plan/search.h): the K fastest valid plans that
// fit, each with its predicted step time, tokens/s, MFU and memory per rank per tier, where the
// time goes, which limit binds and how it differs from the next. --out writes them as JSON;
// --cluster is a file or a shipped name (plan/clusters/: dgx_a100_80gb, h100_cluster,
// h200_node). `--evaluate plan.json` predicts one given plan instead (a plan file, or one
// entry of --out's "plans").
//
// `mammoth plan --show-schedule --pp P --micro-batches M --pp-schedule gpipe|1f1b|interleaved|zb
// [--virtual-stages V] [--trace FILE]`: prints a pipeline schedule as a text timeline with its
// simulated bubble fraction (unit costs: forward 1, input-gradient backward 1, weight gradient
// 1) and writes it as a Chrome trace. The schedule is checked before it is shown, so a
// deadlocking or incomplete schedule is an error here rather than a hang in training.
//
// `mammoth plan --show-partition --model NAME --pp P [--virtual-stages V] [--seq-len T]`: how
// the model's layers are cut into pipeline stages by count and balanced by cost (training
// FLOPs per token from `mammoth analyze`, the LM head on the last stage), with each stage's
// share and the bottleneck.
//
// `mammoth plan --calibrate [--quick] [--threads N] [--out FILE]`: measures this machine
// (plan/calibrate.h: FMA peak, the engine's sgemm at transformer shapes, per-op and per-GEMM-call
// costs, attention, memory and disk rates, MPI all-reduce between two local ranks started with
// mpirun) and writes a cluster file for --cluster (default calibrated.json); one rank is --threads
// CPU threads (default 1). `--calibrate-comm` is that MPI child's part (run under mpirun).
//
// The --pp, --pp-schedule, --virtual-stages and --pp-partition flags are defined here;
// `mammoth train` shares them (and plan shares train's --model and --seq-len) with
// ABSL_DECLARE_FLAG (Abseil flags are global to the binary).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/error.h"
#include "base/json.h"
#include "models/analyze.h"
#include "models/registry.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "plan/calibrate.h"
#include "plan/cluster.h"
#include "plan/memory_model.h"
#include "plan/parallel_plan.h"
#include "plan/search.h"
#include "plan/time_model.h"
#include "tools/command.h"

ABSL_FLAG(bool, show_schedule, false, "plan: print the pipeline schedule's timeline and bubble");
ABSL_FLAG(int, pp, 1, "pipeline-parallel stages (ranks along the pp axis)");
ABSL_FLAG(int, micro_batches, 4,
          "plan: micro-batches per step streamed through the pipeline (train: --grad-accum)");
ABSL_FLAG(std::string, pp_schedule, "1f1b", "pipeline schedule: gpipe, 1f1b, interleaved or zb");
ABSL_FLAG(int, virtual_stages, 1, "model chunks per pipeline rank (interleaved schedule)");
ABSL_FLAG(std::string, trace, "",
          "plan: write the schedule as Chrome trace JSON to this file; plot: draw the timeline "
          "of this train --profile directory");
ABSL_FLAG(std::string, pp_partition, "balanced",
          "how layers are cut into pipeline stages: balanced (by FLOPs, head included) or count");
ABSL_FLAG(bool, show_partition, false, "plan: print the pipeline stage partition of --model");
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(int64_t, seq_len);
ABSL_FLAG(double, pp_weight_cost, 1.0,
          "plan: simulated cost of the weight-gradient half of a backward (forward = 1)");
ABSL_FLAG(std::string, cluster, "",
          "plan: cluster description, a JSON file or a shipped name (dgx_a100_80gb, "
          "h100_cluster, h200_node)");
ABSL_FLAG(int, world, 0, "plan: ranks (GPUs) to plan for");
ABSL_FLAG(int64_t, global_batch, 0, "plan: sequences per optimizer step, over all dp ranks");
ABSL_FLAG(int, top, 5, "plan: how many ranked plans to print");
ABSL_FLAG(std::string, evaluate, "", "plan: predict this plan file instead of searching");
ABSL_FLAG(bool, runnable_only, false,
          "plan: only plans `mammoth train` runs on the device today (else they carry a note)");
ABSL_FLAG(bool, check_memory, true, "plan: refuse plans the memory model says do not fit");
ABSL_FLAG(bool, flash_attention, true,
          "plan: attention never stores its T x T scores (false: Megatron-LM 2021's softmax)");
ABSL_FLAG(bool, overlap_dp, true,
          "plan: dp/ZeRO collectives overlap the last backward (false: after it)");
ABSL_FLAG(bool, calibrate, false,
          "plan: measure this machine and write a cluster file (--out, default calibrated.json)");
ABSL_FLAG(
    bool, calibrate_comm, false,
    "plan: the MPI part of --calibrate, on every rank of an mpirun job (rank 0 writes --out)");
ABSL_FLAG(bool, quick, false, "plan --calibrate: fewer shapes and repetitions (~5 s)");
ABSL_DECLARE_FLAG(int, threads);
ABSL_DECLARE_FLAG(std::string, amp);
ABSL_DECLARE_FLAG(std::string, device);
ABSL_DECLARE_FLAG(std::string, out);

namespace mammoth::tools {
namespace {

int show_partition() {
  namespace pl = parallel::pipeline;
  const models::ModelConfig config = models::resolve_config(absl::GetFlag(FLAGS_model));
  const int stages = absl::GetFlag(FLAGS_pp) * absl::GetFlag(FLAGS_virtual_stages);
  const int64_t seq = absl::GetFlag(FLAGS_seq_len);
  const models::ModelAnalysis a = models::analyze(config, seq);
  const std::vector<double> blocks(static_cast<size_t>(config.n_layer),
                                   a.block_flops_per_token_forward);
  const double head = a.head_flops_per_token_forward;
  std::printf(
      "%s: %lld layers, %d stages, seq %lld; per token forward: block %.3g FLOP, "
      "head %.3g FLOP (%.2f blocks)\n",
      absl::GetFlag(FLAGS_model).c_str(), static_cast<long long>(config.n_layer), stages,
      static_cast<long long>(seq), blocks[0], head, head / blocks[0]);
  double total = head;
  for (double b : blocks) total += b;
  for (const auto& [name, p] : {std::pair<const char*, pl::Partition>{
                                    "count", pl::partition_by_count(config.n_layer, stages)},
                                {"balanced", pl::balanced_partition(blocks, 0.0, head, stages)}}) {
    std::printf("%-9s", name);
    for (int s = 0; s < stages; ++s) {
      double c = s == stages - 1 ? head : 0.0;
      for (int64_t l = p[s]; l < p[s + 1]; ++l) c += blocks[static_cast<size_t>(l)];
      std::printf(" | layers %lld-%lld %4.1f%%", static_cast<long long>(p[s]),
                  static_cast<long long>(p[s + 1] - 1), 100.0 * c / total);
    }
    const double worst = pl::max_stage_cost(p, blocks, 0.0, head);
    std::printf(" | bottleneck %.1f%% (ideal %.1f%%)\n", 100.0 * worst / total, 100.0 / stages);
  }
  return 0;
}

plan::TimeOptions time_options() {
  return {.flash_attention = absl::GetFlag(FLAGS_flash_attention),
          .overlap_dp = absl::GetFlag(FLAGS_overlap_dp)};
}

std::string plan_device() { return absl::GetFlag(FLAGS_device) == "cpu" ? "cpu" : "cuda"; }

void write_json(const json::Value& v) {
  const std::string path = absl::GetFlag(FLAGS_out);
  if (path.empty()) return;
  std::ofstream out(path);
  out << json::dump(v, 2) << "\n";
  out.close();
  MAMMOTH_CHECK(out.good()) << "[plan] cannot write --out file '" << path << "'";
  std::printf("wrote %s\n", path.c_str());
}

int evaluate_plan(const models::ModelConfig& config, const plan::Cluster& cluster) {
  const std::string path = absl::GetFlag(FLAGS_evaluate);
  const plan::ParallelPlan p = plan::load_plan(path);
  plan::ParallelPlan on_cpu = p;
  on_cpu.device = "cpu";
  const plan::PlanContext context{.world = p.world(), .model = &config};
  MAMMOTH_CHECK(plan::check(on_cpu, context).empty())
      << "[plan] --evaluate " << path << ": " << plan::check(on_cpu, context);
  MAMMOTH_CHECK(p.world() <= cluster.world())
      << "[plan] --evaluate " << path << ": the plan's " << p.world() << " ranks exceed "
      << cluster.name << "'s " << cluster.world() << " GPUs";
  plan::RankedPlan r;
  r.plan = p;
  r.time = plan::predict_time(config, p, cluster, time_options());
  r.memory = plan::predict_memory(config, p);
  r.note = p.device == "cpu" ? "" : plan::check(p, context);
  plan::SearchResult result;
  result.plans.push_back(r);
  std::printf("%s on %s: %s\n", config.name.c_str(), cluster.name.c_str(), path.c_str());
  std::string text = plan::format_plans(result, cluster);
  text = text.substr(0, text.rfind("search:"));
  std::printf("%s", text.c_str());
  const std::string misfit = plan::memory_misfit(r.memory, cluster);
  if (!misfit.empty()) std::printf("  does not fit: %s\n", misfit.c_str());
  write_json(result.to_json().set("model", config.name).set("cluster", cluster.name));
  return 0;
}

int search_plans() {
  const std::string model = absl::GetFlag(FLAGS_model);
  const models::ModelConfig config = models::resolve_config(model);
  const std::string cluster_name = absl::GetFlag(FLAGS_cluster);
  MAMMOTH_CHECK(!cluster_name.empty())
      << "[plan] --cluster is needed: a JSON file or a shipped name (dgx_a100_80gb, "
         "h100_cluster, h200_node)";
  const plan::Cluster cluster = plan::load_cluster(cluster_name);
  if (!absl::GetFlag(FLAGS_evaluate).empty()) return evaluate_plan(config, cluster);
  plan::SearchOptions o;
  o.world = absl::GetFlag(FLAGS_world);
  o.global_batch = absl::GetFlag(FLAGS_global_batch);
  o.seq_len = absl::GetFlag(FLAGS_seq_len);
  o.top_k = absl::GetFlag(FLAGS_top);
  o.amp = absl::GetFlag(FLAGS_amp);
  o.device = plan_device();
  o.runnable_only = absl::GetFlag(FLAGS_runnable_only);
  o.check_memory = absl::GetFlag(FLAGS_check_memory);
  // Plans to be run here count what today's train holds beyond their share; the others are
  // ranked by what they need (plan/search.h).
  o.count_model_copy = o.runnable_only;
  o.time = time_options();
  MAMMOTH_CHECK(o.world >= 1) << "[plan] --world must be >= 1 (the ranks to plan for), got "
                              << o.world;
  MAMMOTH_CHECK(o.global_batch >= 1)
      << "[plan] --global-batch must be >= 1 (sequences per step), got " << o.global_batch;
  const plan::SearchResult result = plan::search(config, cluster, o);
  std::printf("%s on %d of %s (%d x %d GPUs), global batch %lld x %lld tokens, amp %s\n",
              config.name.c_str(), o.world, cluster.name.c_str(), cluster.nodes,
              cluster.devices_per_node, static_cast<long long>(o.global_batch),
              static_cast<long long>(o.seq_len), o.amp.c_str());
  if (result.plans.empty())
    std::printf("no plan is valid and fits (%s)\n",
                o.check_memory ? "see --check-memory=false for the time alone" : "none valid");
  std::printf("%s", plan::format_plans(result, cluster).c_str());
  write_json(result.to_json().set("model", config.name).set("cluster", cluster.name));
  return result.plans.empty() ? 1 : 0;
}

void write_file(const json::Value& v, const std::string& path) {
  std::ofstream out(path);
  out << json::dump(v, 2) << "\n";
  out.close();
  MAMMOTH_CHECK(out.good()) << "[plan] cannot write '" << path << "'";
}

int calibrate() {
  plan::CalibrateOptions o;
  o.quick = absl::GetFlag(FLAGS_quick);
  o.threads_per_rank = std::max(1, absl::GetFlag(FLAGS_threads));
  const plan::Cluster c = plan::calibrate_this_machine(o);
  std::string path = absl::GetFlag(FLAGS_out);
  if (path.empty()) path = "calibrated.json";
  write_file(plan::cluster_to_json(c), path);
  std::printf(
      "wrote %s: %d ranks x %d thread(s), %.1f GFLOP/s peak, sgemm %.0f%% of it, op %.2f us, "
      "GEMM call %.2f us, attention %.2f GFLOP/s, MPI %.2f GB/s %.1f us\n",
      path.c_str(), c.devices_per_node, o.threads_per_rank, c.peak_fp32 / 1e9,
      100 * c.matmul_efficiency, c.op_overhead * 1e6, c.gemm_call_overhead * 1e6,
      c.attention_rate / 1e9, c.intra_node.bandwidth / 1e9, c.intra_node.latency * 1e6);
  return 0;
}

int calibrate_comm() {
  const json::Value v = plan::calibrate_comm(absl::GetFlag(FLAGS_quick));
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const std::string path = absl::GetFlag(FLAGS_out);
  if ((rank == nullptr || std::atoi(rank) == 0) && !path.empty()) write_file(v, path);
  return 0;
}

int run_plan(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.empty()) << "[plan] unexpected argument '" << (args.empty() ? "" : args[0])
                              << "'";
  if (absl::GetFlag(FLAGS_calibrate)) return calibrate();
  if (absl::GetFlag(FLAGS_calibrate_comm)) return calibrate_comm();
  if (absl::GetFlag(FLAGS_show_partition)) return show_partition();
  if (!absl::GetFlag(FLAGS_show_schedule)) return search_plans();
  const double weight_cost = absl::GetFlag(FLAGS_pp_weight_cost);
  MAMMOTH_CHECK(weight_cost >= 0) << "[plan] --pp-weight-cost must be >= 0, got " << weight_cost;
  namespace pl = parallel::pipeline;
  const pl::ScheduleKind kind = pl::schedule_kind_from_name(absl::GetFlag(FLAGS_pp_schedule));
  const pl::Schedule schedule =
      pl::make_schedule(kind, {.stages = absl::GetFlag(FLAGS_pp),
                               .micro_batches = absl::GetFlag(FLAGS_micro_batches),
                               .virtual_stages = absl::GetFlag(FLAGS_virtual_stages)});
  const pl::CheckResult result = pl::check_schedule(schedule, {1.0, 1.0, weight_cost});
  std::cout << pl::timeline_text(schedule, result);
  MAMMOTH_CHECK(result.ok) << "[plan] schedule " << schedule.name
                           << " is invalid: " << result.error;
  if (kind != pl::ScheduleKind::kInterleaved || schedule.virtual_stages == 1) {
    std::printf("1F1B analytic bubble (p-1)/(m+p-1) = %.4f\n",
                pl::analytic_bubble_1f1b(schedule.stages, schedule.micro_batches));
  } else {
    std::printf("interleaved analytic bubble (p-1)/(v*m+p-1) = %.4f\n",
                pl::analytic_bubble_interleaved(schedule.stages, schedule.micro_batches,
                                                schedule.virtual_stages));
  }
  const std::string trace = absl::GetFlag(FLAGS_trace);
  if (!trace.empty()) {
    std::ofstream out(trace);
    MAMMOTH_CHECK(out.good()) << "[plan] cannot create --trace file '" << trace
                              << "': " << std::strerror(errno);
    out << pl::chrome_trace_json(schedule, result);
    out.close();
    MAMMOTH_CHECK(out.good()) << "[plan] writing --trace file '" << trace
                              << "' failed (disk full?): " << std::strerror(errno);
    std::printf("wrote Chrome trace %s\n", trace.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace mammoth::tools

MAMMOTH_COMMAND(plan,
                "parallel plans: the fastest plans for --model on --cluster --world N "
                "--global-batch B (or --evaluate plan.json), --calibrate (this machine as a "
                "cluster file), --show-schedule (a pipeline "
                "schedule's timeline), --show-partition (pipeline stages of --model)",
                mammoth::tools::run_plan);
