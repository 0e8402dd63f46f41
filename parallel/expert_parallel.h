// Data parallelism for a mixture of experts under expert parallelism (--ep, models/mixtral).
//
// The dp ranks fall into expert groups of `ep` consecutive dp ranks (dp coordinate d is expert
// rank d % ep of group d / ep) that split the experts and exchange tokens; the ranks with the
// same expert rank (d % ep equal: dp / ep of them) hold the same experts and form the
// expert-data-parallel group. As DeepSpeed and Megatron do, expert parallelism is carved out of
// data parallelism rather than added as a mesh axis: every dp rank still reads its own
// micro-batches, so the world, the global batch and the data order are those of plain dp.
//
// Gradients. With W dp ranks each back-propagating loss_r / W (the loop's dp average):
//   - a shared parameter (attention, norms, router, embeddings) gets sum_r g_r / W: the dp
//     average, as in plain dp;
//   - a local expert already receives the gradients of every token routed to it from its whole
//     expert group (the reverse exchange carries them back), so its single-process gradient is
//     the sum over the expert-dp group divided by W = the expert-dp average divided by ep.
// Two DataParallel runtimes do this, one over dp for the shared parameters and one over the
// expert-dp group for this rank's experts (each with the plan's ZeRO stage over its group);
// the experts' averaged gradients are then divided by ep. The optimizer sees both sets; the
// experts of other ranks are not trained here (the runtime frees them) nor written to
// checkpoints by this rank: their owners write them, each expert element by one expert-dp rank.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/module.h"
#include "engine/train/distributed.h"
#include "parallel/comm/communicator.h"
#include "parallel/data_parallel.h"

namespace mammoth::parallel {

class ExpertDataParallel final : public engine::train::DataParallelRuntime {
 public:
  // shared: what every dp rank holds; experts: this rank's experts. `ep` is this rank's expert
  // group (for the gradient norm) and `expert_dp` the ranks holding the same experts. The
  // experts' options may keep more buckets gathered under ZeRO-3 (one grouped GEMM reads every
  // local expert's weight: DataParallelOptions::resident_buckets).
  ExpertDataParallel(const engine::nn::NamedTensors& shared,
                     const engine::nn::NamedTensors& experts, Communicator& dp,
                     Communicator& expert_dp, Communicator& ep, const DataParallelOptions& options,
                     const DataParallelOptions& expert_options);

  // Shared parameters from dp rank 0, experts from expert-dp rank 0.
  void broadcast_parameters();

  int dp_rank() const override { return shared_->dp_rank(); }
  int dp_size() const override { return shared_->dp_size(); }
  void begin_backward(bool sync) override;
  void finish_backward() override;
  const engine::nn::NamedTensors& optimizer_params() const override { return opt_params_; }
  bool decays(const std::string& optimizer_param_name) const override;
  // Over every expert of every rank and the shared parameters (collective over dp and ep).
  double grad_norm() override;
  // Its square over the parameters whose name passes `include` (all when empty), the same
  // collective: under tp (experts replicated over it) each tp rank counts what it owns and
  // the caller sums over tp.
  double grad_sq_sum(const std::function<bool(const std::string&)>& include = {});
  void after_step() override;
  double average(double value) override { return shared_->average(value); }
  void barrier() override { shared_->barrier(); }
  std::vector<engine::train::CheckpointPiece> checkpoint_pieces(
      const engine::nn::NamedTensors& state, const std::vector<std::string>& suffixes,
      bool writing) override;
  void pieces_loaded() override;

  const DataParallel& shared() const { return *shared_; }
  const DataParallel& experts() const { return *experts_; }

 private:
  std::unique_ptr<DataParallel> shared_;
  std::unique_ptr<DataParallel> experts_;
  Communicator& ep_;
  engine::nn::NamedTensors opt_params_;
  size_t shared_opt_params_ = 0;  // opt_params_[0, this) are shared_'s
};

}  // namespace mammoth::parallel
