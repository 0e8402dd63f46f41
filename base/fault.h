// Fault injection for tests (never set in production): MAMMOTH_FAULT="KIND@RANK:STEP[:PHASE]"
// makes world rank RANK fail at training step STEP (1-based, as the logs count), at PHASE:
//   KIND   exit0 | exit1 (exit with that status), kill (SIGKILL), stop (SIGSTOP: a stall the
//          process cannot notice), term (SIGTERM), throw (a mammoth::Error, as a kernel
//          raises), stall (sleeps an hour: a rank stuck in compute), delay (sleeps one second, then
//          carries on: a straggler, whose peers' collectives wait for it)
//   PHASE  forward (default: the step's start), backward (a data-parallel bucket's reduction
//          launch; under tp the reduction of an input gradient, under pp a stage's backward),
//          send (a pipeline send), optimizer (before the update), checkpoint (after this rank
//          wrote part of a checkpoint)
// The test matrix (test/engine/train/fault_matrix_test.sh) runs every kind and phase under dp,
// tp, pp and ZeRO-3 (send occurs under pp only). A malformed value is refused by name on first use.
#pragma once

#include <cstdint>

namespace mammoth::fault {

// The training loop says which rank this is and which step runs.
void set_context(int world_rank, int64_t step);

// Acts when MAMMOTH_FAULT names this rank, the current step and `phase`; otherwise a load and
// a compare (the variable is read once).
void point(const char* phase);

}  // namespace mammoth::fault
