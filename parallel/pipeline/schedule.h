// Pipeline schedules as data: per-rank ordered lists of actions, a checker that simulates them,
// and printers (a text timeline and a Chrome trace).
//
// A model is cut into S = p * v virtual stages (p ranks, v model chunks per rank). Following
// Megatron's interleaved layout, chunk c of rank r is virtual stage s = c * p + r, so
// activations go round the ring of ranks v times. Each micro-batch m passes every virtual stage
// forward (F) and then backward. The backward is one action B, or, in a split (zero-bubble)
// schedule, B = input gradient only (what the previous stage waits for) and W = weight
// gradient (which nobody waits for, so it can fill the bubbles).
//
// Communication is implied by the actions: F(m, s) sends its output to the rank of s + 1 and
// B(m, s) sends the input gradient to the rank of s - 1; sends never block (isend), so a
// schedule's only waits are on its inputs. The dependencies are
//   F(m, s) after F(m, s - 1);
//   B(m, s) after F(m, s) and B(m, s + 1);
//   W(m, s) after B(m, s).
// A rank runs its list in order. check_schedule() simulates that with given costs and
// reports either a deadlock (no rank can start its next action) or the timeline, its makespan
// and its bubble fraction (the share of rank-time spent idle).
//
//   auto s = parallel::pipeline::make_schedule(ScheduleKind::k1F1B, {.stages = 4, .micro_batches =
//   8}); auto r = parallel::pipeline::check_schedule(s);      // r.ok, r.bubble == 3/11 std::cout
//   << parallel::pipeline::timeline_text(s, r);
#pragma once

#include <string>
#include <vector>

namespace mammoth::parallel::pipeline {

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved, kZeroBubble };

// "gpipe", "1f1b", "interleaved", "zb"
const char* schedule_kind_name(ScheduleKind kind);
// Parses the names above; throws naming the bad value and the choices.
ScheduleKind schedule_kind_from_name(const std::string& name);

enum class ActionType { kForward, kBackward, kWeight };

struct Action {
  ActionType type = ActionType::kForward;
  int micro_batch = 0;
  int chunk = 0;  // model chunk on this rank; virtual stage chunk * stages + rank
  bool operator==(const Action& o) const {
    return type == o.type && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

// "F3", "B0", "W7"; with chunks "F3.1" (micro-batch 3, chunk 1).
std::string action_str(const Action& a, bool with_chunk);

struct ScheduleOptions {
  int stages = 2;          // p: pipeline ranks
  int micro_batches = 4;   // m
  int virtual_stages = 1;  // v: model chunks per rank (interleaved only; others need 1)
};

struct Schedule {
  std::string name;  // schedule_kind_name of the generator, or the caller's
  int stages = 1;
  int micro_batches = 1;
  int virtual_stages = 1;
  bool split_backward = false;             // B is input-grad only and W actions exist
  std::vector<std::vector<Action>> ranks;  // ranks[r]: rank r's actions in execution order

  int num_virtual_stages() const { return stages * virtual_stages; }
  int virtual_stage(int rank, int chunk) const { return chunk * stages + rank; }
  int rank_of(int virtual_stage) const { return virtual_stage % stages; }
  int chunk_of(int virtual_stage) const { return virtual_stage / stages; }
};

// Builds a schedule. Throws naming the option for impossible requests (p, m < 1; v > 1 on a
// non-interleaved schedule).
//   GPipe: all forwards, then all backwards.
//   1F1B: p - r - 1 warm-up forwards, then alternate one forward / one backward, then drain.
//   Interleaved 1F1B (Megatron): micro-batches in groups of p run chunk 0, then chunk 1, ...;
//     warm-up (p - r - 1) * 2 + (v - 1) * p forwards.
//   Zero bubble (ZB-H1 style): backward split into B and W; the order is found by list
//     scheduling with unit costs: a free rank runs a ready B first, else a forward if fewer
//     than p - r micro-batches are in flight (1F1B's activation memory), else a deferred W.
Schedule make_schedule(ScheduleKind kind, const ScheduleOptions& options);

// Unit costs of the simulation. A whole (unsplit) backward costs backward + weight; in a split
// schedule B costs `backward` and W costs `weight`. Costs are per virtual stage of a
// non-interleaved pipeline; a chunk of an interleaved one costs 1/v of them (same total work).
struct CostModel {
  double forward = 1.0;
  double backward = 1.0;  // input-gradient part
  double weight = 1.0;    // weight-gradient part
};

struct TimedAction {
  Action action;
  double start = 0;
  double end = 0;
};

struct CheckResult {
  bool ok = false;
  std::string error;  // why not ok: malformed schedule or deadlock (with each rank's blocker)
  bool deadlock = false;
  std::vector<std::vector<TimedAction>> timeline;  // per rank, in execution order
  double makespan = 0;
  double busy = 0;    // sum of action costs over all ranks
  double bubble = 0;  // 1 - busy / (stages * makespan)
  // Largest number of micro-batch activations a rank holds at once (F done, B not yet), per
  // rank, counting each (micro-batch, chunk) pair once.
  std::vector<int> peak_in_flight;
};

// Checks that every rank holds exactly the actions it must (each F and B, and W iff split,
// once per micro-batch and chunk, W after its B) and simulates the schedule.
CheckResult check_schedule(const Schedule& schedule, const CostModel& costs = {});

// Analytic bubble fraction of 1F1B / GPipe: (p - 1) / (m + p - 1).
double analytic_bubble_1f1b(int stages, int micro_batches);
// Interleaved 1F1B with v chunks: (p - 1) / (v m + p - 1).
double analytic_bubble_interleaved(int stages, int micro_batches, int virtual_stages);

// One row per rank, one cell per time slot of the smallest cost: "F3" forward of micro-batch
// 3, "B3" backward, "W3" weight gradient, "." idle; then the makespan and bubble.
std::string timeline_text(const Schedule& schedule, const CheckResult& result);
// Chrome trace event JSON (opens in Perfetto / chrome://tracing): one thread per rank, one
// complete event per action, a time unit drawn as `unit_us` microseconds.
std::string chrome_trace_json(const Schedule& schedule, const CheckResult& result,
                              double unit_us = 1000.0);

}  // namespace mammoth::parallel::pipeline
