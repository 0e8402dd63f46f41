// The planner's search: the fastest valid plans for a model on a cluster, a world size, a
// global batch and a sequence length, ranked by predicted step time.
//
// Every factorisation of the world into dp x pp x tp x sp, each sequence mode the mesh allows,
// every micro-batch size that divides the per-dp-rank batch (accumulation makes up the rest),
// recompute none or every block; under each of those "cores", every pipeline schedule and
// model-chunk count, ZeRO stage 0-3 and offload none / host / nvme. A plan survives when
// plan::check() accepts it and plan::predict_memory() fits the cluster's device memory (and the
// host and NVMe shares of a rank); the survivors' step times come from TimeModel.
//
// Branch and bound: a core's compute lower bound (TimeModel::compute_lower_bound, which holds
// for every plan under it) orders the cores, and once it exceeds the K-th best time found, no
// remaining core can place a plan in the top K, so the search stops. Ties are broken by device
// memory, then by the plan's fields in a fixed order, so the output depends on nothing but the
// inputs. No external solver.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/json.h"
#include "models/config.h"
#include "plan/cluster.h"
#include "plan/memory_model.h"
#include "plan/parallel_plan.h"
#include "plan/time_model.h"

namespace mammoth::plan {

struct SearchOptions {
  int world = 1;
  int64_t global_batch = 1;  // sequences per step
  int64_t seq_len = 1024;
  int top_k = 5;
  std::string amp = "bf16";
  std::string device = "cuda";
  // The search's choices (empty: all).
  std::vector<std::string> schedules = {"1f1b", "interleaved", "zb", "gpipe"};
  std::vector<int> zero_stages = {0, 1, 2, 3};
  std::vector<std::string> offloads = {"none", "host", "nvme"};
  int max_virtual_stages = 8;
  int64_t max_micro_batch = 64;
  // Refuse plans that plan::check() says the runtime cannot run on `device` yet (tp / pp over
  // NCCL...). false: such plans are ranked with the reason in RankedPlan::note, so a cluster
  // can be planned for before every path is wired up.
  bool runnable_only = false;
  bool check_memory = true;
  // Count what today's `mammoth train` holds beyond the plan's share (MemoryPrediction's
  // model_copy: the single-process model beside tp shards, every stage's parameters on a
  // pipeline rank). true for plans to be run here; false ranks plans by what they need, as a
  // runtime that builds only its shard would (the published-configuration checks).
  bool count_model_copy = true;
  // false: evaluate every valid plan (brute force; what the tests compare against).
  bool branch_and_bound = true;
  TimeOptions time;
};

struct RankedPlan {
  ParallelPlan plan;
  TimePrediction time;
  MemoryPrediction memory;
  std::string note;  // why `mammoth train` cannot run it on the device yet ("" when it can)
  json::Value to_json() const;
};

struct SearchResult {
  std::vector<RankedPlan> plans;  // best first, at most top_k
  int64_t cores = 0;              // (mesh, sp mode, micro-batch, recompute) combinations
  int64_t cores_bounded = 0;      // not expanded: their bound could not beat the top K
  int64_t cores_refused = 0;      // not expanded: plan::check() refuses their least demanding plan
  int64_t cores_over_memory = 0;  // not expanded: their least memory-hungry plan does not fit
  int64_t candidates = 0;         // plans considered under expanded cores
  int64_t invalid = 0;            // refused by plan::check()
  int64_t over_memory = 0;        // refused by the memory model
  int64_t evaluated = 0;          // step time predicted
  double seconds = 0;             // wall time of the search
  double cpu_seconds = 0;         // its processor time (one thread)
  json::Value to_json() const;
};

SearchResult search(const models::ModelConfig& config, const Cluster& cluster,
                    const SearchOptions& options);

// Why `memory` does not fit the cluster ("" when it does): the tier, the need and the size.
std::string memory_misfit(const MemoryPrediction& memory, const Cluster& cluster,
                          bool count_model_copy = true);

// One line: the fields where `a` differs from `b` and the time parts that differ most, e.g.
// "vs #2 (pp 8 -> 16, mb 2 -> 1): 3.1% faster; pipeline bubble -0.42 s, tp communication +0.1 s".
std::string explain_difference(const RankedPlan& a, const RankedPlan& b, int b_rank);

// The ranked plans as `mammoth plan` prints them: one block per plan, explained.
std::string format_plans(const SearchResult& result, const Cluster& cluster);

}  // namespace mammoth::plan
