// A cluster description: what the planner's time and memory models know about the machines a
// plan runs on. Read from JSON (plan/clusters/*.json ships published configurations, each
// sourced in plan/clusters/README.md):
//
//   {
//     "name": "dgx_a100_80gb",
//     "description": "...",
//     "devices_per_node": 8, "nodes": 560,
//     "peak_tflops": {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312},
//     "matmul_efficiency": 0.7, "matmul_efficiency_source": "...",
//     "memory_gib": {"device": 80, "host": 2048, "nvme": 30720},   // device: per GPU; host and
//                                                                  // nvme: per node
//     "device_memory_GBps": 2039, "host_memory_GBps": 409.6,      // per GPU / per node
//     "links": {                                                   // per GPU, one direction
//       "intra_node": {"GBps": 300, "latency_us": 2},
//       "inter_node": {"GBps": 25, "latency_us": 5},
//       "pcie": {"GBps": 32, "latency_us": 5},
//       "nvme": {"GBps": 30, "latency_us": 100}                    // per node
//     }
//   }
//
// Units in the struct are SI base units (FLOP/s, bytes, bytes/s, seconds); the file uses the
// units its spec sheets quote (TFLOP/s, GiB of memory, GB/s of bandwidth, microseconds).
// Every key is required except "description", "matmul_efficiency_source" and the measured
// per-call costs below; unknown keys are refused by name, so a misspelt bandwidth never silently
// takes a default.
//
// A calibrated machine (`mammoth plan --calibrate`, plan/calibrate.h) adds what dominates tiny
// models on a CPU, where a step is thousands of small kernel calls rather than a few large GEMMs:
//     "op_overhead_us": 2.1,        // one engine op's dispatch, graph record and allocation
//     "broadcast_op_ns_per_element": 1.5,  // an op whose operand broadcasts, forward + backward
//     "gemm_call_us": 4.0,          // one GEMM call beyond its FLOPs at the sustained rate
//     "gemm_time_model": {"ns_per_flop": 0.02, "ns_per_flop_times_k": 0.3,
//                         "ns_per_flop_times_mn": 0.4, "call_us": 3,
//                         "tile_rows": 6, "tile_cols": 64},
//                                   // an M x N x K GEMM takes 2M'N'K (a + b / K + c / min(M, N))
//                                   // + call, M' and N' being M and N rounded up to the
//                                   // micro-kernel's register tile (default 1: no rounding): a
//                                   // short reduction (K) pays its output's traffic, a thin
//                                   // output (M, N) its operand packing, a ragged one the
//                                   // tile's unused lanes; replaces gemm_call_us and
//                                   // matmul_efficiency for the time
//     "attention_GFLOPs": 9.5,      // the fused attention kernel's rate (0: at the GEMM rate)
//     "attention_GFLOPs_by_head_dim": [[16, 4.2], [32, 8.0], ...],  // the same by head size
//     "in_step_compute_factor": 1.2,  // default 1; the GEMM fit's and attention rates' times
//                                   // inside a training step over their times in a loop
//     "overlaps_communication": false,  // default true; false: collectives never run behind
//                                   // compute (one CPU thread per rank: MPI progresses only
//                                   // inside MPI calls), so dp / ZeRO traffic is all exposed
//     "calibration": {...}          // what was measured, how (kept, not read)
// Published clusters leave them out (0): there the kernels are large and launches overlap.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/json.h"

namespace mammoth::plan {

struct Link {
  double bandwidth = 0;  // bytes/s, one direction, per GPU (nvme: per node)
  double latency = 0;    // seconds per message (one ring step)
};

struct Cluster {
  std::string name;
  std::string description;
  int devices_per_node = 1;
  int nodes = 1;
  // Dense peak FLOP/s per GPU for each compute dtype (tensor cores where they apply).
  double peak_fp32 = 0, peak_tf32 = 0, peak_bf16 = 0, peak_fp16 = 0;
  // The one fitted constant of the time model: the share of peak that the transformer's GEMMs
  // sustain inside a training step. Everything else (bandwidths, memory) is a spec-sheet figure.
  double matmul_efficiency = 0;
  std::string matmul_efficiency_source;
  int64_t device_memory = 0;           // bytes per GPU
  int64_t host_memory = 0;             // bytes per node
  int64_t nvme_capacity = 0;           // bytes per node
  double device_memory_bandwidth = 0;  // bytes/s per GPU (HBM)
  double host_memory_bandwidth = 0;    // bytes/s per node (DRAM, all sockets)
  Link intra_node, inter_node, pcie, nvme;
  // Measured per-call costs (seconds; 0 when not calibrated) and the attention kernel's rate.
  double op_overhead = 0;
  // Seconds per element of an engine op whose operand broadcasts (x [..., n] by s [..., 1]:
  // ring attention's block merge), forward and backward; its backward reduces over the
  // broadcast dim. 0: at the plain op's bandwidth.
  double broadcast_op_per_element = 0;
  double gemm_call_overhead = 0;
  double attention_rate = 0;  // FLOP/s
  struct GemmTimeModel {      // seconds per FLOP, per FLOP x K, per FLOP x min(M, N); per call
    double per_flop = 0, per_flop_k = 0, per_flop_mn = 0, call = 0;
    int tile_rows = 1, tile_cols = 1;  // FLOPs are counted over M and N rounded up to these
    bool calibrated() const { return per_flop > 0; }
    // 2 M N K with M and N rounded up to the tile.
    double padded_flops(double m, double n, double k) const;
  } gemm;
  // (head size, FLOP/s) rising in head size; empty when not calibrated.
  std::vector<std::pair<double, double>> attention_rates;
  // The calibrated GEMM fit and attention rates time each kernel in a loop of its own; inside a
  // training step the same kernels find their operands displaced by the step's other ops and
  // take this many times as long (fitted from whole steps; 1 when not calibrated).
  double in_step_compute = 1;
  bool overlaps_communication = true;
  json::Value calibration;  // null unless calibrated: the measurements behind the figures

  int world() const { return devices_per_node * nodes; }
  // Peak FLOP/s for a plan's amp setting: fp32 (no autocast) -> tf32 tensor cores when the
  // device has them (what cuBLAS uses for fp32 GEMMs with TF32 enabled), else fp32.
  double peak_for(const std::string& amp) const;
  // Seconds of one M x N x K GEMM (0 FLOPs: 0): gemm_time_model when calibrated, else at
  // peak x matmul_efficiency plus the per-call cost.
  double gemm_time(double m, double n, double k, const std::string& amp) const;
  // Seconds of attention FLOPs at head size `head_dim` (attention_rates, attention_rate, or the
  // GEMM rate).
  double attention_time(double flops, double head_dim, const std::string& amp) const;
};

// Unknown keys and missing or mistyped values are errors naming the key and `what`.
Cluster cluster_from_json(const json::Value& value, const std::string& what = "cluster");
json::Value cluster_to_json(const Cluster& cluster);
// A path to a JSON file, or the name of a shipped file (plan/clusters/NAME.json), looked up
// under $MAMMOTH_CLUSTER_DIR, ./plan/clusters, the binary's Bazel runfiles and the test's
// runfiles ($TEST_SRCDIR).
Cluster load_cluster(const std::string& path_or_name);
// Names of the shipped clusters ("dgx_a100_80gb", "h100_cluster", "h200_node").
std::vector<std::string> shipped_cluster_names();

}  // namespace mammoth::plan
