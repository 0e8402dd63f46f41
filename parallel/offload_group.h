// The data-parallel group of chunked offload (engine/offload's ChunkGroup) over a Communicator:
// engine/ cannot depend on parallel/, so `mammoth train` wraps its dp communicator in this and
// hands it to engine::offload::Offload, which then averages gradient chunks, shards the AdamW
// states by chunk and broadcasts updated parameter chunks through it (ZeRO-Offload style).
#pragma once

#include "engine/offload/offload.h"
#include "parallel/comm/communicator.h"

namespace mammoth::parallel {

class OffloadGroup final : public engine::offload::ChunkGroup {
 public:
  explicit OffloadGroup(Communicator& comm) : comm_(comm) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  std::function<void()> start_average(const engine::Tensor& flat) override;
  void broadcast(const engine::Tensor& flat, int root) override { comm_.broadcast(flat, root); }
  std::function<void()> start_broadcast(const engine::Tensor& flat, int root) override;
  double average(double value) override;
  void barrier() override { comm_.barrier(); }

 private:
  Communicator& comm_;
};

}  // namespace mammoth::parallel
