#include "parallel/offload_group.h"

#include <memory>

namespace mammoth::parallel {

std::function<void()> OffloadGroup::start_average(const engine::Tensor& flat) {
  // The same reduction as DataParallel's buckets (an average), so the gradients match it.
  std::shared_ptr<Work> work = comm_.iall_reduce(flat, flat, ReduceOp::kAvg);
  return [work] { work->wait(); };
}

std::function<void()> OffloadGroup::start_broadcast(const engine::Tensor& flat, int root) {
  std::shared_ptr<Work> work = comm_.ibroadcast(flat, flat, root);
  return [work] { work->wait(); };
}

double OffloadGroup::average(double value) {
  engine::Tensor t = engine::Tensor::from_vector({value}, {1}, DType::kF64);
  comm_.all_reduce(t, ReduceOp::kAvg);
  return t.item();
}

}  // namespace mammoth::parallel
