// Step time of a ParallelPlan for a model on a cluster, analytically, with a breakdown of where
// the time goes and which limit binds. The planner ranks plans with it; `mammoth plan` prints it.
//
// What it counts, per transformer block (repeated blocks share one cost) and micro-batch, on one
// rank of the bottleneck pipeline stage:
//   compute      GEMM FLOPs from models/analyze (forward; input gradient = forward + the
//                attention core again; weight gradient = the weight GEMMs), split over tp and
//                sp, at peak x the cluster's matmul_efficiency; plus the memory-bound operations
//                (norms, activations, dropout, softmax, residuals) as HBM traffic: twice the
//                activation bytes a block saves (Korthikanti et al. 2022, eq. 1: 34 s b h,
//                plus 5 a s^2 b when attention scores are materialised), each written once and
//                read once, backward twice forward. Recompute repeats the forward in backward.
//   tp / sp      the collectives the sharding policies run (models/policies): tp without a
//                sequence split all-reduces each block's attention and MLP outputs (forward)
//                and input gradients (backward); split_gather all-gathers and reduce-scatters
//                the same bytes; ulysses all-to-alls q, k, v and the attention output; ring
//                passes K and V sp - 1 times behind the attention compute. Ring algorithms,
//                alpha-beta per link level: a group inside a node uses NVLink, else the
//                per-GPU inter-node link. Not overlapped with compute (the runtime does not).
//   ep           expert parallelism (--ep): each MoE block's token exchanges, 4 all_to_all_v
//                per micro-batch over the expert group, not overlapped (counted with tp/sp's
//                collectives); a rank holds 1/ep of the experts, whose gradients reduce over
//                dp / ep, and its optimizer walks that share.
//   pipeline     the schedule simulator (parallel/pipeline/schedule.h) fed with the
//                bottleneck rank's forward, input-gradient and weight-gradient costs per
//                micro-batch (stage cut as the plan says), point-to-point activation sends
//                added to forward and backward; the bubble is its makespan minus the work.
//   dp / ZeRO    gradient all-reduce (ZeRO 0), reduce-scatter + parameter all-gather (1, 2),
//                and ZeRO-3's parameter all-gathers per micro-batch forward and backward
//                (prefetched behind compute); overlapped with the last micro-batch's backward.
//   offload      optimizer states on the host: a CPU AdamW at the node's DRAM bandwidth shared
//                by its GPUs. Every move of a chunk (parameters and gradients paged within
//                --device-mem or homed on host / NVMe, states streamed from NVMe, the host-update
//                flow's copies) comes from a dry run of the chunk manager on the rank's chunks
//                (plan/offload_traffic.h), at the PCIe and NVMe rates: the forward and
//                backward's moves behind the compute where the machine overlaps (the loads it
//                waited for always show), the optimizer walk's pipelined with the update.
//   optimizer    AdamW on the device: 32 bytes of HBM traffic per local parameter.
//   per call     on a calibrated machine (plan/calibrate.h: a CPU, where tiny models are
//                thousands of small kernel calls): each engine op of a block costs the measured
//                op overhead forward and backward (the op counts are the model code's), each
//                GEMM the calibrated time for its own shape, attention the measured rate for
//                its head size, and accumulation, the gradient norm and AdamW one call per
//                parameter tensor. The dp reduction of the last gradient bucket is exposed
//                even with overlap (all of it when the gradients fit one bucket).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/json.h"
#include "models/analyze.h"
#include "models/config.h"
#include "plan/cluster.h"
#include "plan/parallel_plan.h"

namespace mammoth::plan {

// How the system that runs the plan behaves, where published systems differ from Mammoth.
struct TimeOptions {
  // Attention never writes its T x T scores to memory (FlashAttention, Mammoth's memory-
  // efficient attention). false: scores, softmax and dropout go through HBM (Megatron-LM 2021).
  bool flash_attention = true;
  // dp/ZeRO collectives run from gradient-ready hooks during the last backward (Mammoth);
  // false: after the backward (Megatron-LM 2021's data-parallel all-reduce).
  bool overlap_dp = true;
  // Pipeline activations travel as 1/tp slices all-gathered on the receiving node
  // (Megatron-LM's scatter/gather optimisation); false: every tp rank sends the whole tensor.
  bool scatter_gather_p2p = true;
  // Simulate the schedule; false: the analytic bubble ((p - 1) / (v m + p - 1) of the work),
  // which is what the search's bound uses.
  bool simulate_pipeline = true;
};

struct TimeBreakdown {   // seconds per step; the parts add up to the step time
  double compute = 0;    // GEMMs and memory-bound operations, recompute included
  double tp_comm = 0;    // exposed tp / sp collectives and ep token exchanges
  double pp_comm = 0;    // pipeline point-to-point sends on the critical path
  double pp_bubble = 0;  // idle time of the bottleneck rank in the schedule
  double dp_comm = 0;    // exposed dp / ZeRO collectives
  double offload = 0;    // chunk moves (dry run) and the CPU update of host / NVMe states
  double optimizer = 0;  // the device AdamW update
  double total() const {
    return compute + tp_comm + pp_comm + pp_bubble + dp_comm + offload + optimizer;
  }
};

struct TimePrediction {
  TimeBreakdown parts;
  double step_time = 0;     // seconds
  double tokens_per_s = 0;  // global batch tokens / step time
  // Training FLOPs per step: model (3 x forward, no recompute; what MFU counts) and hardware
  // (recompute included; what Megatron-LM's "achieved teraFLOP/s per GPU" counts).
  double model_flops = 0;
  double hardware_flops = 0;
  double mfu = 0;             // model FLOPs / (step time x world x peak)
  double hfu = 0;             // hardware FLOPs / (step time x world x peak)
  double tflops_per_gpu = 0;  // hardware FLOP/s per GPU / 1e12
  double bubble_fraction = 0;
  std::string binding;  // the largest part: "compute", "tp communication", ...
  json::Value to_json() const;
  // Several lines: the parts with their shares, the binding limit, the throughput figures.
  std::string explain() const;
};

// Holds the model's analysis and a cache of simulated schedules, so that a search over many
// plans of one model and cluster pays for each distinct schedule once.
class TimeModel {
 public:
  TimeModel(const models::ModelConfig& config, const Cluster& cluster, TimeOptions options = {});
  // The plan must be valid (plan::check) for this model; seq_len comes from the plan.
  TimePrediction predict(const ParallelPlan& plan);
  // A lower bound on predict(plan).step_time for every schedule, chunk count, stage cut, ZeRO
  // stage and offload setting: the average pipeline rank's compute, tp/sp collectives and
  // sends for every micro-batch, with no bubble, dp traffic or optimizer.
  double compute_lower_bound(const ParallelPlan& plan);
  const Cluster& cluster() const { return cluster_; }
  const models::ModelConfig& config() const { return config_; }

 private:
  const models::ModelAnalysis& analysis(int64_t seq_len);
  TimePrediction evaluate(const ParallelPlan& plan, bool bound_only);
  double makespan(const std::string& schedule, int p, int m, int v, double f, double b, double w);
  // The exposed time of the chunk manager's moves under the plan's offload (seconds per step).
  double paging(const ParallelPlan& plan, const TimeBreakdown& parts);

  models::ModelConfig config_;
  Cluster cluster_;
  TimeOptions options_;
  std::map<int64_t, models::ModelAnalysis> analyses_;
  std::map<std::pair<int64_t, int>, std::vector<int64_t>> partitions_;  // (seq, stages) -> cut
  // (schedule, p, m, v, b/f and w/f in 1% steps) -> makespan for f = 1.
  std::map<std::tuple<std::string, int, int, int, int64_t, int64_t>, double> schedules_;
};

TimePrediction predict_time(const models::ModelConfig& config, const ParallelPlan& plan,
                            const Cluster& cluster, const TimeOptions& options = {});

}  // namespace mammoth::plan
