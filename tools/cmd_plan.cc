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
// The --pp, --pp-schedule, --virtual-stages and --pp-partition flags are defined here;
// `mammoth train` shares them (and plan shares train's --model and --seq-len) with
// ABSL_DECLARE_FLAG (Abseil flags are global to the binary).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/error.h"
#include "models/analyze.h"
#include "models/registry.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "tools/command.h"

ABSL_FLAG(bool, show_schedule, false, "plan: print the pipeline schedule's timeline and bubble");
ABSL_FLAG(int, pp, 1, "pipeline-parallel stages (ranks along the pp axis)");
ABSL_FLAG(int, micro_batches, 4,
          "plan: micro-batches per step streamed through the pipeline (train: --grad-accum)");
ABSL_FLAG(std::string, pp_schedule, "1f1b", "pipeline schedule: gpipe, 1f1b, interleaved or zb");
ABSL_FLAG(int, virtual_stages, 1, "model chunks per pipeline rank (interleaved schedule)");
ABSL_FLAG(std::string, trace, "", "plan: write the schedule as Chrome trace JSON to this file");
ABSL_FLAG(std::string, pp_partition, "balanced",
          "how layers are cut into pipeline stages: balanced (by FLOPs, head included) or count");
ABSL_FLAG(bool, show_partition, false, "plan: print the pipeline stage partition of --model");
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(int64_t, seq_len);
ABSL_FLAG(double, pp_weight_cost, 1.0,
          "plan: simulated cost of the weight-gradient half of a backward (forward = 1)");

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

int run_plan(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.empty()) << "[plan] unexpected argument '" << (args.empty() ? "" : args[0])
                              << "'";
  if (absl::GetFlag(FLAGS_show_partition)) return show_partition();
  MAMMOTH_CHECK(absl::GetFlag(FLAGS_show_schedule))
      << "[plan] say what to show: mammoth plan --show-schedule --pp 4 --micro-batches 8 "
         "--pp-schedule 1f1b, or mammoth plan --show-partition --model gpt2 --pp 4";
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
    out << pl::chrome_trace_json(schedule, result);
    out.close();
    MAMMOTH_CHECK(out.good()) << "[plan] cannot write --trace file '" << trace << "'";
    std::printf("wrote Chrome trace %s\n", trace.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace mammoth::tools

MAMMOTH_COMMAND(plan,
                "parallel plans: --show-schedule (a pipeline schedule's timeline), "
                "--show-partition (pipeline stages of --model)",
                mammoth::tools::run_plan);
