// Memory per rank and tier that a ParallelPlan needs for a model: what the planner prunes
// with, what `mammoth plan` and `mammoth analyze` show, and what every `train` run prints
// beside the allocator's measured peak.
//
// Per pipeline stage (ranks of one stage are symmetric over dp, tp and sp), the bytes the
// engine's allocator holds at the step's height on the model's device, split into what holds
// them, and the host / NVMe bytes the chunked memory keeps off the device.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "base/json.h"
#include "models/config.h"
#include "plan/parallel_plan.h"

namespace mammoth::plan {

struct StageMemory {
  int64_t params = 0;       // this rank's parameters (tp shard, pipeline stage, ZeRO-3 shard)
  int64_t grads = 0;        // gradients (ZeRO-2/3: the shard plus buckets in flight)
  int64_t optimizer = 0;    // AdamW states (+ fp32 masters), on the device
  int64_t activations = 0;  // saved for backward at the peak (micro-batches in flight)
  int64_t buffers = 0;      // communication buckets, gathered ZeRO-3 parameters, pipeline sends
  int64_t temporaries = 0;  // the largest transient live at the peak (logits, attention)
  // Parameters `mammoth train` holds beyond the plan's share: the single-process model kept
  // beside a tp/sp rank's sharded form (its checkpoint map reads it) and, on a pipeline rank,
  // the other stages' parameters (every rank builds the whole model). A cost of today's
  // runtime, not of the plan: a planner may leave it out (device_peak - model_copy).
  int64_t model_copy = 0;
  int64_t device_peak = 0;    // what the allocator's peak should read (the sum of the above)
  int64_t chunks_device = 0;  // offload: device bytes the chunk manager holds itself, outside
                              // the allocator (parameters, gradients, states homed there)
  int64_t host = 0;           // chunks homed in (pinned) host memory
  int64_t nvme = 0;           // chunks on NVMe
  // Where this rank's model state is homed, per tier (device, host, nvme): the placement table
  // `mammoth train` prints at start-up and `mammoth analyze` shows (placement_table()). Without
  // offload everything is on the device (ZeRO's shares); with offload the chunks' homes as
  // engine/offload and memory/chunks place them (a device budget then also caches chunks
  // homed elsewhere, which these do not count).
  struct Homes {
    int64_t params = 0, grads = 0, optimizer = 0;
    int64_t total() const { return params + grads + optimizer; }
  };
  std::array<Homes, 3> homes;  // indexed by kDeviceTier, kHostTier, kNvmeTier
  // Offload: the rank's parameters, bytes each, in the order the runtime packs them into chunks
  // (first use: tables, blocks, head); plan/offload_traffic's dry run pages them. A block's are
  // its largest parameter and the rest in equal parts, as many as the block has tensors.
  std::vector<int64_t> offload_tensors;
  int64_t offload_largest = 0;    // the largest of them (what sizes a chunk)
  std::vector<int> offload_uses;  // the forward's reads of them, by index (a tied table twice)
  // The peak a runtime that holds only the plan's share would reach (what a planner prunes
  // and ranks with); with offload the device tier also holds chunks_device.
  int64_t planned_peak() const { return device_peak - model_copy; }
};

inline constexpr int kDeviceTier = 0, kHostTier = 1, kNvmeTier = 2;

struct MemoryPrediction {
  std::vector<StageMemory> stages;  // one per pipeline stage (pp entries)
  int64_t device_peak() const;      // the largest stage's
  int64_t planned_peak() const;     // the largest stage's, without the runtime's model copy
  json::Value to_json() const;
  std::string explain() const;  // one line per stage: where the peak's bytes go
};

MemoryPrediction predict_memory(const models::ModelConfig& config, const ParallelPlan& plan);

// The per-tier table of one stage's homes (StageMemory::homes) and the plan's budgets, one line
// per tier: "  device  params 1.2 MiB  grads 1.2 MiB  optimizer 2.4 MiB  total ... budget ...".
std::string placement_table(const StageMemory& stage, const ParallelPlan& plan);

}  // namespace mammoth::plan
