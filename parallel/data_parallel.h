// Data parallelism with ZeRO stages 0-3 over the dp group, on gradient buckets.
//
// Parameters are grouped into buckets of about `bucket_mb` in reverse registration order (the
// order backward produces their gradients) and each bucket's parameters are moved into one
// flat buffer, so the model's tensors become views of it. During the backward of the last
// micro-batch of a step, a bucket is reduced as soon as all its gradients are final
// (gradient-ready hooks): its gradients are copied into a flat gradient buffer, the
// parameters' own gradients are dropped, and an asynchronous all-reduce (stage 0, 1) or
// reduce-scatter (stage 2, 3) is started while backward continues. Earlier micro-batches
// accumulate locally with no communication.
//
//   stage 0: every rank keeps full gradients and optimizer states (plain DP).
//   stage 1: gradients are all-reduced; each rank updates only its shard of every bucket, so
//            optimizer states are 1/N; the updated shards are all-gathered after the step.
//   stage 2: as stage 1, but gradients are reduce-scattered: each rank keeps only its shard.
//            A bucket's full-size gradient buffer lives only while its reduce-scatter runs,
//            and at most kMaxInFlight of them at once (posting another waits for the oldest),
//            so a rank's gradient memory is its shards plus two buckets plus the gradients of
//            buckets not yet complete.
//   stage 3: as stage 2, and the parameters live as shards too: a bucket's full buffer is
//            all-gathered when a kernel first touches it (the Storage residency hook, called
//            by every kernel launch) and at most options.resident_buckets stay gathered
//            (least recently used evicted; all dropped after the optimizer step). Every rank
//            of the group must make the same launches in the same order (the gathers are
//            collective): a launch reads all its weights even when it has no rows for one
//            (models/mixtral's grouped GEMMs over experts that got no tokens).
//
// Under stages 2 and 3 a bucket is at most 1/kMinShardedBuckets of the model (below
// `bucket_mb` for small models): the buckets in flight and gathered are the part of a rank's
// memory that sharding does not divide, so one bucket holding the whole model would leave
// nothing saved.
//
// Overlap is observable: with set_tracing(true) every synchronised backward records, in order,
// each parameter's gradient becoming final, each bucket's collective being posted and each
// being complete (trace()), which tests read to prove that communication starts before the
// backward has finished.
//
// Rank r's shard of a bucket of P (padded to a multiple of N) elements is [r P/N, (r+1) P/N).
// The optimizer is built over optimizer_params(): the full parameters (stage 0) or views of the
// shard slices of them (stages 1, 2), named "<param>[a:b]".
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/module.h"
#include "engine/offload/ordered_reducer.h"
#include "engine/train/distributed.h"
#include "memory/chunks/chunk_manager.h"
#include "parallel/comm/communicator.h"

namespace mammoth::parallel {

struct DataParallelOptions {
  int zero_stage = 0;
  double bucket_mb = 25.0;
  // Stage 3 (`train --zero 3 --offload-params nvme`): the parameter shards, this rank's part of
  // every bucket, are chunks (memory/chunks) homed in files under this directory and paged
  // into a device cache of shard_device_mem bytes (0: a slot per shard) through host staging
  // of shard_host_mem bytes (0: unlimited) as kernels, gathers and the optimizer touch them.
  // Empty: the shards are ordinary device tensors.
  std::string shard_nvme_dir;
  int64_t shard_device_mem = 0;
  int64_t shard_host_mem = 0;
  // Stage 3: full buckets kept gathered at once (least recently used evicted beyond them). At
  // least the most distinct buckets one kernel reads: a launch makes every input resident
  // before it takes their addresses, so a bucket evicted by a later input of the same launch
  // would be read freed. A weight and a bias: 2; a grouped GEMM over L experts' weights
  // (models/mixtral): L.
  int resident_buckets = 2;
};

// One event of a synchronised backward (DataParallel::trace()).
struct DpTraceEvent {
  enum Kind {
    kGradReady,  // index: the parameter (in the order given) whose gradient became final
    kPost,       // index: the bucket whose collective was posted
    kComplete,   // index: the bucket whose collective was found complete
  };
  Kind kind;
  int index;
  bool operator==(const DpTraceEvent&) const = default;
};

class DataParallel final : public engine::train::DataParallelRuntime {
 public:
  DataParallel(const engine::nn::NamedTensors& params, Communicator& dp,
               const DataParallelOptions& options);
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Makes every replica start from rank 0's parameters.
  void broadcast_parameters();

  // Before each micro-batch's backward; sync = true for the last micro-batch of a step.
  void begin_backward(bool sync) override;
  // After the synchronised backward: waits for every bucket. Then the gradients of
  // optimizer_params() hold the dp average; under stages 1 and 2 the parameters' own
  // gradients (this rank's local sums) are dropped.
  void finish_backward() override;
  // The tensors this rank's optimizer updates, and which of them take weight decay
  // (decided on the original parameter's shape: matrices only).
  const engine::nn::NamedTensors& optimizer_params() const override { return opt_params_; }
  bool decays(const std::string& optimizer_param_name) const override;
  // L2 norm of the averaged gradient over all parameters (collective). It is also the
  // found-inf flag: an inf/NaN in any rank's gradient makes it non-finite on every rank, so
  // all ranks skip an overflowed step together (tested in data_parallel_test).
  double grad_norm() override;
  // Sum of squares of the averaged gradient over the parameters whose (original) name passes
  // `include` (all when empty), summed over the dp group (collective): the building block of a
  // norm that spans other groups too (pipeline stages).
  double grad_sq_sum(const std::function<bool(const std::string&)>& include = {});
  // After the optimizer step: all-gathers the updated shards (stages 1, 2); stage 3 drops the
  // stale full buckets.
  void after_step() override;
  // Stages 2, 3: full-size gradient buffers alive at once (reductions in flight).
  static constexpr int kMaxInFlight = 2;
  // Stages 2, 3: the fewest buckets a model is cut into (when it has that many parameters).
  static constexpr int kMinShardedBuckets = 16;
  // Before a bucket's gradients are copied for its reduction: `sync(param)` is called for each
  // of its parameters that has a gradient, in bucket order, the same on every rank (a
  // model-parallel sum of sequence-partial gradients over tp/sp, which would otherwise have to
  // wait for the whole backward). It may replace the parameter's gradient.
  bool set_grad_sync(GradSync sync) override {
    grad_sync_ = std::move(sync);
    return true;
  }
  // Records the events of every synchronised backward (cleared when one begins).
  void set_tracing(bool on) { tracing_ = on; }
  const std::vector<DpTraceEvent>& trace() const { return trace_; }
  int dp_rank() const override { return dp_.rank(); }
  int dp_size() const override { return dp_.size(); }
  double average(double value) override;
  void barrier() override { dp_.barrier(); }

  // Sharded checkpoints: parameters whole from dp rank 0 under stages 0-2 (replicated), this
  // rank's shard segments under stage 3; optimizer state whole from rank 0 under stage 0,
  // segments under stages >= 1. Loading asks for everything this rank holds.
  std::vector<engine::train::CheckpointPiece> checkpoint_pieces(
      const engine::nn::NamedTensors& state, const std::vector<std::string>& suffixes,
      bool writing) override;
  void pieces_loaded() override;

  // Bytes this rank holds for parameters, gradients and (AdamW: 2 states) optimizer states.
  struct MemoryReport {
    int64_t params = 0, grads = 0, optimizer = 0;
  };
  MemoryReport memory(int optimizer_states_per_param = 2) const;
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Stage 3 with shard_nvme_dir: the chunk manager holding the shards (per-tier stats); null
  // otherwise.
  const memory::chunks::ChunkManager* shard_chunks() const { return shard_chunks_.get(); }
  int64_t largest_bucket_bytes() const;

 private:
  struct Bucket {
    std::vector<int> params;       // indices into params_
    std::vector<int64_t> offsets;  // element offset of each param in the bucket
    int64_t padded = 0;            // elements, a multiple of the dp size
    engine::Tensor flat_params;    // [padded]; the parameters are views of it
    engine::Tensor flat_grads;     // [padded]; under stages 2, 3 only while its reduction runs
    engine::Tensor shard_grads;    // stages 2, 3: [padded / N], this rank's averaged shard
    engine::Tensor shard_params;   // stage 3: [padded / N], this rank's parameters (home)
    bool resident = true;          // stage 3: flat_params holds gathered data
    uint64_t last_use = 0;
    std::unique_ptr<Work> work;
  };
  void on_grad_ready(int bucket);
  void make_resident(size_t bucket);
  void release(size_t bucket);
  void pin_all();
  void unpin_all(bool refresh_shards);
  engine::offload::OrderedReducer::Op launch(int bucket);
  void record(DpTraceEvent::Kind kind, int index) {
    if (tracing_) trace_.push_back({kind, index});
  }
  engine::Tensor shard_of(const engine::Tensor& flat) const;
  void page_shards(int64_t chunk_bytes);

  engine::nn::NamedTensors params_;
  Communicator& dp_;
  DataParallelOptions options_;
  // Where the parameters, buckets and the scalars crossing dp_ live (the CPU with MPI; a CUDA
  // device with an NCCL group).
  Device device_ = Device::cpu();
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;  // per param
  // Readiness, fixed-order launch, bounded in flight, completion (shared with Offload).
  std::unique_ptr<engine::offload::OrderedReducer> reducer_;
  bool sync_ = false;
  bool pinned_ = false;
  uint64_t use_clock_ = 0;
  engine::nn::NamedTensors opt_params_;
  std::vector<bool> opt_decay_;
  std::vector<int> opt_source_;      // per optimizer param: its index in params_
  std::vector<int64_t> opt_offset_;  // per optimizer param: its first element in that param
  // Per optimizer param under stages 1/2: (bucket, start within the bucket).
  std::vector<std::pair<int, int64_t>> opt_where_;
  GradSync grad_sync_;
  bool tracing_ = false;
  std::vector<DpTraceEvent> trace_;
  std::unique_ptr<memory::chunks::ChunkManager> shard_chunks_;
  // Checkpoint loading with paged shards: (shard segment, host staging) filled by the loader,
  // copied in by pieces_loaded().
  std::vector<std::pair<engine::Tensor, engine::Tensor>> staged_;
};

}  // namespace mammoth::parallel
