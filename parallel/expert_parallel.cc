#include "parallel/expert_parallel.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/ops.h"

namespace mammoth::parallel {

using engine::Tensor;

ExpertDataParallel::ExpertDataParallel(const engine::nn::NamedTensors& shared,
                                       const engine::nn::NamedTensors& experts, Communicator& dp,
                                       Communicator& expert_dp, Communicator& ep,
                                       const DataParallelOptions& options,
                                       const DataParallelOptions& expert_options)
    : shared_(std::make_unique<DataParallel>(shared, dp, options)),
      experts_(std::make_unique<DataParallel>(experts, expert_dp, expert_options)),
      ep_(ep) {
  MAMMOTH_CHECK(dp.size() == ep.size() * expert_dp.size())
      << "[expert_parallel] dp " << dp.size() << " must be ep " << ep.size() << " x expert-dp "
      << expert_dp.size();
  opt_params_ = shared_->optimizer_params();
  shared_opt_params_ = opt_params_.size();
  for (const auto& p : experts_->optimizer_params()) opt_params_.push_back(p);
}

void ExpertDataParallel::broadcast_parameters() {
  shared_->broadcast_parameters();
  experts_->broadcast_parameters();
}

void ExpertDataParallel::begin_backward(bool sync) {
  shared_->begin_backward(sync);
  experts_->begin_backward(sync);
}

void ExpertDataParallel::finish_backward() {
  shared_->finish_backward();
  experts_->finish_backward();
  const double scale = 1.0 / static_cast<double>(ep_.size());
  engine::NoGradGuard ng;
  for (const auto& [name, p] : experts_->optimizer_params()) {
    const Tensor g = p.grad();
    if (g.defined()) engine::copy_(g, g * scale);
  }
}

bool ExpertDataParallel::decays(const std::string& name) const {
  for (size_t i = 0; i < opt_params_.size(); ++i) {
    if (opt_params_[i].first == name)
      return i < shared_opt_params_ ? shared_->decays(name) : experts_->decays(name);
  }
  MAMMOTH_THROW() << "[expert_parallel] unknown optimizer parameter '" << name << "'";
}

double ExpertDataParallel::grad_norm() { return std::sqrt(grad_sq_sum()); }

double ExpertDataParallel::grad_sq_sum(const std::function<bool(const std::string&)>& include) {
  // Each expert-dp group sums its experts' squares; the expert group adds the other experts.
  Tensor sq = Tensor::from_vector({experts_->grad_sq_sum(include)}, {1}, DType::kF64);
  ep_.all_reduce(sq, ReduceOp::kSum);
  return shared_->grad_sq_sum(include) + sq.item();
}

void ExpertDataParallel::after_step() {
  shared_->after_step();
  experts_->after_step();
}

std::vector<engine::train::CheckpointPiece> ExpertDataParallel::checkpoint_pieces(
    const engine::nn::NamedTensors& state, const std::vector<std::string>& suffixes, bool writing) {
  std::vector<engine::train::CheckpointPiece> out =
      shared_->checkpoint_pieces(state, suffixes, writing);
  for (auto& p : experts_->checkpoint_pieces(state, suffixes, writing)) out.push_back(p);
  return out;
}

void ExpertDataParallel::pieces_loaded() {
  shared_->pieces_loaded();
  experts_->pieces_loaded();
}

}  // namespace mammoth::parallel
