// Tensor-parallel serving (`mpirun -np N mammoth serve --tp N`): rank 0 runs the HTTP server and
// the scheduler; every rank holds its tp shard of the model (the family's policy) and a KV pool
// of its own heads. Before each step rank 0 broadcasts the step's inputs over the tp group (its
// token ids and every sequence's block table, start and count); the others run the same
// forward_paged on their shards, whose collectives meet rank 0's. The block tables travel
// whole with every step, so the followers keep no per-sequence state: an admission or a free on
// rank 0 is simply the next step's tables, and a cancelled sequence's blocks are free on every
// rank the moment rank 0 frees them.
//
//   rank 0:  TpLeader leader(mesh.cpu_group(Axis::kTp));
//            Scheduler s(sharded, {.hook = &leader, ...});      // + Server
//   others:  follow_steps(*sharded, &cache, mesh.cpu_group(Axis::kTp));   // until rank 0 stops
//
// Liveness: while idle rank 0 sends a heartbeat every SchedulerOptions::idle_interval, so a
// follower that hears nothing for the group's timeout (--comm-timeout) aborts the job naming the
// wait, as a stalled collective does; a step that fails on any rank ends the job (the others may
// be inside its collectives).
#pragma once

#include "models/model.h"
#include "parallel/comm/communicator.h"
#include "serve/scheduler.h"

namespace mammoth::serve {

// Rank 0's side: the scheduler's StepHook.
class TpLeader final : public StepHook {
 public:
  // `group`: the tp group (CPU tensors), this process its rank 0.
  explicit TpLeader(parallel::Communicator& group);
  void before_step(const std::vector<int64_t>& ids,
                   const std::vector<models::PagedSequence>& seqs) override;
  void idle() override;
  void stopped() override;
  [[noreturn]] void step_failed(const std::string& what) override;

 private:
  parallel::Communicator& group_;
  bool stopped_ = false;
};

// What a follower did, for its exit line.
struct FollowStats {
  int64_t steps = 0, tokens = 0, heartbeats = 0;
};

// The other ranks: runs every step rank 0 broadcasts on `model` (this rank's shard) over
// `cache` until rank 0 stops. Throws on a malformed message; aborts the job (naming the wait)
// when rank 0 is silent for longer than the group's timeout.
FollowStats follow_steps(models::LanguageModel& model, models::PagedKVCache* cache,
                         parallel::Communicator& group);

}  // namespace mammoth::serve
