// NCCL backend of Communicator (see nccl_communicator.h). Compiled only in CUDA builds.
#include "parallel/comm/nccl_communicator.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "base/error.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/device.h"
#include "parallel/comm/buffer_checks.h"

namespace mammoth::parallel {
namespace {

using engine::Tensor;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kF64:
      return ncclFloat64;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kI64:
      return ncclInt64;
    case DType::kU8:
    case DType::kBool:
      return ncclUint8;
  }
  MAMMOTH_THROW() << "[nccl_type] unknown dtype " << static_cast<int>(dtype);
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

// An enqueued NCCL operation: an event on the communicator's stream after it.
class NcclWork final : public Work {
 public:
  NcclWork(const NcclCommunicator& comm, std::string what, cudaStream_t caller,
           std::vector<Tensor> keep_alive)
      : comm_(comm.comm()),
        name_(comm.name()),
        rank_(comm.rank()),
        size_(comm.size()),
        options_(comm.options()),
        what_(std::move(what)),
        caller_(caller),
        keep_alive_(std::move(keep_alive)) {
    CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(event_, comm.stream()));
    // what_ is "op(...)"; point-to-point ones name their peer: "send(to 3, ...)".
    const std::string op = what_.substr(0, what_.find('('));
    int peer = -1;
    if (op == "send") std::sscanf(what_.c_str(), "send(to %d", &peer);
    if (op == "recv") std::sscanf(what_.c_str(), "recv(from %d", &peer);
    int64_t bytes = 0;
    for (const Tensor& t : keep_alive_) {
      bytes = std::max<int64_t>(bytes, static_cast<int64_t>(t.nbytes()));
    }
    flight_ = flight::posted(comm.flight_group(), op.c_str(), what_.c_str(), peer, bytes);
  }
  ~NcclWork() override {
    if (!done_) {
      try {
        wait();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[comm] %s\n", e.what());
      }
    }
    if (event_) cudaEventDestroy(event_);
  }

  bool test() override {
    if (done_) return true;
    const cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) {
      ncclResult_t async = ncclSuccess;
      nccl_check(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      nccl_check(async, what_.c_str());
      return false;
    }
    CUDA_CHECK(rc);
    done_ = true;
    flight::completed(flight_);
    // Work the caller queues later on its stream must see the output.
    CUDA_CHECK(cudaStreamWaitEvent(caller_, event_, 0));
    keep_alive_.clear();
    return true;
  }

  void wait() override {
    poll_with_deadline(
        [this] { return test(); }, options_,
        [this] {
          ncclCommAbort(comm_);  // unblocks the device before the job goes down
          char buf[64];
          std::snprintf(buf, sizeof(buf), "%g", options_.timeout_s);
          return "rank " + std::to_string(rank_) + " (world rank " +
                 std::to_string(mpi_runtime().world_rank()) + "): " + what_ + " on group '" +
                 name_ + "' (nccl, " + std::to_string(size_) + " ranks) did not complete within " +
                 buf +
                 " s (--comm-timeout); another rank of the group stalled or called a different "
                 "operation. Aborting the job.";
        });
  }

 private:
  ncclComm_t comm_;
  std::string name_;
  int rank_;
  int size_;
  CommOptions options_;
  std::string what_;
  cudaStream_t caller_;
  std::vector<Tensor> keep_alive_;
  cudaEvent_t event_ = nullptr;
  uint64_t flight_ = 0;
  bool done_ = false;
};

}  // namespace

void nccl_check(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return;
  MAMMOTH_THROW() << "[" << what << "] NCCL error: " << ncclGetErrorString(rc);
}

NcclCommunicator::NcclCommunicator(MpiCommunicator& bootstrap, int device, std::string name)
    : bootstrap_(&bootstrap),
      name_(std::move(name)),
      options_(bootstrap.options()),
      device_(device),
      rank_(bootstrap.rank()),
      size_(bootstrap.size()) {
  memory::cuda::DeviceGuard guard(device_);
  ncclUniqueId id{};
  if (rank_ == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  // The id travels as bytes over the MPI group of the same ranks (with its deadline).
  Tensor bytes =
      Tensor::from_blob(&id, {static_cast<int64_t>(sizeof(id))}, DType::kU8, Device::cpu(), [] {});
  bootstrap.broadcast(bytes, 0);
  nccl_check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  CUDA_CHECK(cudaMalloc(&barrier_scratch_, sizeof(float)));
  flight_group_ = flight::register_group({.name = name_,
                                          .backend = "nccl",
                                          .rank = rank_,
                                          .size = size_,
                                          .world_ranks = bootstrap.world_ranks()});
}

NcclCommunicator::~NcclCommunicator() {
  if (stream_) cudaStreamSynchronize(stream_);
  if (comm_) ncclCommDestroy(comm_);
  if (stream_) cudaStreamDestroy(stream_);
  if (barrier_scratch_) cudaFree(barrier_scratch_);
}

cudaStream_t NcclCommunicator::order_after_caller() {
  CUDA_CHECK(cudaSetDevice(device_));
  cudaStream_t caller = memory::cuda::current_stream();
  cudaEvent_t ready = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  CUDA_CHECK(cudaEventRecord(ready, caller));
  CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
  CUDA_CHECK(cudaEventDestroy(ready));  // destruction is deferred until the wait completes
  return caller;
}

std::unique_ptr<Work> NcclCommunicator::finish(std::string what, cudaStream_t caller,
                                               std::vector<Tensor> keep_alive) {
  return std::make_unique<NcclWork>(*this, std::move(what), caller, std::move(keep_alive));
}

std::unique_ptr<Work> NcclCommunicator::iall_reduce(const Tensor& in, const Tensor& out,
                                                    ReduceOp op) {
  constexpr const char* kOp = "all_reduce";
  detail::check_tensor(in, "in", kOp, *this, DeviceType::kCUDA);
  detail::check_tensor(out, "out", kOp, *this, DeviceType::kCUDA);
  detail::check_same_kind(in, out, kOp, *this);
  detail::check_reduce_dtype(op, in.dtype(), kOp, *this);
  MAMMOTH_CHECK(in.numel() == out.numel()) << detail::where(kOp, *this) << ": in has " << in.numel()
                                           << " elements but out has " << out.numel();
  if (in.numel() == 0) return std::make_unique<CompletedWork>();
  cudaStream_t caller = order_after_caller();
  nccl_check(ncclAllReduce(in.raw_data(), out.raw_data(), static_cast<size_t>(in.numel()),
                           nccl_type(in.dtype()), nccl_op(op), comm_, stream_),
             "ncclAllReduce");
  return finish(detail::describe_op(kOp, reduce_op_name(op), in), caller, {in, out});
}

std::unique_ptr<Work> NcclCommunicator::ireduce_scatter(const Tensor& in, const Tensor& out,
                                                        ReduceOp op) {
  constexpr const char* kOp = "reduce_scatter";
  detail::check_tensor(in, "in", kOp, *this, DeviceType::kCUDA);
  detail::check_tensor(out, "out", kOp, *this, DeviceType::kCUDA);
  detail::check_same_kind(in, out, kOp, *this);
  detail::check_reduce_dtype(op, in.dtype(), kOp, *this);
  MAMMOTH_CHECK(in.numel() == out.numel() * size_)
      << detail::where(kOp, *this) << ": in must hold size (" << size_ << ") x out (" << out.numel()
      << ") elements, got " << in.numel();
  if (out.numel() == 0) return std::make_unique<CompletedWork>();
  cudaStream_t caller = order_after_caller();
  nccl_check(ncclReduceScatter(in.raw_data(), out.raw_data(), static_cast<size_t>(out.numel()),
                               nccl_type(in.dtype()), nccl_op(op), comm_, stream_),
             "ncclReduceScatter");
  return finish(detail::describe_op(kOp, reduce_op_name(op), in), caller, {in, out});
}

std::unique_ptr<Work> NcclCommunicator::iall_gather(const Tensor& in, const Tensor& out) {
  constexpr const char* kOp = "all_gather";
  detail::check_tensor(in, "in", kOp, *this, DeviceType::kCUDA);
  detail::check_tensor(out, "out", kOp, *this, DeviceType::kCUDA);
  detail::check_same_kind(in, out, kOp, *this);
  MAMMOTH_CHECK(out.numel() == in.numel() * size_)
      << detail::where(kOp, *this) << ": out must hold size (" << size_ << ") x in (" << in.numel()
      << ") elements, got " << out.numel();
  if (in.numel() == 0) return std::make_unique<CompletedWork>();
  cudaStream_t caller = order_after_caller();
  nccl_check(ncclAllGather(in.raw_data(), out.raw_data(), static_cast<size_t>(in.numel()),
                           nccl_type(in.dtype()), comm_, stream_),
             "ncclAllGather");
  return finish(detail::describe_op(kOp, "", in), caller, {in, out});
}

std::unique_ptr<Work> NcclCommunicator::ibroadcast(const Tensor& in, const Tensor& out, int root) {
  constexpr const char* kOp = "broadcast";
  detail::check_tensor(out, "out", kOp, *this, DeviceType::kCUDA);
  detail::check_peer(root, kOp, *this);
  if (rank_ == root) {
    detail::check_tensor(in, "in", kOp, *this, DeviceType::kCUDA);
    detail::check_same_kind(in, out, kOp, *this);
    MAMMOTH_CHECK(in.numel() == out.numel())
        << detail::where(kOp, *this) << ": in has " << in.numel() << " elements but out has "
        << out.numel();
  }
  if (out.numel() == 0) return std::make_unique<CompletedWork>();
  cudaStream_t caller = order_after_caller();
  const void* send = rank_ == root ? in.raw_data() : out.raw_data();
  nccl_check(ncclBroadcast(send, out.raw_data(), static_cast<size_t>(out.numel()),
                           nccl_type(out.dtype()), root, comm_, stream_),
             "ncclBroadcast");
  std::vector<Tensor> keep{out};
  if (rank_ == root) keep.push_back(in);
  return finish(detail::describe_op(kOp, ("root " + std::to_string(root)).c_str(), out), caller,
                std::move(keep));
}

std::unique_ptr<Work> NcclCommunicator::iall_to_all(const Tensor& in, const Tensor& out) {
  constexpr const char* kOp = "all_to_all";
  detail::check_tensor(in, "in", kOp, *this, DeviceType::kCUDA);
  detail::check_tensor(out, "out", kOp, *this, DeviceType::kCUDA);
  detail::check_same_kind(in, out, kOp, *this);
  MAMMOTH_CHECK(in.numel() == out.numel() && in.numel() % size_ == 0)
      << detail::where(kOp, *this) << ": in (" << in.numel() << ") and out (" << out.numel()
      << ") must hold the same multiple of the group size " << size_;
  if (in.numel() == 0) return std::make_unique<CompletedWork>();
  // In place sends from a copy, as the MPI backend does (NCCL's grouped send/recv would race).
  const Tensor send = in.raw_data() == out.raw_data() ? in.clone() : in;
  cudaStream_t caller = order_after_caller();
  const size_t block = static_cast<size_t>(in.numel() / size_);
  const size_t block_bytes = block * dtype_size(in.dtype());
  const ncclDataType_t type = nccl_type(in.dtype());
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int peer = 0; peer < size_; ++peer) {
    nccl_check(ncclSend(static_cast<const char*>(send.raw_data()) + peer * block_bytes, block, type,
                        peer, comm_, stream_),
               "ncclSend");
    nccl_check(ncclRecv(static_cast<char*>(out.raw_data()) + peer * block_bytes, block, type, peer,
                        comm_, stream_),
               "ncclRecv");
  }
  nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  return finish(detail::describe_op(kOp, "", in), caller, {send, out});
}

std::unique_ptr<Work> NcclCommunicator::iall_to_all_v(const Tensor& in,
                                                      std::span<const int64_t> send_counts,
                                                      const Tensor& out,
                                                      std::span<const int64_t> recv_counts) {
  constexpr const char* kOp = "all_to_all_v";
  detail::check_tensor(in, "in", kOp, *this, DeviceType::kCUDA);
  detail::check_tensor(out, "out", kOp, *this, DeviceType::kCUDA);
  detail::check_same_kind(in, out, kOp, *this);
  detail::check_v_counts(in, send_counts, out, recv_counts, kOp, *this);
  cudaStream_t caller = order_after_caller();
  const size_t elem = dtype_size(in.dtype());
  const ncclDataType_t type = nccl_type(in.dtype());
  const char* const src = static_cast<const char*>(in.raw_data());
  char* const dst = static_cast<char*>(out.raw_data());
  // Point-to-point pairs need no agreement beyond the counts, so a zero count posts nothing and
  // a rank with nothing to exchange enqueues only the completion event.
  size_t send_offset = 0, recv_offset = 0;
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int peer = 0; peer < size_; ++peer) {
    const size_t sc = static_cast<size_t>(send_counts[peer]);
    const size_t rc = static_cast<size_t>(recv_counts[peer]);
    if (sc) {
      nccl_check(ncclSend(src + send_offset * elem, sc, type, peer, comm_, stream_), "ncclSend");
    }
    if (rc) {
      nccl_check(ncclRecv(dst + recv_offset * elem, rc, type, peer, comm_, stream_), "ncclRecv");
    }
    send_offset += sc;
    recv_offset += rc;
  }
  nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  return finish(detail::describe_op(kOp, "", in.numel() >= out.numel() ? in : out), caller,
                {in, out});
}

std::unique_ptr<Work> NcclCommunicator::isend(const Tensor& t, int peer, int tag) {
  constexpr const char* kOp = "send";
  detail::check_tensor(t, "tensor", kOp, *this, DeviceType::kCUDA);
  detail::check_peer(peer, kOp, *this);
  MAMMOTH_CHECK(tag == 0) << detail::where(kOp, *this)
                          << ": NCCL point-to-point has no tags; got tag " << tag;
  cudaStream_t caller = order_after_caller();
  nccl_check(ncclSend(t.raw_data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), peer,
                      comm_, stream_),
             "ncclSend");
  return finish(detail::describe_op(kOp, ("to " + std::to_string(peer)).c_str(), t), caller, {t});
}

std::unique_ptr<Work> NcclCommunicator::irecv(const Tensor& t, int peer, int tag) {
  constexpr const char* kOp = "recv";
  detail::check_tensor(t, "tensor", kOp, *this, DeviceType::kCUDA);
  detail::check_peer(peer, kOp, *this);
  MAMMOTH_CHECK(tag == 0) << detail::where(kOp, *this)
                          << ": NCCL point-to-point has no tags; got tag " << tag;
  cudaStream_t caller = order_after_caller();
  nccl_check(ncclRecv(t.raw_data(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), peer,
                      comm_, stream_),
             "ncclRecv");
  return finish(detail::describe_op(kOp, ("from " + std::to_string(peer)).c_str(), t), caller, {t});
}

std::unique_ptr<Work> NcclCommunicator::ibarrier() {
  // NCCL has no barrier: a one-element all-reduce completes only when every rank has joined.
  cudaStream_t caller = order_after_caller();
  nccl_check(
      ncclAllReduce(barrier_scratch_, barrier_scratch_, 1, ncclFloat32, ncclSum, comm_, stream_),
      "ncclAllReduce");
  return finish("barrier()", caller, {});
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, const std::string& name) {
  std::unique_ptr<MpiCommunicator> sub = bootstrap_->split_mpi(color, key, name);
  if (!sub) return nullptr;
  auto child = std::make_unique<NcclCommunicator>(*sub, device_, name);
  child->owned_bootstrap_ = std::move(sub);
  return child;
}

}  // namespace mammoth::parallel
