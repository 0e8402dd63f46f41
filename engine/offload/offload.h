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
// CPU backend only for now (the device budget is emulated with host memory); CUDA parameters
// are rejected with a clear error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/module.h"
#include "engine/optim/optim.h"
#include "engine/train/trainer.h"
#include "memory/chunks/chunk_manager.h"

namespace mammoth::engine::offload {

enum class Mode { kNone, kHost, kNvme };
Mode parse_mode(const std::string& text);  // "none" | "host" | "nvme"; Error naming --offload
const char* mode_name(Mode mode);

struct OffloadOptions {
  Mode mode = Mode::kNone;
  int64_t device_mem = 0;  // bytes; 0: unlimited
  int64_t host_mem = 0;    // bytes; 0: unlimited
  std::string nvme_dir;
  int64_t chunk_bytes = 32ll << 20;  // raised to the largest parameter when smaller
  memory::io::AsyncIOOptions io;
  int prefetch_depth = 2;
};

class Offload final : public train::OffloadRuntime {
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
  };
  enum List { kParams = 0, kGrads = 1, kExpAvg = 2, kExpAvgSq = 3, kNumLists = 4 };

  Tensor view(List list, size_t i) const;  // param i's bytes in `list` as a tensor
  void on_grad_ready(size_t i);

  OffloadOptions options_;
  nn::NamedTensors params_;  // unique parameters, in chunk order
  std::vector<Slot> slots_;
  std::unique_ptr<memory::chunks::ChunkManager> manager_;
  std::vector<memory::chunks::ChunkId> ids_[kNumLists];       // per list: chunk k's id
  std::vector<std::shared_ptr<Storage>> storages_[kNumLists];  // per list: chunk k's storage
  std::vector<Tensor> grad_views_;
  std::unique_ptr<ChunkedAdamW> optimizer_;
  int64_t state_bytes_ = 0;
  int64_t requested_chunk_bytes_ = 0;
};

}  // namespace mammoth::engine::offload
