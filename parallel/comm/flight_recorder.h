// The flight recorder: every rank keeps a ring of its last communication operations (per group:
// sequence number, op, peer, bytes, posted / completed times), so that when a job hangs the
// dumps say which rank fell behind and what each rank was doing.
//
// Backends record into it (posted() when an operation is started, completed() when it is
// done); the deadline path (abort_job_on_timeout) and a signal seen while waiting write the
// ring to $MAMMOTH_FLIGHT_DIR/rank_R.json (train sets that to SAVE_DIR/flight), or print its
// tail to stderr when no directory is set. The signal comes through base/signal_note.h. `mammoth
// flight DIR` merges the dumps (tools/flight_report.h).
//
// Collectives are numbered per group in the order they are posted; every member posts the same
// sequence, so a member whose last posted number is below the others' fell behind. Point-to-
// point operations are numbered apart (per group) and name their peer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mammoth::parallel::flight {

// One group as a member sees it; registered once per communicator.
struct GroupInfo {
  std::string name;     // "world", "dp", "tp", ...
  std::string backend;  // "mpi", "nccl"
  int rank = 0;         // this process's rank in the group
  int size = 1;
  std::vector<int> world_ranks;  // the members' world ranks (empty when unknown)
};

// Returns the group's id for posted().
int register_group(GroupInfo info);

// This process's world rank and size (the MPI runtime sets them), for the dump's file name.
void set_world(int rank, int size);

// Records an operation started on `group`: `op` is its short name ("all_reduce", "send"),
// `what` its description ("all_reduce(sum, f32, 1024 elements)"), `peer` the group rank of a
// point-to-point peer (-1 for collectives). Returns a token for completed().
uint64_t posted(int group, const char* op, const char* what, int peer, int64_t bytes);
void completed(uint64_t token);

// The ring as JSON: {"rank", "world", "host", "pid", "reason", "wall_at_epoch_us",
// "groups": [...], "entries": [... oldest first]}.
std::string dump_json(const std::string& reason);

// Writes dump_json(reason) to $MAMMOTH_FLIGHT_DIR/rank_R.json; returns the path, or "" when
// the variable is unset (or the write failed: that is printed, never thrown).
std::string write_dump(const std::string& reason);

// Removes the file write_dump() wrote last, if any (a wait that completed after all).
void withdraw_dump();

// The last `n` entries as text lines, for stderr.
std::string tail_text(int n);

// Forgets every entry and group (tests).
void reset_for_testing();

}  // namespace mammoth::parallel::flight
