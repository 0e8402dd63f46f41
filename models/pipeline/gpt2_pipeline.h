// GPT-2 cut into pipeline stages for parallel/pipeline's runtime (a model-side policy: the
// parallel layer knows nothing of models).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/nn/module.h"
#include "engine/tensor.h"
#include "models/config.h"
#include "parallel/comm/communicator.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage.h"

namespace mammoth::models {

class Gpt2;
using parallel::Communicator;
using parallel::pipeline::PipelineStage;
using parallel::pipeline::Schedule;

// GPT-2 cut into schedule.num_virtual_stages() chunks of consecutive layers (`partition`:
// by count when empty; balanced() evens out the head's cost): the embeddings (wte, wpe)
// before the first, ln_f and the tied head after the last. Every rank builds the whole
// model from the same seed and keeps using only its chunks' parameters. The tied wte lives on
// the first and the last stage; its gradient is summed between the two after the backward, so
// both apply the same update and stay equal. The model's dropout must be 0 (its RNG stream
// would differ from the single-process order) unless parity does not matter.
class Gpt2Pipeline {
 public:
  Gpt2Pipeline(std::shared_ptr<models::Gpt2> model, const Schedule& schedule, Communicator& pp,
               parallel::pipeline::Partition partition = {});
  ~Gpt2Pipeline();

  // ids i64 [b, T] per micro-batch, schedule.micro_batches of them, the same on every rank.
  // Runs forward and backward of each (loss of each scaled by 1/m, as gradient accumulation
  // does) and sums the tied gradient. Returns the step's loss (mean over micro-batches) on
  // every rank.
  double step(const std::vector<engine::Tensor>& micro_batches);
  // L2 norm of the whole model's gradient (collective over pp; wte counted once).
  double grad_norm() { return grad_norm(local_grad_sq_sum()); }
  // The same from this rank's share of the squared sum, e.g. summed over a dp group first
  // (parallel::DataParallel::grad_sq_sum(counts_in_norm)); collective over pp.
  double grad_norm(double local_sq_sum);
  // Whether parameter `name` of this rank counts in the norm (not the last stage's wte copy).
  bool counts_in_norm(const std::string& name) const;
  double local_grad_sq_sum() const;
  // This rank's parameters, under the full model's names (for the optimizer).
  const engine::nn::NamedTensors& parameters() const { return params_; }
  PipelineStage& runtime() { return *stage_; }
  const parallel::pipeline::Partition& partition() const { return partition_; }
  // The cut into `stages` virtual stages that minimises the largest stage's training FLOPs
  // (models/analyze: per block, and the LM head on the last stage) at `seq_len` positions.
  static parallel::pipeline::Partition balanced(const ModelConfig& config, int64_t seq_len,
                                                int stages);

 private:
  std::shared_ptr<models::Gpt2> model_;
  Communicator& pp_;
  parallel::pipeline::Partition partition_;
  std::unique_ptr<Communicator> tied_;  // first and last stage (null elsewhere, or pp == 1)
  std::unique_ptr<PipelineStage> stage_;
  engine::nn::NamedTensors params_;
  bool skip_wte_in_norm_ = false;  // the last stage's copy of wte (p > 1)
  std::vector<engine::Tensor> batches_;
};

}  // namespace mammoth::models
