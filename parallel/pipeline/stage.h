// The pipeline runtime of one rank: runs this rank's list of a Schedule (parallel/pipeline/
// schedule.h) over its model chunks, exchanging activations and gradients with its neighbours
// in the pp group. models/pipeline/pipeline.h cuts a language model into such chunks.
//
// A chunk is a function from the previous virtual stage's activation to this stage's output
// (the loss on the last virtual stage). No new differentiable op is needed to cut the graph:
//   F(m, s): the received activation becomes a fresh leaf that requires grad; the chunk runs
//            forward with autograd on; its output is sent (isend) to the next stage's rank and
//            kept, with the leaf, until the backward;
//   B(m, s): output.backward(gradient received from s + 1) (loss.backward() on the last stage)
//            fills the leaf's .grad, which is sent to s - 1; the stored pair is dropped;
//   W(m, s): in a split (zero-bubble) schedule B keeps the weight-gradient contributions aside
//            and W adds them to the parameters' gradients. The engine computes both halves in
//            one backward, so W moves only the accumulation; the ordering and data flow are the
//            schedule's, the time saving needs an engine-level split of the backward.
//
// Receives are posted ahead (a window of upcoming actions) with irecv so communication overlaps
// compute; sends are isend and waited for at the end of the step. The shape of the activations
// crossing each stage boundary is sent once, before the boundary's first activation, and
// reused (every later activation must have it). Tags identify (direction, boundary,
// micro-batch), so messages may arrive in any order.
//
//   auto model = std::dynamic_pointer_cast<models::Gpt2>(models::build_model(cfg, seed));
//   auto sched = make_schedule(ScheduleKind::k1F1B, {.stages = pp.size(), .micro_batches = 4});
//   ModelPipeline pipe(model, sched, pp);
//   AdamW opt(pipe.parameters(), adamw);
//   double loss = pipe.step(micro_batches);   // forward + backward of every micro-batch
//   opt.step(clip_factor(pipe.grad_norm(), 1.0));
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "engine/autograd.h"
#include "engine/nn/module.h"
#include "engine/tensor.h"
#include "parallel/comm/communicator.h"
#include "parallel/pipeline/schedule.h"

namespace mammoth::parallel::pipeline {

// One model chunk (virtual stage) of this rank.
struct StageChunk {
  // `input`: the previous virtual stage's activation (a leaf requiring grad), undefined on
  // virtual stage 0. Returns the activation for the next stage, or on the last virtual stage
  // the scalar loss of the micro-batch as it should be summed over the step (e.g. mean / m).
  std::function<engine::Tensor(const engine::Tensor& input, int micro_batch)> forward;
  // The parameters the chunk uses (their gradients are what W defers).
  engine::nn::NamedTensors params;
};

struct StageStats {
  int stored = 0;                     // micro-batch activations held now (F done, B not)
  int peak_stored = 0;                // the most held at once since reset_stats()
  int64_t deferred_weight_grads = 0;  // weight-gradient GEMMs B left to W (split backward)
  int64_t sent = 0, received = 0;     // messages this step
};

class PipelineStage {
 public:
  // chunks[c] is virtual stage schedule.virtual_stage(pp.rank(), c). Throws when the schedule's
  // stage count differs from the group size, the schedule is invalid (check_schedule), or the
  // chunk count is not the schedule's virtual_stages.
  PipelineStage(Schedule schedule, std::vector<StageChunk> chunks, Communicator& pp);
  ~PipelineStage();
  PipelineStage(const PipelineStage&) = delete;
  PipelineStage& operator=(const PipelineStage&) = delete;

  // Runs this rank's actions for one step (every micro-batch forward and backward). Gradients
  // accumulate into the chunks' parameters. Returns the sum of the last stage's losses on the
  // last stage's rank and 0 elsewhere.
  double run();

  const Schedule& schedule() const { return schedule_; }
  const StageStats& stats() const { return stats_; }
  void reset_stats() { stats_.peak_stored = stats_.stored; }

 private:
  struct Posted {
    engine::Tensor buffer;
    std::unique_ptr<Work> work;
  };
  struct Stored {
    engine::Tensor input;   // leaf requiring grad (undefined on virtual stage 0)
    engine::Tensor output;  // activation sent on, or the loss
  };
  using Key = std::tuple<int, int, int>;  // (direction, boundary, micro-batch)

  int tag(int direction, int boundary, int micro_batch) const;
  void post_ahead(size_t from);
  bool try_post(const Action& a);
  engine::Tensor take(int direction, int boundary, int micro_batch, int peer,
                      const engine::Shape& shape);
  void send(const engine::Tensor& t, int direction, int boundary, int micro_batch, int peer);
  void forward(const Action& a);
  void backward(const Action& a);
  void weight(const Action& a);

  Schedule schedule_;
  std::vector<StageChunk> chunks_;
  Communicator& pp_;
  int rank_;
  // Activation shape per boundary (sender stage s -> s + 1), once exchanged.
  std::map<int, engine::Shape> shapes_;
  std::map<Key, Posted> posted_;
  std::vector<std::pair<engine::Tensor, std::unique_ptr<Work>>> sends_;
  std::map<std::pair<int, int>, Stored> stored_;  // (micro-batch, chunk)
  // Weight-gradient GEMMs deferred by B to W (split backward), per (micro-batch, chunk).
  std::map<std::pair<int, int>, engine::WeightGradQueue> deferred_;
  double loss_ = 0;
  StageStats stats_;
};

}  // namespace mammoth::parallel::pipeline
