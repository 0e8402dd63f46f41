#include "models/pipeline/gpt2_pipeline.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "models/analyze.h"
#include "models/gpt2/gpt2.h"
#include "models/layers.h"

namespace mammoth::models {

using engine::Shape;
using engine::Tensor;
using parallel::pipeline::StageChunk;

parallel::pipeline::Partition Gpt2Pipeline::balanced(const ModelConfig& config, int64_t seq_len,
                                                     int stages) {
  const ModelAnalysis a = analyze(config, seq_len);
  const std::vector<double> blocks(static_cast<size_t>(config.n_layer),
                                   a.block_flops_per_token_forward);
  return parallel::pipeline::balanced_partition(blocks, 0.0, a.head_flops_per_token_forward,
                                                stages);
}

Gpt2Pipeline::Gpt2Pipeline(std::shared_ptr<models::Gpt2> model, const Schedule& schedule,
                           Communicator& pp, parallel::pipeline::Partition partition)
    : model_(std::move(model)), pp_(pp), partition_(std::move(partition)) {
  MAMMOTH_CHECK(model_ != nullptr) << "[Gpt2Pipeline] model is null";
  const int S = schedule.num_virtual_stages();
  const int64_t L = static_cast<int64_t>(model_->h->size());
  MAMMOTH_CHECK(L >= S) << "[Gpt2Pipeline] " << L << " layers cannot fill " << S
                        << " virtual stages (pp " << schedule.stages << " x virtual stages "
                        << schedule.virtual_stages << ")";
  if (partition_.empty()) partition_ = parallel::pipeline::partition_by_count(L, S);
  MAMMOTH_CHECK(static_cast<int>(partition_.size()) == S + 1 && partition_.front() == 0 &&
                partition_.back() == L && std::is_sorted(partition_.begin(), partition_.end()) &&
                std::adjacent_find(partition_.begin(), partition_.end()) == partition_.end())
      << "[Gpt2Pipeline] the partition must cut " << L << " layers into " << S
      << " non-empty virtual stages";
  const int rank = pp.rank(), p = pp.size();
  const int M = schedule.micro_batches;
  const auto all = model_->named_parameters();
  auto params_with = [&](auto&& keep) {
    engine::nn::NamedTensors out;
    for (const auto& [name, t] : all) {
      if (keep(name)) out.emplace_back(name, t);
    }
    return out;
  };
  std::vector<StageChunk> chunks;
  for (int c = 0; c < schedule.virtual_stages; ++c) {
    const int s = schedule.virtual_stage(rank, c);
    const int64_t first = partition_[static_cast<size_t>(s)];
    const int64_t last = partition_[static_cast<size_t>(s) + 1];
    const bool head = s == S - 1, embed = s == 0;
    StageChunk chunk;
    chunk.params = params_with([&](const std::string& name) {
      if (name.rfind("h.", 0) == 0) {
        const int64_t l = std::stoll(name.substr(2, name.find('.', 2) - 2));
        return l >= first && l < last;
      }
      if (name.rfind("wte.", 0) == 0) return embed || head;
      if (name.rfind("wpe.", 0) == 0) return embed;
      if (name.rfind("ln_f.", 0) == 0) return head;
      MAMMOTH_THROW() << "[Gpt2Pipeline] parameter '" << name << "' belongs to no stage";
    });
    for (const auto& np : chunk.params) params_.push_back(np);
    chunk.forward = [this, first, last, embed, head, M](const Tensor& input, int mb) {
      const Tensor& ids = batches_.at(mb);
      const int64_t T = ids.size(1);
      Tensor x = input;
      if (embed) x = model_->wte->forward(ids) + model_->wpe->forward(models::positions(0, T));
      for (int64_t l = first; l < last; ++l) x = (*model_->h)[l].forward(x, nullptr, l);
      if (!head) return x;
      Tensor logits = engine::linear(model_->ln_f->forward(x), model_->wte->weight);
      Tensor loss = engine::cross_entropy(logits.slice(1, 0, T - 1), ids.slice(1, 1, T));
      return engine::mul_scalar(loss, 1.0 / M);
    };
    chunks.push_back(std::move(chunk));
  }
  // A parameter can appear in two chunks of one rank only when p == 1 (wte); keep one entry.
  engine::nn::NamedTensors unique;
  for (const auto& np : params_) {
    bool seen = false;
    for (const auto& u : unique) seen = seen || u.second.impl() == np.second.impl();
    if (!seen) unique.push_back(np);
  }
  params_ = std::move(unique);
  const bool first_rank = rank == 0, last_rank = rank == p - 1;
  skip_wte_in_norm_ = p > 1 && last_rank;
  if (p > 1) tied_ = pp.split(first_rank || last_rank ? 0 : -1, rank, pp.name() + "/tied");
  stage_ = std::make_unique<PipelineStage>(schedule, std::move(chunks), pp);
}

Gpt2Pipeline::~Gpt2Pipeline() = default;

double Gpt2Pipeline::step(const std::vector<Tensor>& micro_batches) {
  const int M = stage_->schedule().micro_batches;
  MAMMOTH_CHECK(static_cast<int>(micro_batches.size()) == M)
      << "[Gpt2Pipeline::step] " << micro_batches.size() << " micro-batches for a schedule of "
      << M;
  batches_ = micro_batches;
  const double local = stage_->run();
  batches_.clear();
  if (tied_ != nullptr) {
    const Tensor& wte = model_->wte->weight;
    Tensor g = wte.grad();
    if (!g.defined()) g = Tensor::zeros(wte.shape(), wte.dtype());
    g = g.contiguous();
    tied_->all_reduce(g, parallel::ReduceOp::kSum);
    wte.set_grad(g);
  }
  Tensor l = Tensor::from_vector({pp_.rank() == pp_.size() - 1 ? local : 0.0}, {1}, DType::kF64);
  pp_.all_reduce(l, parallel::ReduceOp::kSum);
  return l.item();
}

bool Gpt2Pipeline::counts_in_norm(const std::string& name) const {
  return !(skip_wte_in_norm_ && name.rfind("wte.", 0) == 0);
}

double Gpt2Pipeline::local_grad_sq_sum() const {
  engine::nn::NamedTensors counted;
  for (const auto& np : params_) {
    if (counts_in_norm(np.first)) counted.push_back(np);
  }
  return engine::optim::grad_sq_sum(counted);
}

double Gpt2Pipeline::grad_norm(double local_sq_sum) {
  Tensor s = Tensor::from_vector({local_sq_sum}, {1}, DType::kF64);
  pp_.all_reduce(s, parallel::ReduceOp::kSum);
  return std::sqrt(s.item());
}

}  // namespace mammoth::models
