// Offload traffic of one rank's training step, from a dry run of the chunk manager itself.
//
// The planner cannot run the model, but it knows what the runtime's offload (engine/offload)
// will do with it: the rank's parameters in first-use order, packed into chunks by the same
// function (memory/chunks/layout.h), four lists (parameters, gradients, the two AdamW moments)
// with the homes and budgets the plan gives, and the order in which one step touches them.
// simulate_offload() builds exactly those lists in a real ChunkManager, scaled down to one
// 4 KiB block per chunk (budgets scaled alike, so every placement and slot count is the
// runtime's), and replays the step's accesses:
//   forward      each parameter read where the forward reads it (a tied table at the embedding
//                and again at the head), micro-batch after micro-batch (a span paged whole);
//   backward     those reads in reverse, each followed by its gradient's write (autograd
//                finishes it there, or adds into it);
//   dp           the last micro-batch's gradient chunks read and written back averaged;
//   norm         every gradient read;
//   AdamW        chunk by chunk: parameter written, gradient read, moments written (pieces of a
//                span one at a time), or through the host copies in the host-update flow;
//   end of step  gradients discarded.
// The first step records the trace, the manager's Belady eviction and prefetch run on it from
// the second, and the third step's moves per tier are the answer, scaled back to real bytes.
// Timing is not simulated: a dry NVMe write-back drains at once, so where a real one is still
// draining when a prefetch wants its slot the real run defers that prefetch and moves a little
// more (NVMe states: 6% more bytes in test/plan/offload_traffic_test.sh).
// Steps of many micro-batches are extrapolated from the steps of three and four (every middle
// micro-batch pages the same chunks). Results are cached per layout and budget, so a search
// pays once for each distinct rank.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mammoth::plan {

struct ParallelPlan;

struct OffloadSetup {
  std::vector<int64_t> tensors;  // the rank's parameters, bytes, in the order they are packed
  std::vector<int> uses;         // the forward's reads, by index (empty: each once, in order)
  int64_t largest = 0;           // the largest parameter (chunk sizing; >= every tensor)
  int micro_batches = 1;
  int dp = 1;                    // chunk k's AdamW states live on dp rank k % dp
  std::string offload = "none";  // where AdamW states live: none | host | nvme
  std::string offload_params = "none";
  bool host_update = false;  // the CPU AdamW on host copies (CUDA with offload host|nvme)
  int64_t chunk_bytes = 32ll << 20;
  int64_t device_mem = 0;  // 0: unlimited
  int64_t host_mem = 0;
  int prefetch_depth = 2;
};

struct OffloadPhase {                    // bytes moved per step
  double device_in = 0, device_out = 0;  // host -> device loads, device -> host write-backs
  double nvme_read = 0, nvme_write = 0;
  double device_demand_in = 0;  // of device_in, loads acquire() waited for (not prefetched)
  double device_moves = 0;      // chunk loads and write-backs between device and host
  double total() const { return device_in + device_out + nvme_read + nvme_write; }
};

struct OffloadTraffic {
  OffloadPhase compute;     // forward and backward of every micro-batch (and the dp average)
  OffloadPhase optimizer;   // the norm, AdamW and the end of the step
  int64_t chunk_bytes = 0;  // as the runtime sizes it
  int64_t chunks = 0;       // per list
  bool spans = false;
  std::string error;  // the manager refused the budgets (what the runtime would say at start)
};

OffloadTraffic simulate_offload(const OffloadSetup& setup);

// The dry run's set-up for one pipeline rank of a plan that offloads (ParallelPlan::offloaded(),
// not ZeRO-3's NVMe shards): its chunked parameters from the memory model's prediction for its
// stage (StageMemory::offload_tensors; empty: nothing to run), the plan's budgets, and for
// --device-mem auto the budget the runtime derives from the stage's predicted peak.
struct StageMemory;
OffloadSetup offload_setup(const StageMemory& stage, const ParallelPlan& plan);

OffloadPhase add(const OffloadPhase& a, const OffloadPhase& b);

// "device in 1.2 MiB out 0.6 MiB, nvme read 0 B write 0 B": bytes per step of a phase.
std::string describe(const OffloadPhase& phase);

}  // namespace mammoth::plan
