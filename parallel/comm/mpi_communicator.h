// The MPI backend of Communicator (CPU tensors), the process-wide MPI runtime, and the helpers
// every backend shares: return-code checks and the deadline that turns a hang into an abort.
//
// Every operation is posted as a non-blocking MPI call (MPI_Iallreduce, MPI_Ireduce_scatter_block,
// ...) and completed by polling MPI_Test until it succeeds or the deadline
// (CommOptions::timeout_s) passes, yielding the core once every CommOptions::spin_polls polls.
// Open MPI makes progress inside MPI_Test, so fast polling is what moves the bytes. A yield does
// not give an oversubscribed machine's cores away (the scheduler hands them straight back to the
// spinning waiters), so a wait that has lasted a millisecond on a machine with more runnable
// threads than cores sleeps between polls instead.
// bench comm (tools/bench/comm_bench.cc) measures the wrapper against the raw blocking calls.
#pragma once

#include <mpi.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/signal_note.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/flight_recorder.h"

namespace mammoth::parallel {

// Exit code of a job aborted because an operation outlived its deadline (as timeout(1) uses).
inline constexpr int kCommTimeoutExitCode = 124;

// MPI for this process: initialised once (MPI_Init_thread, asking for MPI_THREAD_MULTIPLE so a
// progress or prefetch thread may call MPI later) on first use, finalized when the process exits
// (by this singleton's destructor) if this process initialised it. An explicit, documented
// singleton: MPI itself is process-global state. Its errors return to the caller
// (MPI_ERRORS_RETURN) and are thrown as mammoth::Error with MPI_Error_string's text.
class MpiRuntime {
 public:
  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  int thread_level() const { return thread_level_; }  // MPI_THREAD_* that MPI provides
  // User-defined reduction ops for 16-bit floats (MPI has no bf16/f16 types).
  MPI_Op bf16_sum() const { return bf16_sum_; }
  MPI_Op bf16_max() const { return bf16_max_; }
  MPI_Op f16_sum() const { return f16_sum_; }
  MPI_Op f16_max() const { return f16_max_; }

  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;
  ~MpiRuntime();

 private:
  friend MpiRuntime& mpi_runtime();
  MpiRuntime();

  bool initialized_here_ = false;
  int world_rank_ = 0;
  int world_size_ = 1;
  int thread_level_ = 0;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
  MPI_Op bf16_max_ = MPI_OP_NULL;
  MPI_Op f16_sum_ = MPI_OP_NULL;
  MPI_Op f16_max_ = MPI_OP_NULL;
};

// The runtime, initialising MPI on the first call (thread-safe).
MpiRuntime& mpi_runtime();

// Throws mammoth::Error "[what] MPI error: <MPI_Error_string>" when rc != MPI_SUCCESS.
void mpi_check(int rc, const char* what);

// Prints `message` (prefixed with "[comm] ") to stderr and aborts every rank of the job with
// kCommTimeoutExitCode. Used by all backends when a deadline passes.
[[noreturn]] void abort_job_on_timeout(const std::string& message);

// This process's world rank and size when MPI is running (initialised and not finalised), else
// {-1, 0}. Never initialises MPI.
std::pair<int, int> running_world_rank();

// When MPI runs with more than one rank: aborts the whole job with `code`. A rank that failed
// must not wait in MPI_Finalize for peers that wait for it until their deadline. Returns when
// MPI is not running or the job has one rank.
void abort_job_if_distributed(int code);

// Whether more threads are runnable on the machine than this process has cores (the running
// count of /proc/loadavg against the affinity mask). False where /proc cannot be read. A
// container that sees its host's /proc/loadavg compares the host's count with its own cores, so
// its waits may sleep when they need not; beside a spinning thread that cost no collective
// bandwidth (BENCHMARKS.md, "Waits that sleep on an oversubscribed machine").
bool cores_oversubscribed();

// Polls `done` until it returns true, yielding the core once every `options.spin_polls` polls,
// or, once the wait has lasted a millisecond and the cores are oversubscribed, sleeping between
// polls. When options.timeout_s > 0 and it elapses first, calls
// abort_job_on_timeout(describe()). `describe` is called only then, so it may build a string.
template <typename Done, typename Describe>
void poll_with_deadline(Done&& done, const CommOptions& options, Describe&& describe) {
  if (done()) return;
  // A dump written because a signal arrived mid-wait is withdrawn if the wait then completes:
  // only a rank that never got out of its wait has something to say.
  bool dumped = false;
  struct Withdraw {
    bool& dumped;
    ~Withdraw() {
      if (dumped) flight::withdraw_dump();
    }
  } withdraw{dumped};
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const bool bounded = options.timeout_s > 0;
  const auto limit = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(bounded ? options.timeout_s : 0.0));
  const long spin = options.spin_polls > 0 ? options.spin_polls : 1;
  constexpr auto kCheckEvery = std::chrono::milliseconds(1);
  constexpr auto kNap = std::chrono::microseconds(50);
  auto next_check = start + kCheckEvery;
  bool nap = false;
  for (long polls = 1;; ++polls) {
    if (done()) return;
    if (nap) {
      std::this_thread::sleep_for(kNap);
    } else if (polls % spin == 0) {
      std::this_thread::yield();
    }
    // The clock costs ~20 ns; reading it every 16 polls keeps it out of the spin.
    if (nap || (polls & 15) == 0) {
      const auto now = Clock::now();
      if (bounded && now - start > limit) abort_job_on_timeout(describe());
      if (now >= next_check) {
        nap = cores_oversubscribed();
        next_check = now + kCheckEvery;
      }
      // A signal (mpirun's SIGTERM after another rank aborted) while this rank waits: its
      // flight record is what says where it was.
      if (const int sig = take_noted_signal()) {
        dumped = !flight::write_dump("signal " + std::to_string(sig) + " while waiting").empty();
      }
    }
  }
}

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (freed in the destructor unless it is MPI_COMM_WORLD/SELF).
  MpiCommunicator(MPI_Comm comm, std::string name, CommOptions options);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "mpi"; }
  const CommOptions& options() const override { return options_; }
  MPI_Comm comm() const { return comm_; }  // for bootstrapping other backends and benchmarks
  int flight_group() const { return flight_group_; }  // this group's id in the flight recorder
  const std::vector<int>& world_ranks() const { return world_ranks_; }  // of the members

  std::unique_ptr<Work> iall_reduce(const engine::Tensor& in, const engine::Tensor& out,
                                    ReduceOp op) override;
  std::unique_ptr<Work> ireduce_scatter(const engine::Tensor& in, const engine::Tensor& out,
                                        ReduceOp op) override;
  std::unique_ptr<Work> iall_gather(const engine::Tensor& in, const engine::Tensor& out) override;
  std::unique_ptr<Work> ibroadcast(const engine::Tensor& in, const engine::Tensor& out,
                                   int root) override;
  std::unique_ptr<Work> iall_to_all(const engine::Tensor& in, const engine::Tensor& out) override;
  std::unique_ptr<Work> iall_to_all_v(const engine::Tensor& in,
                                      std::span<const int64_t> send_counts,
                                      const engine::Tensor& out,
                                      std::span<const int64_t> recv_counts) override;
  std::unique_ptr<Work> isend(const engine::Tensor& t, int peer, int tag) override;
  std::unique_ptr<Work> irecv(const engine::Tensor& t, int peer, int tag) override;
  std::unique_ptr<Work> ibarrier() override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

  // A typed split for callers that need the MPI handle (the mesh bootstraps NCCL from it).
  std::unique_ptr<MpiCommunicator> split_mpi(int color, int key, const std::string& name);

 private:
  // isend (send = true) or irecv of `t` with `peer` on `tag` (checked: user tags only).
  std::unique_ptr<Work> point_to_point(const engine::Tensor& t, int peer, int tag, bool send);

  MPI_Comm comm_;
  std::string name_;
  CommOptions options_;
  int rank_ = 0;
  int size_ = 1;
  int flight_group_ = -1;
  std::vector<int> world_ranks_;
};

// A communicator over all ranks of the job (a duplicate of MPI_COMM_WORLD named "world"), so its
// traffic never matches messages of code that uses MPI_COMM_WORLD directly.
std::unique_ptr<MpiCommunicator> mpi_world(const CommOptions& options = {});

}  // namespace mammoth::parallel
