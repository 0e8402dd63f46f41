// The single-process training loop: micro-batches with gradient accumulation, AdamW with
// warmup + cosine/linear decay, global-norm clipping, bf16/fp16 autocast with fp16 loss scaling,
// periodic evaluation, progress lines, JSON metrics per step, TensorBoard scalars, checkpoints
// with exact resume, and a checkpoint on SIGINT/SIGTERM.
//
// The loop knows nothing about model families: it trains any Module through a loss function
// of (input, target) micro-batches drawn from one of two batch sources (trainer.cc's
// BatchSource): llm.c token data read by a WindowSampler (input ids [B, T], target ids [B, T]:
// next-token targets or, for masked LMs, engine/data/masking.h's inputs and labels), or
// labelled examples (engine/data/examples.h: images f32 [B, C, H, W] or token ids [B, T], with
// labels i64 [B]) for classification. Both are read by step index alone, so resuming at a
// checkpoint's step continues the exact data order.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/json.h"
#include "engine/data/examples.h"
#include "engine/data/masking.h"
#include "engine/data/token_shard.h"
#include "engine/nn/module.h"
#include "engine/optim/optim.h"
#include "engine/train/distributed.h"

namespace mammoth::engine::train {

class OffloadRuntime;

struct TrainOptions {
  int64_t steps = 200;
  int64_t micro_batch = 8;
  int64_t seq_len = 64;
  int64_t grad_accum = 1;
  // What the batches ask of the model: "next_token" (input = a window's first seq_len tokens,
  // targets = the next token at each position) or "masked_lm" (BERT: the window's first
  // seq_len tokens masked by data::MaskingRule(masking), keyed by the window's index and the
  // epoch it is read in, masking.seed = seed; targets = the original token at the chosen
  // positions, -100 elsewhere).
  // "classify": the labelled-examples overload of train(), inputs and labels as they are.
  // Validation batches follow the same objective.
  std::string objective = "next_token";
  data::MaskingOptions masking;  // masked_lm: mask token, vocabulary, special tokens, fractions
  // Instruction data (engine/data/instruction_data.h): the part of every token of the training
  // data (val_loss_parts: of the validation data), 0 padding, 1 prompt, 2 response, as ids; a
  // next-token target whose part is below loss_min_part is -100 (ignored by the loss, as
  // masked-LM's unchosen positions are). Null: every target counts.
  const data::TokenDataset* loss_parts = nullptr;
  const data::TokenDataset* val_loss_parts = nullptr;
  int loss_min_part = 2;
  double lr = 1e-3;
  double min_lr_ratio = 0.1;
  int64_t warmup = 20;
  std::string schedule = "cosine";  // constant | cosine | linear
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double grad_clip = 1.0;  // <= 0 disables
  uint64_t seed = 1337;
  int64_t eval_every = 50;  // 0 disables periodic evaluation
  int64_t eval_batches = 4;
  double val_fraction = 0.05;  // held out of the training data when no validation data is given
  // Classification: a validation batch's (mean loss, correct predictions) from one forward;
  // evaluation then reports accuracy (val_accuracy) beside the loss. Unset: loss_fn's loss only.
  std::function<std::pair<double, int64_t>(const Tensor& input, const Tensor& labels)> eval_fn;
  std::string save_dir;    // empty: no checkpoints
  int64_t save_every = 0;  // 0: only at the end (and on a signal)
  int keep_last = 3;
  bool resume = false;  // continue from save_dir/latest
  std::string metrics_path;
  int64_t log_every = 1;
  double flops_per_token = 0;  // model FLOPs per token (fwd+bwd) for MFU; 0: not reported
  double peak_flops = 0;       // the machine's peak FLOP/s for MFU
  bool quiet = false;          // no progress lines
  // Where the batches go: the model's device (its parameters must already be there; see
  // engine/train/device.h). Losses and norms are read back to the host each step.
  Device device = Device::cpu();
  // Data parallelism (parallel::DataParallel), not owned; null: one process. The global batch
  // is micro_batch * grad_accum * dp size, and dp rank r reads its contiguous share of it, so
  // the loss curve does not depend on the split between ranks and accumulation. Rank 0 logs,
  // writes metrics and checkpoints.
  DataParallelRuntime* dp = nullptr;
  // Model parallelism inside each dp rank (tensor/sequence parallel forms of the model):
  // `after_backward` runs after the last micro-batch's backward and before dp's reduction,
  // which then waits for it (no overlap with the backward) (e.g. summing
  // sequence-partial gradients; see sync_grad), `grad_norm` replaces the local gradient norm
  // (sharded parameters summed over their group), and only the rank with `logging_rank` set logs,
  // writes metrics and checkpoints.
  std::function<void()> after_backward;
  // The same sums one parameter at a time (sync_grad(name, param)). When given, and dp can run
  // it on each gradient bucket just before reducing it (DataParallelRuntime::set_grad_sync),
  // it replaces after_backward, and the dp reduction overlaps the backward again (without
  // after_backward, it then runs over every parameter after the backward).
  DataParallelRuntime::GradSync sync_grad;
  std::function<double()> grad_norm;
  // Called once on every rank after the first step of this call with the allocator's peak of
  // that step (bytes live at its height: parameters, gradients, optimizer states, activations
  // and buffers in flight), measured on the model's device.
  std::function<void(int64_t peak_bytes)> report_peak_memory;
  // Called before (begin true) and after each step with its index (train --profile starts and
  // stops its session here).
  std::function<void(int64_t step, bool begin)> on_step;
  bool logging_rank = true;
  // The planner's predictions for this run (plan/): recorded in every metrics line beside the
  // measured step time ("step_s") and the allocator's peak; 0: no prediction.
  double predicted_step_s = 0;
  // Model-specific figures for the metrics line of each step (keys merged into it), called on
  // every rank after the step when metrics are written (so it may be collective), the logging
  // rank's kept (a mixture of experts' expert load: models/mixtral).
  std::function<json::Value()> step_metrics;
  int64_t predicted_peak_mem_bytes = 0;
  // Pipeline parallelism: runs forward and backward of all of a step's micro-batches and
  // returns the step's mean loss; the optimizer then updates `optimizer_params` (this rank's
  // stages). A micro-batch is one tensor: pipeline_pack(input, target) when set (a classifier's
  // packing, models::Model::pipeline_batch), else ids [micro_batch, seq_len + 1] (input and
  // next-token targets in one window) or, for the masked LM, [micro_batch, 2 seq_len] (ids,
  // then targets). With dp as well, dp's runtime is built over `optimizer_params` and reduces
  // the gradients after the pipeline step.
  // `loss_scale` multiplies the loss before backward (fp16); the returned loss is unscaled.
  std::function<double(const std::vector<Tensor>& micro_batches, double loss_scale)> pipeline_step;
  std::function<Tensor(const Tensor& input, const Tensor& target)> pipeline_pack;
  const nn::NamedTensors* optimizer_params = nullptr;
  // What trains when it is not the model's parameters, not owned: LoRA adapters
  // (models/lora.h), the model's own parameters then frozen. The optimizer, dp and checkpoints
  // (and their index) see these only; null: the model's parameters.
  const nn::NamedTensors* trained_params = nullptr;
  // Called on the rank that commits each checkpoint, once it is complete, with its directory
  // (LoRA writes its adapter directory beside it).
  std::function<void(const std::string& dir)> after_checkpoint;
  std::string tensorboard_dir;  // empty: no TensorBoard event file
  // Mixed precision (engine/amp): "fp32", "bf16" (autocast matmuls) or "fp16" (autocast plus
  // dynamic loss scaling that skips steps with inf/NaN gradients).
  std::string amp = "fp32";
  double init_loss_scale = 65536.0;
  int64_t loss_scale_growth_interval = 2000;
  // Distributed checkpoints: with world_size > 1 every rank writes its shard of one sharded
  // checkpoint (engine/train/checkpoint.h) and rank 0 commits it; world_barrier synchronises
  // all ranks. writes_parameter, when set, says whether this rank writes a parameter it holds
  // (false for a pipeline's second copy of a tied weight); layout is recorded in the index.
  int world_rank = 0;
  int world_size = 1;
  std::function<void()> world_barrier;
  // True on every rank when any rank passes true (a signal seen by one rank of a pp or tp group
  // stops them all at the same step). Unset: dp's group, or this rank alone.
  std::function<bool(bool)> world_any;
  std::function<bool(const std::string& name)> writes_parameter;
  json::Value layout;
  // Tensor parallelism: how this rank's parameters relate to the single-process ones (not
  // owned; null: they are the single-process ones). Under it dp must not shard (ZeRO 0).
  ModelShardRuntime* model_shards = nullptr;
  // Chunked memory (engine/offload), not owned; null: none. With data parallelism, dp must be
  // the offload runtime's own (offload->data_parallel()): it reduces gradient chunks and
  // shards the AdamW states by chunk; a separate runtime would fight over the parameters.
  OffloadRuntime* offload = nullptr;
  // Debugging (`train --detect-anomaly`): the first op whose output or gradient holds NaN or inf
  // stops the run, named (engine/autograd.h's AnomalyDetectionScope).
  bool detect_anomaly = false;
  // `train --log-grad-norms`: each logged step's metrics line holds every module's gradient L2
  // norm ("grad_norms": {"h.0.attn.c_attn": ...}), from this process's whole gradients (one
  // process or plain dp, where they are the averaged ones).
  bool log_grad_norms = false;
  // Test hook for --detect-anomaly: before step inject_nan_step (0-based) the first element of
  // parameter inject_nan_param is set to NaN. Empty: never.
  std::string inject_nan_param;
  int64_t inject_nan_step = 0;
  // Test hook: the step (0-based) whose gradients are overwritten with +inf before the
  // finiteness check, to prove that fp16 skips exactly that step. -1: never.
  int64_t inject_inf_grad_step = -1;
};

// What the loop needs from a memory offload runtime (engine/offload implements it): parameters,
// gradients and AdamW states live in chunks paged between device, host and NVMe, and the
// optimizer updates them chunk by chunk. Null in TrainOptions: everything stays in place.
class OffloadRuntime {
 public:
  virtual ~OffloadRuntime() = default;
  // The optimizer the loop steps (AdamW over the chunked states), built on first call.
  virtual optim::Optimizer& optimizer(const optim::AdamWOptions& options) = 0;
  // After each step (trace of the first step; gradients of the step are dead).
  virtual void end_step() = 0;
  // AdamW state as copies in the single-process layout ("<param>.exp_avg"), and its inverse.
  virtual nn::NamedTensors gather_state() = 0;
  virtual void scatter_state(const nn::NamedTensors& full) = 0;
  // Memory per tier for the metrics line.
  virtual json::Value metrics() const = 0;
  // The runtime's own data parallelism over its chunks (engine/offload with a dp group), which
  // the loop then uses as TrainOptions::dp; null when it runs one process.
  virtual DataParallelRuntime* data_parallel() { return nullptr; }
};

using LossFn = std::function<Tensor(const Tensor& input, const Tensor& target)>;

struct TrainResult {
  std::vector<double> losses;    // training loss of every step run in this call
  double last_val_loss = 0;      // NaN when never evaluated
  double last_val_accuracy = 0;  // NaN without eval_fn or when never evaluated
  int64_t first_step = 0;        // 0, or the resumed step
  int64_t last_step = 0;         // steps completed in total
  bool interrupted = false;      // stopped by SIGINT/SIGTERM
  int64_t skipped_steps = 0;     // fp16 steps skipped for inf/NaN gradients (in total)
  double loss_scale = 1.0;       // the final loss scale (1 without fp16)
};

// Trains `model` for options.steps steps (resuming when asked). `val` may be empty (size 0):
// then the last val_fraction of `data` is held out. `config` is stored in checkpoints and
// compared on resume (a different model or batch layout is an error naming the field).
TrainResult train(nn::Module& model, const LossFn& loss_fn, const data::TokenDataset& data,
                  const data::TokenDataset& val, const TrainOptions& options,
                  const json::Value& config);

// The same loop over labelled examples (objective "classify"): `val` null holds out the
// val_fraction of `data` after one seeded shuffle. config's "data" is set from describe(), so a
// resumed run must read the same examples.
TrainResult train(nn::Module& model, const LossFn& loss_fn, const data::LabelledExamples& data,
                  const data::LabelledExamples* val, const TrainOptions& options,
                  const json::Value& config);

// The fields of TrainOptions as JSON (stored in checkpoints and printed at start).
json::Value options_to_json(const TrainOptions& options);

}  // namespace mammoth::engine::train
