// A model cut into pipeline stages for parallel/pipeline's runtime (the model side of pipeline
// parallelism: the parallel layer knows nothing of models).
//
// Any Model with pipeline stages (Model::supports_pipeline: its forward as pipeline_embed ->
// pipeline_block(l) -> pipeline_loss, and pipeline_part for its parameters; language models
// and ViT's classifier)
// is cut into schedule.num_virtual_stages() chunks of consecutive blocks (`partition`: by count
// when empty; balanced() evens out the head's cost): the embedding before the first, the head
// after the last. That includes a model's tensor/sequence-parallel form (models/policies): each
// tp rank then runs its shard of the stage and the pp group is the one of its tp coordinate.
// Every rank builds the whole model from the same seed and keeps using only its chunks'
// parameters. A parameter used by the embedding and the head (tied embeddings) lives on the
// first and the last stage; its gradient is summed between the two after the backward, so both
// apply the same update and stay equal. Dropout must be 0 for parity with one process (its RNG
// stream would differ from the single-process order).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/nn/module.h"
#include "engine/tensor.h"
#include "models/config.h"
#include "models/model.h"
#include "parallel/comm/communicator.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/stage.h"

namespace mammoth::models {

using parallel::Communicator;
using parallel::pipeline::PipelineStage;
using parallel::pipeline::Schedule;

class ModelPipeline {
 public:
  ModelPipeline(std::shared_ptr<Model> model, const Schedule& schedule, Communicator& pp,
                parallel::pipeline::Partition partition = {});
  ~ModelPipeline();

  // One tensor per micro-batch (Model::pipeline_embed's), schedule.micro_batches of them, the
  // same on every rank.
  // Runs forward and backward of each (loss of each scaled by 1/m, as gradient accumulation
  // does, and by `loss_scale` for fp16's loss scaling) and sums the tied gradients. Returns the
  // step's loss (mean over micro-batches, unscaled) on every rank.
  double step(const std::vector<engine::Tensor>& micro_batches, double loss_scale = 1.0);
  // L2 norm of the whole model's gradient (collective over pp; tied parameters counted once).
  double grad_norm() { return grad_norm(local_grad_sq_sum()); }
  // The same from this rank's share of the squared sum, e.g. summed over a dp group first
  // (parallel::DataParallel::grad_sq_sum(counts_in_norm)); collective over pp.
  double grad_norm(double local_sq_sum);
  // Whether parameter `name` of this rank counts in the norm (not the last stage's copy of a
  // tied parameter). Checkpoints write the same ones.
  bool counts_in_norm(const std::string& name) const;
  double local_grad_sq_sum() const;
  // This rank's parameters, under the full model's names (for the optimizer).
  const engine::nn::NamedTensors& parameters() const { return params_; }
  // Whether this rank's chunks use parameter `name` (of the model's names; it need not be one
  // of its parameters: adapters train under the names of the layers they wrap).
  bool holds(const std::string& name) const;
  PipelineStage& runtime() { return *stage_; }
  const Model& model() const { return *model_; }
  const parallel::pipeline::Partition& partition() const { return partition_; }
  // The cut into `stages` virtual stages that minimises the largest stage's training FLOPs
  // (models/analyze: per block, and the LM head on the last stage) at `seq_len` positions.
  static parallel::pipeline::Partition balanced(const ModelConfig& config, int64_t seq_len,
                                                int stages);

 private:
  std::shared_ptr<Model> model_;
  Communicator& pp_;
  parallel::pipeline::Partition partition_;
  std::unique_ptr<Communicator> tied_;  // first and last stage (null elsewhere, or pp == 1)
  std::unique_ptr<PipelineStage> stage_;
  struct ChunkRange {
    int64_t first, last;  // blocks [first, last)
    bool embed, head;
    bool has(const Model::PipelinePart& part) const {
      return (part.embed && embed) || (part.head && head) ||
             (part.block >= first && part.block < last);
    }
  };
  std::vector<ChunkRange> ranges_;  // this rank's chunks
  engine::nn::NamedTensors params_;
  engine::nn::NamedTensors tied_params_;  // used by the embedding and the head
  bool last_stage_ = false;
  std::vector<engine::Tensor> batches_;
  double loss_scale_ = 1.0;  // of the step running
};

}  // namespace mammoth::models
