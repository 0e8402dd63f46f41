// The NCCL backend of Communicator, for CUDA tensors (built only where CUDA is enabled; then
// MAMMOTH_WITH_NCCL is defined for dependents).
//
// A group's NCCL communicator is bootstrapped over the MPI communicator of the same ranks: its
// rank 0 creates the ncclUniqueId and broadcasts it with MPI. Each NcclCommunicator owns one
// CUDA stream: an operation first makes that stream wait for the work already queued on the
// caller's current stream (memory::cuda::current_stream(), which produced the input), then
// enqueues the NCCL call and records an event. Work::wait() polls that event against the
// deadline (CommOptions::timeout_s) and then makes the caller's current stream wait for it too.
// On expiry it aborts the NCCL communicator and the job, naming rank, group and operation.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "parallel/comm/communicator.h"
#include "parallel/comm/mpi_communicator.h"

namespace mammoth::parallel {

// Throws mammoth::Error "[what] NCCL error: <ncclGetErrorString>" unless rc is ncclSuccess.
void nccl_check(ncclResult_t rc, const char* what);

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap` (same ranks, same order). Uses CUDA device `device`.
  NcclCommunicator(MpiCommunicator& bootstrap, int device, std::string name);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "nccl"; }
  const CommOptions& options() const override { return options_; }
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  int flight_group() const { return flight_group_; }

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
  // Splits the bootstrap MPI group the same way and builds NCCL over the result.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

 private:
  // Makes stream_ wait for the caller's stream; returns the caller's stream.
  cudaStream_t order_after_caller();
  std::unique_ptr<Work> finish(std::string what, cudaStream_t caller,
                               std::vector<engine::Tensor> keep_alive);

  MpiCommunicator* bootstrap_;
  // Set on communicators made by split(): they own the MPI group they were built over.
  std::unique_ptr<MpiCommunicator> owned_bootstrap_;
  std::string name_;
  CommOptions options_;
  int device_;
  int rank_ = 0;
  int size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* barrier_scratch_ = nullptr;  // one float on the device for barrier()
  int flight_group_ = -1;
};

}  // namespace mammoth::parallel
