// Offload: training with parameters, gradients and AdamW states in chunks (memory/chunks), the
// engine side of `mammoth train --offload=none|host|nvme --device-mem X --host-mem Y`.
//
// Construction packs the parameters, in order, into fixed-size chunks and re-points each
// parameter's storage at its chunk (the way parallel/data_parallel moves parameters into flat
// buckets). Gradients and the two AdamW moments get mirror chunks with the same layout, so
// parameter chunk k, gradient chunk k and state chunks k hold the same parameters and one
// update touches exactly four chunks. Every chunk storage carries the residency hook of
// engine/tensor.h, so any kernel launch pages the chunk in; gradients are copied into their
// chunk when autograd finishes them (grad-ready hooks), and the optimizer walks the chunks in
// order, the manager prefetching the next ones (NVMe reads included) while it updates these.
//
// Modes (where the AdamW moments live):
//   none: beside the parameters (device when everything fits --device-mem, else paged via host)
//   host: host memory, updated there by the CPU AdamW kernel
//   nvme: files under --nvme-dir (io_uring, checksummed), streamed through host staging slots
// Parameters and gradients are paged device <-> host whenever --device-mem is smaller than
// what is computed on the device. Results are bitwise those of the plain AdamW: the same
// kernel runs on the same per-parameter slices; only where the bytes wait in between differs.
//
// Data parallelism (ZeRO-Offload style), when OffloadOptions::group has more than one rank:
// every rank keeps all parameter and gradient chunks, but chunk k is *owned* by dp rank
// k % size, and only the owner has AdamW state chunks for it (so optimizer-state memory per
// rank is ~1/size). During the last micro-batch's backward each gradient chunk, once all its
// parameters' gradients are final, is copied into one of kCommBuffers host buffers and averaged
// over the group asynchronously (one all-reduce per chunk, issued in a fixed order: last chunk
// first, as backward finishes them) while backward continues; finish_backward() waits for the
// rest and copies the averages back into the gradient chunks on every rank (so the global norm,
// and with it fp16's skip decision, is computed identically everywhere, in the model's order, as
// parallel::DataParallel's stage 0 does). Each rank then updates only its chunks, walking the
// chunks in order: a chunk's broadcast from its owner starts as soon as its update is done
// (through the same bounded host buffers), overlapping the rest of the walk, and after_step()
// waits for the last ones and copies the received chunks in. Offload is then also
// the loop's DataParallelRuntime (data_parallel()); parallel::DataParallel must not manage the
// same parameters (it would move them into its own buckets). The group is an interface here
// because engine/ does not depend on parallel/: parallel/offload_group.h implements it over a
// Communicator. Sharded checkpoints: the owner of a chunk writes its parameters and AdamW
// states as whole single-process tensors, so they resume at any dp, with or without offload.
//
// Chunk order: parameters are packed in OffloadOptions::use_order (the order a forward pass
// first touches them, recorded by first_use_order()), or in the model's order when it is empty;
// the norm and checkpoints still walk them in the model's order.
//
// The device. On the CPU backend the device budget is emulated with host memory. With CUDA
// parameters the manager's device tier is that GPU (ChunkManagerOptions::device): device-homed
// chunks and device cache slots are GPU memory, host homes pinned memory, and moves run on the
// manager's copy stream, ordered against the compute stream by events (chunk_manager.h). Kernels
// read chunks where they are; AdamW runs where the mode puts the moments:
//   none: every list is computed on the device, the AdamW kernel runs there on the same slices
//         as optim::AdamW does (paging changes no number).
//   host|nvme (the host-update flow; also on the CPU backend with OffloadOptions::host_update):
//         the parameter and gradient lists are computed on the device but homed on the host only
//         (the device caches them; with no --device-mem every chunk gets a slot). The optimizer
//         walk runs the CPU AdamW on host bytes, per chunk k:
//           1. gradient chunk k: ChunkManager::acquire_home(read) writes a dirty device copy
//              back (on the copy stream, after the compute stream's backward kernels, via an
//              event) and the host waits for that one copy; the device copy stays, clean;
//           2. parameter chunk k: acquire_home(write) writes back a dirty device copy (e.g. the
//              values the constructor moved in), then drops the device copy;
//           3. the moments (host-computed lists: host home, or an NVMe staging slot);
//           4. the CPU AdamW updates the host parameter copy in place.
//         The next forward's acquire() (prefetched from end_step on, in the traced order) loads
//         the updated parameter chunks back; gradients are discarded at end_step, so nothing
//         moves them back. Numbers: the CPU AdamW, not the device's (on CUDA the results agree
//         to rounding; on the CPU backend they are bitwise those of the plain loop).
// Not yet on CUDA: data parallelism (the dp group's buffers are host tensors) and --device-mem
// auto (its traced peak is the CPU allocator's); both are refused with a clear error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/module.h"
#include "engine/offload/ordered_reducer.h"
#include "engine/optim/optim.h"
#include "engine/train/trainer.h"
#include "memory/chunks/chunk_manager.h"

namespace mammoth::engine::offload {

enum class Mode { kNone, kHost, kNvme };
Mode parse_mode(const std::string& text);  // "none" | "host" | "nvme"; Error naming --offload
const char* mode_name(Mode mode);

// The data-parallel group as Offload needs it (parallel/offload_group.h implements it).
class ChunkGroup {
 public:
  virtual ~ChunkGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Starts averaging the contiguous `flat` over the group in place; the result waits for it.
  virtual std::function<void()> start_average(const Tensor& flat) = 0;
  virtual void broadcast(const Tensor& flat, int root) = 0;  // blocking, in place
  // Starts broadcasting `flat` from `root` in place; the result waits for it.
  virtual std::function<void()> start_broadcast(const Tensor& flat, int root) = 0;
  virtual double average(double value) = 0;
  virtual void barrier() = 0;
};

// Per tier ("device", "host", "nvme") the chunk manager's accounting (budget, homes, peak,
// reserved, moves, stall): the metrics' view of any chunk manager (Offload's, ZeRO-3's shards).
json::Value tier_stats_json(const memory::chunks::ChunkManager& manager);

// The unique parameters' names in the order `forward` first touches them (a kernel launch
// reading or writing their storage), then those it never touched in the model's order. Runs
// `forward` once (the caller makes it cheap: one short sequence, no gradients).
std::vector<std::string> first_use_order(const nn::NamedTensors& params,
                                         const std::function<void()>& forward);

// Bytes of parameters + gradients + AdamW states of `params` (each unique tensor once): what an
// unconstrained fp32 run holds, and what Offload::model_state_bytes() reports, computed without
// allocating anything.
int64_t model_state_bytes(const nn::NamedTensors& params);

struct OffloadOptions {
  Mode mode = Mode::kNone;  // --offload-optimizer (alias --offload): the AdamW states' home
  // --offload-params: the home of the parameter and gradient chunks. none: the device when they
  // fit --device-mem, else host; host: host memory; nvme: files under nvme_dir, read straight
  // into the device cache (the CPU backend's emulated device; CUDA pages through host only).
  Mode params = Mode::kNone;
  int64_t device_mem = 0;  // bytes; 0: unlimited
  int64_t host_mem = 0;    // bytes; 0: unlimited
  std::string nvme_dir;
  // A parameter larger than a chunk spans several (one process on the CPU backend; see
  // "Spans" in offload.cc); under dp or on CUDA chunks are raised to the largest parameter.
  int64_t chunk_bytes = 32ll << 20;
  memory::io::AsyncIOOptions io;
  int prefetch_depth = 2;
  // Packing order (parameter names; see first_use_order); empty: the model's order.
  std::vector<std::string> use_order;
  // Data parallelism over this group (not owned); null or size 1: one process.
  ChunkGroup* group = nullptr;
  // --device-mem auto:SIZE: the device holds SIZE bytes (on the CPU backend an emulated size;
  // device_mem must be 0). The first step runs with the smallest device cache one update needs;
  // at its end the peak of everything else (activations, temporaries: the CPU allocator's
  // high-water mark for the step) plus a margin of kAutoMarginDivisor-th of it is taken off SIZE
  // and the chunks get the rest from step 2 on (ChunkManager::set_device_budget).
  int64_t auto_device_size = 0;
  // With mode host|nvme, the host-update flow (see "The device" above) on the CPU backend too,
  // so tests prove it without a GPU; CUDA parameters always use it for host|nvme.
  bool host_update = false;
};

inline constexpr int64_t kAutoMarginDivisor = 8;  // margin = traced peak / 8

class Offload final : public train::OffloadRuntime, public train::DataParallelRuntime {
 public:
  Offload(const nn::NamedTensors& params, const OffloadOptions& options);
  // Gives the parameters ordinary storage again (values kept; gradients dropped).
  ~Offload() override;
  Offload(const Offload&) = delete;
  Offload& operator=(const Offload&) = delete;

  optim::Optimizer& optimizer(const optim::AdamWOptions& options) override;
  void end_step() override;
  nn::NamedTensors gather_state() override;
  void scatter_state(const nn::NamedTensors& full) override;
  json::Value metrics() const override;
  train::DataParallelRuntime* data_parallel() override { return dp_ ? this : nullptr; }

  // ---- DataParallelRuntime (only with a group of more than one rank) ----
  int dp_rank() const override { return rank_; }
  int dp_size() const override { return world_; }
  void begin_backward(bool sync) override;
  void finish_backward() override;
  const nn::NamedTensors& optimizer_params() const override { return params_; }
  bool decays(const std::string& name) const override;
  double grad_norm() override;
  void after_step() override;
  double average(double value) override;
  void barrier() override;
  std::vector<train::CheckpointPiece> checkpoint_pieces(const nn::NamedTensors& state,
                                                        const std::vector<std::string>& suffixes,
                                                        bool writing) override;
  void pieces_loaded() override;

  // The dp rank that owns chunk k (updates it and holds its AdamW states).
  int owner(int chunk) const { return chunk % world_; }
  int num_chunks() const { return static_cast<int>(ids_[kParams].size()); }
  // Chunk of each parameter, in the model's order (tests assert the packing).
  std::vector<int> chunk_of_params() const;
  // Bytes this rank holds for parameters, gradients and AdamW states (the chunks' used bytes).
  struct MemoryReport {
    int64_t params = 0, grads = 0, optimizer = 0;
  };
  MemoryReport memory() const;
  // Gradient buffers in flight at once under dp (each a chunk of host memory).
  static constexpr int kCommBuffers = 4;
  // --device-mem auto: what the first step measured and the budget chosen (0 before).
  struct AutoBudget {
    int64_t device_size = 0, traced_peak = 0, margin = 0, chunk_budget = 0;
  };
  const AutoBudget& auto_budget() const { return auto_; }

  // Layout and placement, then the per-tier table (the job prints it at start and end).
  std::string report() const;
  memory::chunks::ChunkManager& manager() { return *manager_; }
  const memory::chunks::ChunkManager& manager() const { return *manager_; }
  // Bytes of parameters + gradients + AdamW states (what an unconstrained run holds).
  int64_t model_state_bytes() const { return state_bytes_; }

 private:
  class ChunkedAdamW;
  struct Slot {
    int chunk = 0;       // index into the per-list chunk vectors
    int64_t offset = 0;  // bytes into the chunk
    int pieces = 1;      // > 1: the parameter spans chunks chunk .. chunk + pieces - 1
  };
  enum List { kParams = 0, kGrads = 1, kExpAvg = 2, kExpAvgSq = 3, kNumLists = 4, kNone = -1 };

  Tensor view(List list, size_t i) const;  // param i's bytes in `list` as a tensor
  // Piece j of spanning param i in `list`: the flat elements it holds in chunk slot.chunk + j.
  Tensor piece(List list, size_t i, int j) const;
  void on_grad_ready(size_t i);
  bool owns(size_t i) const { return owner(slots_[i].chunk) == rank_; }
  // Chunk k's used bytes as a flat tensor at `base`.
  Tensor flat(int chunk, void* base) const;
  OrderedReducer::Op launch_average(int chunk);
  std::function<void()> receive(int chunk, List into, Tensor buffer, std::function<void()> wait);
  void publish(int chunk);
  Tensor take_buffer();

  OffloadOptions options_;
  nn::NamedTensors params_;  // unique parameters, in chunk order
  std::vector<Slot> slots_;
  std::unique_ptr<memory::chunks::ChunkManager> manager_;
  std::vector<memory::chunks::ChunkId> ids_[kNumLists];        // per list: chunk k's id
  std::vector<std::shared_ptr<Storage>> storages_[kNumLists];  // per list: chunk k's storage
  // Per list and parameter: a spanning parameter's storage over all its pieces (else null),
  // paged in by ChunkManager::acquire_span.
  std::vector<std::shared_ptr<Storage>> span_storages_[kNumLists];
  std::vector<Tensor> grad_views_;
  std::unique_ptr<ChunkedAdamW> optimizer_;
  int64_t state_bytes_ = 0;
  int64_t requested_chunk_bytes_ = 0;
  std::vector<int64_t> chunk_used_;                 // per chunk: bytes used
  std::vector<std::vector<size_t>> chunk_members_;  // per chunk: its parameters, model order
  AutoBudget auto_;
  bool use_ordered_ = false;
  Device device_ = Device::cpu();  // where the parameters (and the device tier) are
  bool host_update_ = false;       // the CPU AdamW on host copies (see "The device")

  // Data parallelism.
  ChunkGroup* dp_ = nullptr;
  int rank_ = 0, world_ = 1;
  DType dtype_ = DType::kF32;
  bool sync_ = false;
  std::vector<int> chunk_params_;  // per chunk: how many parameters it holds
  std::vector<bool> param_ready_;  // per parameter, this backward
  // Chunk averages in the fixed order (last chunk first), at most kCommBuffers in flight, and
  // the owners' broadcasts after the update under the same bound (shared with DataParallel).
  std::unique_ptr<OrderedReducer> reducer_;
  std::vector<Tensor> free_buffers_;
  nn::NamedTensors loading_;  // checkpoint pieces being loaded, copied in by pieces_loaded()
};

}  // namespace mammoth::engine::offload
