// Communicator: the one interface through which every byte crosses a process in Mammoth.
//
// A Communicator is a group of ranks (the world, or one axis of a DeviceMesh such as "dp") with
// the collectives data, tensor, sequence and pipeline parallelism need. Two backends implement
// it: MPI for CPU tensors (parallel/comm/mpi_communicator.h; also the bootstrap of everything)
// and NCCL for CUDA tensors (parallel/comm/nccl_communicator.h). Code above this layer (DP,
// ZeRO, TP layers) is written against this interface only and is given its groups explicitly.
//
//   auto world = parallel::mpi_world(parallel::CommOptions{.timeout_s = 60});
//   world->all_reduce(grad, parallel::ReduceOp::kAvg);            // in place, blocking
//   auto work = world->iall_reduce(bucket, bucket, ReduceOp::kSum);  // async: overlap with compute
//   ...                                                             // more backward
//   work->wait();
//
// Buffer rules (the same as NCCL's, so the two backends are interchangeable):
//   - tensors are contiguous; inputs and outputs have the same dtype and device;
//   - all_reduce / broadcast: in.numel() == out.numel(); in and out may be the same tensor;
//   - reduce_scatter: in holds size() * n elements, out holds n. In place means out is this
//     rank's shard of in, i.e. in.slice(0, rank()*n, (rank()+1)*n) on a flat tensor;
//   - all_gather: in holds n, out holds size() * n, rank r's block at [r*n, (r+1)*n). In place
//     means in is this rank's block of out;
//   - all_to_all: in and out hold size() * n; block j of in goes to rank j, block i of out came
//     from rank i; in == out is allowed;
//   - all_to_all_v: counts in elements, one per rank (size() of them, zeros allowed). in holds
//     sum(send_counts): its block j (send_counts[j] elements, after blocks 0..j-1) goes to rank
//     j; out holds sum(recv_counts), block i from rank i. recv_counts[i] must equal rank i's
//     send_counts[rank()] (exchange the counts first, with all_to_all); in and out are distinct.
//     Every rank calls it, also one whose counts are all zero.
// Every rank of a group must call the same collectives in the same order with matching sizes.
//
// Every operation has a deadline (CommOptions::timeout_s, the `--comm-timeout` flag of the
// tools): a call that has not completed by then prints which rank, group and operation stalled
// and aborts the whole job with a non-zero exit code, so a hang is never silent. Invalid
// arguments (wrong dtype, device, shape) throw mammoth::Error before anything is posted.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "engine/tensor.h"

namespace mammoth::parallel {

enum class ReduceOp { kSum, kAvg, kMax };

const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max"

// Tags of isend/irecv lie in [0, kReservedTag): backends may build collectives from
// point-to-point messages on that tag (MPI guarantees tags up to at least 32767).
inline constexpr int kReservedTag = 32000;

// Settings of a communicator (tools map their flags onto this; the library reads no flags).
struct CommOptions {
  // Seconds an operation may take before the job is aborted (`--comm-timeout`). <= 0: no limit.
  double timeout_s = 600.0;
  // While waiting, yield the core once every this many polls. MPI makes progress (copies the
  // next fragment) inside each poll, so polls must come fast for bandwidth. (On a machine with
  // more runnable threads than cores a long wait sleeps between polls instead: mpi_communicator.h.)
  int spin_polls = 200;
};

// An operation in flight. wait() returns when it has completed (the output is valid and the
// input may be reused); test() says whether it has, without blocking. Both are idempotent.
// Destroying an unfinished Work waits for it, since the buffers must outlive the operation.
// A Work must not outlive the communicator that started it.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};

// A Work that is already complete (size-1 groups, empty tensors).
class CompletedWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The group's name for messages: "world", "dp", "tp", "world/split(1)", ...
  virtual const std::string& name() const = 0;
  virtual const char* backend() const = 0;  // "mpi" or "nccl"
  virtual const CommOptions& options() const = 0;

  // ---- asynchronous operations (the primitives a backend implements) ----
  virtual std::unique_ptr<Work> iall_reduce(const engine::Tensor& in, const engine::Tensor& out,
                                            ReduceOp op) = 0;
  virtual std::unique_ptr<Work> ireduce_scatter(const engine::Tensor& in, const engine::Tensor& out,
                                                ReduceOp op) = 0;
  virtual std::unique_ptr<Work> iall_gather(const engine::Tensor& in,
                                            const engine::Tensor& out) = 0;
  // On `root` in is sent; on every other rank it is ignored and out receives it. in == out is
  // the usual in-place form.
  virtual std::unique_ptr<Work> ibroadcast(const engine::Tensor& in, const engine::Tensor& out,
                                           int root) = 0;
  virtual std::unique_ptr<Work> iall_to_all(const engine::Tensor& in,
                                            const engine::Tensor& out) = 0;
  virtual std::unique_ptr<Work> iall_to_all_v(const engine::Tensor& in,
                                              std::span<const int64_t> send_counts,
                                              const engine::Tensor& out,
                                              std::span<const int64_t> recv_counts) = 0;
  virtual std::unique_ptr<Work> isend(const engine::Tensor& t, int peer, int tag = 0) = 0;
  virtual std::unique_ptr<Work> irecv(const engine::Tensor& t, int peer, int tag = 0) = 0;
  virtual std::unique_ptr<Work> ibarrier() = 0;

  // A new communicator of the ranks that pass the same `color`, ordered by (key, rank); its
  // name is `name`. Collective over this group. color < 0: this rank joins no group and gets
  // nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // ---- blocking forms (start + wait) ----
  void all_reduce(const engine::Tensor& t, ReduceOp op = ReduceOp::kSum) {
    iall_reduce(t, t, op)->wait();
  }
  void all_reduce(const engine::Tensor& in, const engine::Tensor& out,
                  ReduceOp op = ReduceOp::kSum) {
    iall_reduce(in, out, op)->wait();
  }
  void reduce_scatter(const engine::Tensor& in, const engine::Tensor& out,
                      ReduceOp op = ReduceOp::kSum) {
    ireduce_scatter(in, out, op)->wait();
  }
  void all_gather(const engine::Tensor& in, const engine::Tensor& out) {
    iall_gather(in, out)->wait();
  }
  void broadcast(const engine::Tensor& t, int root) { ibroadcast(t, t, root)->wait(); }
  void broadcast(const engine::Tensor& in, const engine::Tensor& out, int root) {
    ibroadcast(in, out, root)->wait();
  }
  void all_to_all(const engine::Tensor& in, const engine::Tensor& out) {
    iall_to_all(in, out)->wait();
  }
  void all_to_all_v(const engine::Tensor& in, std::span<const int64_t> send_counts,
                    const engine::Tensor& out, std::span<const int64_t> recv_counts) {
    iall_to_all_v(in, send_counts, out, recv_counts)->wait();
  }
  void send(const engine::Tensor& t, int peer, int tag = 0) { isend(t, peer, tag)->wait(); }
  void recv(const engine::Tensor& t, int peer, int tag = 0) { irecv(t, peer, tag)->wait(); }
  void barrier() { ibarrier()->wait(); }
};

}  // namespace mammoth::parallel
