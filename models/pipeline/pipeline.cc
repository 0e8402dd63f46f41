#include "models/pipeline/pipeline.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "models/analyze.h"

namespace mammoth::models {

using engine::Tensor;
using parallel::pipeline::StageChunk;

parallel::pipeline::Partition ModelPipeline::balanced(const ModelConfig& config, int64_t seq_len,
                                                      int stages) {
  const ModelAnalysis a = analyze(config, seq_len);
  const std::vector<double> blocks(static_cast<size_t>(config.n_layer),
                                   a.block_flops_per_token_forward);
  return parallel::pipeline::balanced_partition(blocks, 0.0, a.head_flops_per_token_forward,
                                                stages);
}

ModelPipeline::ModelPipeline(std::shared_ptr<Model> model, const Schedule& schedule,
                             Communicator& pp, parallel::pipeline::Partition partition)
    : model_(std::move(model)), pp_(pp), partition_(std::move(partition)) {
  MAMMOTH_CHECK(model_ != nullptr) << "[pipeline] model is null";
  MAMMOTH_CHECK(model_->supports_pipeline())
      << "[pipeline] model family " << family_name(model_->config().family)
      << " has no pipeline stages yet";
  const int S = schedule.num_virtual_stages();
  const int64_t L = model_->config().n_layer;
  MAMMOTH_CHECK(L >= S) << "[pipeline] " << L << " layers cannot fill " << S
                        << " virtual stages (pp " << schedule.stages << " x virtual stages "
                        << schedule.virtual_stages << ")";
  if (partition_.empty()) partition_ = parallel::pipeline::partition_by_count(L, S);
  MAMMOTH_CHECK(static_cast<int>(partition_.size()) == S + 1 && partition_.front() == 0 &&
                partition_.back() == L && std::is_sorted(partition_.begin(), partition_.end()) &&
                std::adjacent_find(partition_.begin(), partition_.end()) == partition_.end())
      << "[pipeline] the partition must cut " << L << " layers into " << S
      << " non-empty virtual stages";
  const int rank = pp.rank(), p = pp.size();
  const int M = schedule.micro_batches;
  const auto all = model_->named_parameters();
  std::vector<StageChunk> chunks;
  for (int c = 0; c < schedule.virtual_stages; ++c) {
    const int s = schedule.virtual_stage(rank, c);
    const int64_t first = partition_[static_cast<size_t>(s)];
    const int64_t last = partition_[static_cast<size_t>(s) + 1];
    const bool head = s == S - 1, embed = s == 0;
    const ChunkRange range{first, last, embed, head};
    ranges_.push_back(range);
    StageChunk chunk;
    for (const auto& [name, t] : all) {
      if (range.has(model_->pipeline_part(name))) chunk.params.emplace_back(name, t);
    }
    for (const auto& np : chunk.params) params_.push_back(np);
    chunk.forward = [this, first, last, embed, head, M](const Tensor& input, int mb) {
      const Tensor& ids = batches_.at(mb);
      Tensor x = embed ? model_->pipeline_embed(ids) : input;
      for (int64_t l = first; l < last; ++l) x = model_->pipeline_block(l, x, ids);
      if (!head) return x;
      return engine::mul_scalar(model_->pipeline_loss(x, ids), loss_scale_ / M);
    };
    chunks.push_back(std::move(chunk));
  }
  // A parameter can appear in two chunks of one rank only when p == 1 (tied); keep one entry.
  engine::nn::NamedTensors unique;
  for (const auto& np : params_) {
    bool seen = false;
    for (const auto& u : unique) seen = seen || u.second.impl() == np.second.impl();
    if (!seen) unique.push_back(np);
  }
  params_ = std::move(unique);
  for (const auto& [name, t] : all) {
    const Model::PipelinePart part = model_->pipeline_part(name);
    if (part.embed && part.head) tied_params_.emplace_back(name, t);
  }
  const bool first_rank = rank == 0;
  last_stage_ = p > 1 && rank == p - 1;
  if (p > 1 && !tied_params_.empty()) {
    tied_ = pp.split(first_rank || last_stage_ ? 0 : -1, rank, pp.name() + "/tied");
  }
  stage_ = std::make_unique<PipelineStage>(schedule, std::move(chunks), pp);
}

ModelPipeline::~ModelPipeline() = default;

bool ModelPipeline::holds(const std::string& name) const {
  const Model::PipelinePart part = model_->pipeline_part(name);
  return std::any_of(ranges_.begin(), ranges_.end(),
                     [&](const ChunkRange& r) { return r.has(part); });
}

double ModelPipeline::step(const std::vector<Tensor>& micro_batches, double loss_scale) {
  MAMMOTH_CHECK(loss_scale > 0) << "[pipeline] loss scale must be > 0, got " << loss_scale;
  const int M = stage_->schedule().micro_batches;
  MAMMOTH_CHECK(static_cast<int>(micro_batches.size()) == M)
      << "[pipeline] step: " << micro_batches.size() << " micro-batches for a schedule of " << M;
  batches_ = micro_batches;
  loss_scale_ = loss_scale;
  const double local = stage_->run() / loss_scale;
  batches_.clear();
  if (tied_ != nullptr) {
    for (const auto& [name, w] : tied_params_) {
      Tensor g = w.grad();
      if (!g.defined()) g = Tensor::zeros(w.shape(), w.dtype(), w.device());
      g = g.contiguous();
      tied_->all_reduce(g, parallel::ReduceOp::kSum);
      w.set_grad(g);
    }
  }
  Tensor l = Tensor::from_vector({pp_.rank() == pp_.size() - 1 ? local : 0.0}, {1}, DType::kF64);
  pp_.all_reduce(l, parallel::ReduceOp::kSum);
  return l.item();
}

bool ModelPipeline::counts_in_norm(const std::string& name) const {
  if (!last_stage_) return true;
  for (const auto& np : tied_params_) {
    if (np.first == name) return false;
  }
  return true;
}

double ModelPipeline::local_grad_sq_sum() const {
  engine::nn::NamedTensors counted;
  for (const auto& np : params_) {
    if (counts_in_norm(np.first)) counted.push_back(np);
  }
  return engine::optim::grad_sq_sum(counted);
}

double ModelPipeline::grad_norm(double local_sq_sum) {
  Tensor s = Tensor::from_vector({local_sq_sum}, {1}, DType::kF64);
  pp_.all_reduce(s, parallel::ReduceOp::kSum);
  return std::sqrt(s.item());
}

}  // namespace mammoth::models
