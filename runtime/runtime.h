// The training runtime assembled from a ParallelPlan, in one place.
//
// `mammoth train` parses flags (or a plan file) into a plan; this turns the plan into the
// parts that run it: the device mesh, the model's tensor/sequence-parallel form (its family's
// policy), pipeline stages, data parallelism with ZeRO, or chunked offload with its own data
// parallelism, and the layout fields of TrainOptions (who logs, how checkpoints are sharded,
// the global gradient norm). The training loop (engine/train) then runs without knowing which
// strategies are on.
//
// Adding a parallel strategy: a field in plan::ParallelPlan, its rules in plan::check(), and
// its assembly here (ARCHITECTURE.md, "One plan").
#pragma once

#include <memory>
#include <string>

#include "base/device.h"
#include "engine/train/trainer.h"
#include "models/lora.h"
#include "models/model.h"
#include "parallel/mesh.h"
#include "plan/parallel_plan.h"

namespace mammoth::models {
class ShardLayout;
}

namespace mammoth::runtime {

class TrainingRuntime {
 public:
  // Validates `plan` against the launched world (plan::validate: the one place combinations
  // are refused) and makes the mesh when the plan has more than one rank. `device` is where
  // this process computes (engine/train/device.h); collectives time out after comm_timeout_s.
  TrainingRuntime(const plan::ParallelPlan& plan, Device device, double comm_timeout_s);
  ~TrainingRuntime();
  TrainingRuntime(const TrainingRuntime&) = delete;
  TrainingRuntime& operator=(const TrainingRuntime&) = delete;

  // The plan it runs; after assemble(), with the pipeline's stage cut filled in.
  const plan::ParallelPlan& plan() const { return plan_; }
  parallel::DeviceMesh* mesh() const { return mesh_.get(); }
  int rank() const;
  bool lead() const { return rank() == 0; }
  void barrier() const;

  // Builds everything that trains `model` under the plan (model-dependent rules are checked
  // first) and fills the layout fields of `options`: dp, model_shards, after_backward /
  // sync_grad, grad_norm, pipeline_step / optimizer_params, offload, logging_rank, world_rank /
  // world_size / world_barrier, writes_parameter, layout. Prints the pipeline stages and the
  // offload report on rank 0. Call once; `model` is kept alive by the runtime.
  void assemble(std::shared_ptr<models::LanguageModel> model, engine::train::TrainOptions& options);

  // LoRA: `adapters` (their parameters in options.trained_params) train beside the frozen
  // model. Under tp, assemble() hangs their pieces on the sharded layers (models/policies/
  // lora_tp.h) and trains those instead. Call before assemble(); kept by reference.
  void set_lora(const models::LoraAdapters& adapters) { lora_ = &adapters; }

  // A classifier (ViT, BERT's sequence-classification head) instead of a language model: it
  // trains whole (options.trained_params: the part of it that trains; null: all), under dp
  // and ZeRO; also under tp and sp (its policy's form, trained_classifier(), in every sp
  // mode) and pp (one-device stages). plan::check refuses the rest by name (pp x tp / sp,
  // offload, recompute for a family without it).
  // Fills the same layout fields as assemble(). Call once, instead of assemble().
  void assemble_classifier(std::shared_ptr<models::Model> model,
                           engine::train::TrainOptions& options);
  // The classifier that trains: the model, or its tensor/sequence-parallel form.
  models::Model& trained_classifier() const;

  // The form that trains: the model, or its tensor/sequence-parallel shards.
  models::LanguageModel& trained() const { return *trained_; }

  // Persistent bytes on this rank (its tp shards or pipeline stages, divided further by ZeRO
  // or offload) and how they are split, for the start-up line.
  struct Memory {
    int64_t params = 0;
    int64_t grads = 0;
    int64_t optimizer = 0;
    std::string how;  // "ZeRO stage 1", "offload: sharded by chunk over dp"
  };
  Memory memory() const;
  // The chunk-tier report of offload ("" without it).
  std::string offload_report() const;

 private:
  struct Parts;
  // logging_rank, world_rank / world_size / world_barrier / world_any and layout, from the mesh.
  void set_world_fields(engine::train::TrainOptions& options) const;
  // A sharded form trains: checkpoints map its shards to single-process tensors, and its
  // sequence-partial gradients are summed after backward (model_shards, after_backward,
  // sync_grad). `module` is `shards`' own module.
  // `trained`: the names that train and are checkpointed (null: all of `full`).
  void wire_shards(const models::ShardLayout& shards, const engine::nn::Module& module,
                   const models::Model& full, engine::train::TrainOptions& options,
                   const engine::nn::NamedTensors* trained);
  // Pipeline stages of `staged` (the model or its sharded form) under the plan's schedule and
  // cut (balanced at `positions` per row by default): pipeline_step, optimizer_params, and
  // evaluation off.
  void build_pipeline(std::shared_ptr<models::Model> staged, int64_t positions,
                      engine::train::TrainOptions& options);
  // optimizer_params: this rank's stages' parameters among trained_params_ (LoRA adapters, a
  // classifier's trained names).
  void keep_trained_stage_params(engine::train::TrainOptions& options);
  // options.grad_norm when the model is split over tp, sp or pp (each part counted once).
  void set_grad_norm(engine::train::TrainOptions& options);
  plan::ParallelPlan plan_;
  Device device_;
  std::unique_ptr<parallel::DeviceMesh> mesh_;
  std::shared_ptr<models::LanguageModel> model_;
  std::shared_ptr<models::Model> classifier_;  // assemble_classifier's model
  models::LanguageModel* trained_ = nullptr;
  const engine::nn::NamedTensors* trained_params_ = nullptr;  // LoRA's adapters; null: trained_'s
  const models::LoraAdapters* lora_ = nullptr;
  std::unique_ptr<Parts> parts_;
};

}  // namespace mammoth::runtime
