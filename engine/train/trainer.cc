#include "engine/train/trainer.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <tuple>

#include "base/cpu_time.h"
#include "base/fault.h"
#include "base/signal_note.h"
#include "engine/amp/amp.h"
#include "engine/autograd.h"
#include "engine/data/sampler.h"
#include "engine/nn/rng.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "engine/profile/profile.h"
#include "engine/train/checkpoint.h"
#include "engine/train/device.h"
#include "engine/train/metrics_sink.h"
#include "memory/allocator.h"

namespace mammoth::engine::train {
namespace {

std::atomic<int> g_signal{0};
extern "C" void on_signal(int sig) {
  g_signal.store(sig);
  note_signal(sig);  // for a rank blocked in communication (its flight record)
}

// Installs SIGINT/SIGTERM handlers for the scope of a training run.
class SignalScope {
 public:
  SignalScope() {
    g_signal.store(0);
    prev_int_ = std::signal(SIGINT, on_signal);
    prev_term_ = std::signal(SIGTERM, on_signal);
  }
  ~SignalScope() {
    std::signal(SIGINT, prev_int_);
    std::signal(SIGTERM, prev_term_);
  }

 private:
  void (*prev_int_)(int);
  void (*prev_term_)(int);
};

// Input and target ids [B, T] of the given windows, on `device`: next-token targets, or with
// `mlm` the windows' tokens masked by the rule and their labels. The masks are keyed by each
// window's index in `d` and the epoch it is read in (`epochs`; empty: epoch 0, as evaluation
// reads), so every layout and every resumed run masks a window alike.
// With `parts` (instruction data), targets whose token part is below min_part become -100.
std::pair<Tensor, Tensor> make_batch(const data::TokenDataset& d, const data::WindowSampler& s,
                                     const std::vector<int64_t>& windows, Device device,
                                     const data::MaskingRule* mlm,
                                     const std::vector<int64_t>& epochs = {},
                                     const data::TokenDataset* parts = nullptr, int min_part = 0) {
  const int64_t B = static_cast<int64_t>(windows.size()), T = s.seq_len();
  std::vector<int32_t> in(static_cast<size_t>(B * T)), tg(static_cast<size_t>(B * T));
  std::vector<int32_t> part(parts ? static_cast<size_t>(T) : 0);
  for (int64_t b = 0; b < B; ++b) {
    data::read_window(d, s, windows[b], in.data() + b * T, tg.data() + b * T);
    if (parts) {
      parts->read(s.window_start(windows[b]) + 1, T, part.data());
      for (int64_t t = 0; t < T; ++t)
        if (part[t] < min_part) tg[b * T + t] = -100;
    }
    if (!mlm) continue;
    const uint64_t epoch = epochs.empty() ? 0 : static_cast<uint64_t>(epochs[b]);
    mlm->apply(static_cast<uint64_t>(windows[b]), epoch, in.data() + b * T, tg.data() + b * T, T);
  }
  auto to_tensor = [&](std::vector<int32_t>& v) {
    Tensor t = Tensor::from_blob(v.data(), {B, T}, DType::kI32, Device::cpu(), nullptr);
    return t.to(DType::kI64).to(device);
  };
  return {to_tensor(in), to_tensor(tg)};
}

// Fields whose change makes a checkpoint's continuation meaningless.
void check_resume_compatible(const json::Value& saved, const json::Value& now) {
  for (const char* key : {"model", "global_batch", "seq_len", "seed", "objective", "data"}) {
    const json::Value* a = saved.find(key);
    const json::Value* b = now.find(key);
    if (a == nullptr || b == nullptr) continue;
    MAMMOTH_CHECK(json::dump(*a) == json::dump(*b))
        << "[train] --resume: the checkpoint was written with " << key << " = " << json::dump(*a)
        << " but this run has " << key << " = " << json::dump(*b);
  }
}

// What the loop draws its micro-batches from: one interface, two sources. Both read by step
// index alone (the sampler is stateless in the step), so a run resumed at step s reads exactly
// what the uninterrupted run read from step s on: the checkpoint's step is the data position.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // This rank's share of global batch `step` (global_batch items; rank of world) is cut into
  // micro-batches of micro_batch; returns micro-batch m's input and target on `device`.
  virtual std::pair<Tensor, Tensor> train_batch(int64_t step, int64_t m) = 0;
  // Validation micro-batch k (a fixed sequence, wrapping around the held-out items).
  virtual std::pair<Tensor, Tensor> val_batch(int64_t k) = 0;
  virtual bool can_eval() const = 0;
  // Set once by the loop before any batch is drawn.
  void bind(int64_t global_batch, int rank, int world) {
    global_batch_ = global_batch;
    rank_ = rank;
    world_ = world;
  }

 protected:
  int64_t global_batch_ = 0;
  int rank_ = 0, world_ = 1;
};

// llm.c token windows: next-token targets, masked-LM inputs and labels, or instruction data's
// loss mask (make_batch).
class TokenWindows final : public BatchSource {
 public:
  TokenWindows(const data::TokenDataset& data, const data::TokenDataset& val, const TrainOptions& o)
      : data_(data),
        o_(o),
        sampler_(data.size(), o.seq_len, o.seed, val.size() > 0 ? 0.0 : o.val_fraction),
        // Validation windows in order: all of `val`, or the held-out tail of `data`.
        val_sampler_(val.size() > 0 ? val.size() : data.size(), o.seq_len, o.seed,
                     val.size() > 0 ? 0.0 : o.val_fraction, false),
        val_data_(val.size() > 0 ? val : data),
        own_val_(val.size() > 0) {
    MAMMOTH_CHECK(o.objective == "next_token" || o.objective == "masked_lm")
        << "[train] objective must be next_token or masked_lm, got '" << o.objective << "'";
    if (o.objective == "masked_lm") {
      data::MaskingOptions mo = o.masking;
      mo.seed = o.seed;
      mlm_ = std::make_unique<data::MaskingRule>(mo);
    }
    if (o.loss_parts != nullptr) {
      // A pipeline stage takes its targets from the window's ids, not from make_batch.
      MAMMOTH_CHECK(!o.pipeline_step && o.objective == "next_token")
          << "[train] instruction data's loss mask has no pipeline or masked-LM form";
      MAMMOTH_CHECK(o.loss_parts->size() == data.size())
          << "[train] the loss mask has " << o.loss_parts->size() << " entries for " << data.size()
          << " tokens";
      MAMMOTH_CHECK(val.size() == 0 || (o.val_loss_parts && o.val_loss_parts->size() == val.size()))
          << "[train] validation data without its loss mask";
    }
    MAMMOTH_CHECK(sampler_.num_train_windows() > 0)
        << "[train] the training data has " << data.size() << " tokens: too few for one window of "
        << o.seq_len + 1;
  }
  std::pair<Tensor, Tensor> train_batch(int64_t step, int64_t m) override {
    if (step != cached_step_) {
      // The epoch each window is read in (masked-LM draws new masks every epoch).
      windows_ = sampler_.batch_indices(step, global_batch_, rank_, world_);
      epochs_ =
          mlm_ ? sampler_.batch_epochs(step, global_batch_, rank_, world_) : std::vector<int64_t>();
      cached_step_ = step;
    }
    const auto from = m * o_.micro_batch, to = (m + 1) * o_.micro_batch;
    const std::vector<int64_t> part(windows_.begin() + from, windows_.begin() + to);
    const std::vector<int64_t> part_epochs =
        mlm_ ? std::vector<int64_t>(epochs_.begin() + from, epochs_.begin() + to)
             : std::vector<int64_t>();
    return make_batch(data_, sampler_, part, o_.device, mlm_.get(), part_epochs, o_.loss_parts,
                      o_.loss_min_part);
  }
  std::pair<Tensor, Tensor> val_batch(int64_t k) override {
    const std::vector<int64_t> windows = own_val_
                                             ? val_sampler_.batch_indices(k, o_.micro_batch)
                                             : val_sampler_.val_batch_indices(k, o_.micro_batch);
    return make_batch(val_data_, val_sampler_, windows, o_.device, mlm_.get(), {},
                      own_val_ ? o_.val_loss_parts : o_.loss_parts, o_.loss_min_part);
  }
  bool can_eval() const override {
    return own_val_ ? val_sampler_.num_train_windows() > 0 : val_sampler_.num_val_windows() > 0;
  }

 private:
  const data::TokenDataset& data_;
  const TrainOptions& o_;
  std::unique_ptr<data::MaskingRule> mlm_;
  data::WindowSampler sampler_;
  data::WindowSampler val_sampler_;
  const data::TokenDataset& val_data_;
  bool own_val_;
  int64_t cached_step_ = -1;
  std::vector<int64_t> windows_, epochs_;
};

// Labelled examples (images, texts). Example i is a window of one item for the sampler (a
// WindowSampler over N + 1 "tokens" of seq_len 1 has exactly N windows), so the order, the dp
// split and the resume rule are the token windows' own. Without separate validation examples
// the held-out val_fraction is taken after one seeded shuffle of all examples (a folder lists
// its examples class by class; its tail alone would be one class).
class ExampleBatches final : public BatchSource {
 public:
  ExampleBatches(const data::LabelledExamples& data, const data::LabelledExamples* val,
                 const TrainOptions& o)
      : data_(data),
        val_data_(val != nullptr ? *val : data),
        o_(o),
        sampler_(data.size() + 1, 1, o.seed, val != nullptr ? 0.0 : o.val_fraction),
        val_sampler_(val_data_.size() + 1, 1, o.seed, val != nullptr ? 0.0 : o.val_fraction, false),
        own_val_(val != nullptr) {
    MAMMOTH_CHECK(o.objective == "classify")
        << "[train] labelled examples train the classify objective, not '" << o.objective << "'";
    MAMMOTH_CHECK((!o.pipeline_step || o.pipeline_pack) && o.loss_parts == nullptr)
        << "[train] classification has no loss mask, and a pipeline form only with its packing "
           "(TrainOptions::pipeline_pack)";
    MAMMOTH_CHECK(sampler_.num_train_windows() > 0)
        << "[train] " << data.describe() << ": no training examples after holding out "
        << o.val_fraction << " for validation";
    MAMMOTH_CHECK(val == nullptr || val->num_classes() == data.num_classes())
        << "[train] the validation examples have " << val->num_classes()
        << " classes, the training examples " << data.num_classes();
    order_.resize(static_cast<size_t>(data.size()));
    for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int64_t>(i);
    if (val == nullptr) {
      uint64_t state = o.seed ^ 0x5eedc1a55ULL;
      for (size_t i = order_.size(); i > 1; --i) {
        std::swap(order_[i - 1], order_[data::uniform_below(&state, i)]);
      }
    }
  }
  std::pair<Tensor, Tensor> train_batch(int64_t step, int64_t m) override {
    if (step != cached_step_) {
      items_ = sampler_.batch_indices(step, global_batch_, rank_, world_);
      cached_step_ = step;
    }
    std::vector<int64_t> which;
    for (int64_t i = m * o_.micro_batch; i < (m + 1) * o_.micro_batch; ++i)
      which.push_back(order_[static_cast<size_t>(items_[static_cast<size_t>(i)])]);
    return to_tensors(data_.read(which));
  }
  std::pair<Tensor, Tensor> val_batch(int64_t k) override {
    std::vector<int64_t> which = own_val_ ? val_sampler_.batch_indices(k, o_.micro_batch)
                                          : val_sampler_.val_batch_indices(k, o_.micro_batch);
    if (!own_val_)
      for (int64_t& w : which) w = order_[static_cast<size_t>(w)];
    return to_tensors(val_data_.read(which));
  }
  bool can_eval() const override {
    return own_val_ ? val_sampler_.num_train_windows() > 0 : val_sampler_.num_val_windows() > 0;
  }

 private:
  std::pair<Tensor, Tensor> to_tensors(data::ExampleBatch b) const {
    const Shape shape(b.shape.begin(), b.shape.end());
    Tensor in =
        b.pixels.empty()
            ? Tensor::from_blob(b.ids.data(), shape, DType::kI64, Device::cpu(), nullptr)
            : Tensor::from_blob(b.pixels.data(), shape, DType::kF32, Device::cpu(), nullptr);
    Tensor labels = Tensor::from_blob(b.labels.data(), {static_cast<int64_t>(b.labels.size())},
                                      DType::kI64, Device::cpu(), nullptr);
    // .to() copies out of the vectors that die here (contiguous() would not on the CPU).
    return {in.clone().to(o_.device), labels.clone().to(o_.device)};
  }
  const data::LabelledExamples& data_;
  const data::LabelledExamples& val_data_;
  const TrainOptions& o_;
  data::WindowSampler sampler_;
  data::WindowSampler val_sampler_;
  bool own_val_;
  std::vector<int64_t> order_;  // item -> example
  int64_t cached_step_ = -1;
  std::vector<int64_t> items_;
};

}  // namespace

json::Value options_to_json(const TrainOptions& o) {
  json::Value v = json::Value::object();
  v.set("steps", json::Value(o.steps));
  v.set("micro_batch", json::Value(o.micro_batch));
  v.set("seq_len", json::Value(o.seq_len));
  v.set("grad_accum", json::Value(o.grad_accum));
  v.set("objective", json::Value(o.objective));
  if (o.objective == "masked_lm") {
    v.set("mask_token", json::Value(o.masking.mask_token));
    v.set("mask_prob", json::Value(o.masking.mask_prob));
  }
  v.set("lr", json::Value(o.lr));
  v.set("min_lr_ratio", json::Value(o.min_lr_ratio));
  v.set("warmup", json::Value(o.warmup));
  v.set("schedule", json::Value(o.schedule));
  v.set("weight_decay", json::Value(o.weight_decay));
  v.set("beta1", json::Value(o.beta1));
  v.set("beta2", json::Value(o.beta2));
  v.set("grad_clip", json::Value(o.grad_clip));
  v.set("seed", json::Value(static_cast<int64_t>(o.seed)));
  v.set("eval_every", json::Value(o.eval_every));
  v.set("eval_batches", json::Value(o.eval_batches));
  v.set("val_fraction", json::Value(o.val_fraction));
  v.set("amp", json::Value(o.amp));
  return v;
}

namespace {

// One call of train(): the parts of a run, each a method: set-up (the constructor), resume,
// one step, evaluation, checkpoint save, and the loop that strings them together.
class TrainLoop {
 public:
  TrainLoop(nn::Module& model, const LossFn& loss_fn, BatchSource& source, const TrainOptions& o,
            const json::Value& config);
  TrainResult run();

 private:
  struct Step {
    double loss = 0;
    double lr = 0;
    double norm = 0;
    double loss_scale = 1.0;
    bool applied = true;
    json::Value module_norms;  // --log-grad-norms on a logged step
  };
  Step step(int64_t step);
  void inject_nan();
  // Mean validation loss, and (with options.eval_fn) accuracy; NaN when not measured.
  std::pair<double, double> evaluate();
  void resume();
  void save(int64_t at_step);
  std::vector<CheckpointPiece> checkpoint_pieces(bool writing, const nn::NamedTensors* full_state);
  bool writes(const std::string& param) const;

  nn::Module& model_;
  const LossFn& loss_fn_;
  BatchSource& source_;
  const TrainOptions& o_;
  // Optimizer state in the single-process layout ("<param>.exp_avg"), as checkpoints hold it.
  const std::vector<std::string> state_suffixes_ = {"exp_avg", "exp_avg_sq"};

  amp::Precision precision_;
  bool scaling_;
  amp::DynamicLossScaler scaler_;
  bool can_eval_;

  DataParallelRuntime* dp_;
  int rank_, world_;
  bool lead_, quiet_;
  nn::NamedTensors params_;  // what this rank trains: its pipeline stages', or the model's
  bool sync_in_dp_ = false;  // model-parallel gradient sums run inside dp's bucket launches
  std::function<void()> after_backward_;
  bool sync_after_ = false;
  OffloadRuntime* offload_;
  bool offload_alone_;
  std::unique_ptr<optim::AdamW> own_opt_;
  optim::Optimizer* opt_ = nullptr;
  bool sharded_checkpoints_;
  bool checkpoint_lead_;
  ModelShardRuntime* shards_;
  optim::LrSchedule sched_;
  json::Value run_config_;
  int64_t global_batch_;
  int64_t resumed_step_ = 0;
  std::optional<SaveDirLock> save_dir_lock_;
};

TrainLoop::TrainLoop(nn::Module& model, const LossFn& loss_fn, BatchSource& source,
                     const TrainOptions& o, const json::Value& config)
    : model_(model),
      loss_fn_(loss_fn),
      source_(source),
      o_(o),
      precision_(amp::parse_precision(o.amp)),
      scaling_(precision_ == amp::Precision::kF16),
      scaler_(amp::LossScalerOptions{.init_scale = o.init_loss_scale,
                                     .growth_interval = o.loss_scale_growth_interval}),
      dp_(o.dp),
      offload_(o.offload),
      shards_(o.model_shards) {
  MAMMOTH_CHECK(o.steps >= 0) << "[train] --steps must be >= 0, got " << o.steps;
  MAMMOTH_CHECK(o.micro_batch > 0) << "[train] --micro-batch must be > 0, got " << o.micro_batch;
  MAMMOTH_CHECK(o.seq_len > 0) << "[train] --seq-len must be > 0, got " << o.seq_len;
  MAMMOTH_CHECK(o.grad_accum > 0) << "[train] --grad-accum must be > 0, got " << o.grad_accum;
  MAMMOTH_CHECK(!o.resume || !o.save_dir.empty()) << "[train] --resume needs --save-dir";
  // One job per checkpoint directory; rank 0 claims it for the whole job.
  if (!o.save_dir.empty() && o.world_rank == 0) save_dir_lock_.emplace(o.save_dir);
  can_eval_ = source_.can_eval();

  rank_ = dp_ ? dp_->dp_rank() : 0;
  world_ = dp_ ? dp_->dp_size() : 1;
  lead_ = rank_ == 0 && o.logging_rank;
  quiet_ = o.quiet || !lead_;
  params_ = o.optimizer_params ? *o.optimizer_params
            : o.trained_params ? *o.trained_params
                               : model.named_parameters();
  // Model-parallel gradient sums run inside dp's bucket launches when dp can run them there,
  // so that the reduction overlaps the backward; otherwise after the whole backward:
  // after_backward, or sync_grad over every parameter.
  sync_in_dp_ = dp_ != nullptr && o.sync_grad && dp_->set_grad_sync(o.sync_grad);
  after_backward_ = o.after_backward;
  if (!after_backward_ && o.sync_grad) {
    after_backward_ = [this] {
      for (const auto& [name, p] : params_) o_.sync_grad(name, p);
    };
  }
  sync_after_ = after_backward_ && !sync_in_dp_;
  // The offload runtime's dp shards the AdamW states by chunk and saves/loads through
  // checkpoint_pieces; without dp it gathers/scatters the single-process state.
  offload_alone_ = offload_ != nullptr && dp_ == nullptr;
  MAMMOTH_CHECK(offload_ == nullptr || dp_ == nullptr || dp_ == offload_->data_parallel())
      << "[train] offload with data parallelism needs the offload runtime's own dp over its "
         "chunks (offload->data_parallel()), not a separate runtime managing the same parameters";
  // Offload under tp or pp (no dp) chunks this rank's shard or stages; checkpoints go through
  // the shard runs like the plain optimizer's state (checkpoint_pieces).
  optim::AdamWOptions ao;
  ao.lr = o.lr;
  ao.beta1 = o.beta1;
  ao.beta2 = o.beta2;
  ao.weight_decay = o.weight_decay;
  // Under ZeRO the optimizer sees this rank's shard slices; decay follows the full parameter.
  if (offload_ == nullptr) {
    DataParallelRuntime* dp = dp_;
    own_opt_ = std::make_unique<optim::AdamW>(
        dp ? dp->optimizer_params() : params_, ao,
        dp ? optim::DecayFilter([dp](const std::string& n, const Tensor&) { return dp->decays(n); })
           : optim::DecayFilter(optim::decay_matrices));
  }
  opt_ = offload_ ? &offload_->optimizer(ao) : own_opt_.get();
  if (own_opt_ && !quiet_) {
    // What the optimizer really allocated (its state tensors), not a formula.
    int64_t state_bytes = 0;
    const nn::NamedTensors state = own_opt_->state();
    for (const auto& [name, t] : state) state_bytes += static_cast<int64_t>(t.nbytes());
    std::fprintf(stderr, "[train] optimizer states: %lld bytes in %zu tensors on this rank\n",
                 static_cast<long long>(state_bytes), state.size());
  }
  // Several processes write one sharded checkpoint together (checkpoint.h).
  sharded_checkpoints_ = o.world_size > 1;
  MAMMOTH_CHECK(!sharded_checkpoints_ ||
                (o.world_barrier && o.world_rank >= 0 && o.world_rank < o.world_size))
      << "[train] world_size " << o.world_size << " needs world_barrier and a world_rank in range";
  MAMMOTH_CHECK(sharded_checkpoints_ || world_ == 1 || o.save_dir.empty())
      << "[train] checkpoints of a run with " << world_
      << " dp ranks need world_rank, world_size and world_barrier";
  checkpoint_lead_ = sharded_checkpoints_ ? o.world_rank == 0 : lead_;
  sched_.kind = optim::LrSchedule::parse_kind(o.schedule);
  sched_.warmup_steps = o.warmup;
  sched_.total_steps = o.steps;
  sched_.min_lr_ratio = o.min_lr_ratio;
  global_batch_ = o.micro_batch * o.grad_accum * world_;
  source_.bind(global_batch_, rank_, world_);
  run_config_ = config.is_object() ? config : json::Value::object();
  const json::Value options = options_to_json(o);
  for (const auto& key : {"micro_batch", "seq_len", "grad_accum", "seed", "objective"}) {
    run_config_.set(key, options.at(key));
  }
  run_config_.set("dp", json::Value(world_));
  run_config_.set("global_batch", json::Value(global_batch_));
}

// "h.0.attn.c_attn.weight.exp_avg" -> "h.0.attn.c_attn.weight".
std::string param_of(const std::string& name, const std::vector<std::string>& suffixes) {
  for (const std::string& suffix : suffixes) {
    const std::string tail = "." + suffix;
    if (name.size() > tail.size() &&
        name.compare(name.size() - tail.size(), tail.size(), tail) == 0) {
      return name.substr(0, name.size() - tail.size());
    }
  }
  return name;
}

// Whether this rank writes what it holds of `param`: one rank per distinct part (a pipeline
// writes a tied parameter from its first stage, tp one rank per shard or replica).
bool TrainLoop::writes(const std::string& param) const {
  return (!o_.writes_parameter || o_.writes_parameter(param)) &&
         (!shards_ || shards_->writes(param));
}

// This rank's parameters and optimizer state as pieces of the single-process tensors: what it
// writes (`writing`), or everything it loads. `full_state`: the single-process state to load
// into when the optimizer's own does not have that layout (offload). Under tensor parallelism
// each piece of a shard is cut into the runs of single-process elements it holds (padding
// dropped).
std::vector<CheckpointPiece> TrainLoop::checkpoint_pieces(bool writing,
                                                          const nn::NamedTensors* full_state) {
  std::vector<CheckpointPiece> held;
  if (dp_) {
    held = dp_->checkpoint_pieces(opt_->state(), state_suffixes_, writing);
  } else {
    for (const auto& [name, p] : params_) held.push_back({name, 0, p});
    // Offload's optimizer state lives in chunks: writing takes host copies of it.
    const nn::NamedTensors gathered =
        offload_alone_ && full_state == nullptr ? offload_->gather_state() : nn::NamedTensors();
    for (const auto& [name, t] : full_state       ? *full_state
                                 : offload_alone_ ? gathered
                                                  : opt_->state()) {
      held.push_back({name, 0, t});
    }
  }
  std::vector<CheckpointPiece> out;
  for (CheckpointPiece& p : held) {
    const std::string param = param_of(p.name, state_suffixes_);
    if (writing && !writes(param)) continue;
    if (!shards_) {
      out.push_back(std::move(p));
      continue;
    }
    const Tensor flat = p.data.reshape({-1});
    for (const ModelShardRuntime::FlatRun& run :
         shards_->single_process_runs(param, p.offset, p.offset + flat.numel())) {
      const int64_t at = run.local - p.offset;
      out.push_back({p.name, run.global, flat.slice(0, at, at + run.length)});
    }
  }
  return out;
}

// Loads save_dir's latest checkpoint (each rank reads the ranges it holds, whichever layout
// wrote it) and sets resumed_step_; none yet: a fresh start.
void TrainLoop::resume() {
  const std::optional<std::string> dir = latest_checkpoint(o_.save_dir);
  if (!dir) {
    if (!quiet_)
      std::fprintf(stderr, "[train] --resume: no checkpoint in %s yet, starting fresh\n",
                   o_.save_dir.c_str());
    return;
  }
  nn::NamedTensors full_state;
  if (offload_alone_) {
    for (const std::string& suffix : state_suffixes_) {
      for (const auto& [name, p] : params_) {
        full_state.emplace_back(name + "." + suffix, Tensor::zeros(p.shape(), p.dtype()));
      }
    }
  }
  // One process holding the whole model also refuses tensors it does not have.
  const bool whole = !dp_ && !shards_ && o_.optimizer_params == nullptr;
  std::vector<CheckpointPiece> into =
      checkpoint_pieces(/*writing=*/false, offload_alone_ ? &full_state : nullptr);
  // Files are read into host memory: a device destination gets a host staging tensor, copied
  // to the device after the load.
  std::vector<std::pair<Tensor, Tensor>> staged;  // (device destination, host staging)
  for (CheckpointPiece& p : into) {
    // Paged storage (offload chunks) may be evicted while the loader writes raw bytes: staged.
    if (p.data.device().is_cpu() && !p.data.storage()->ensure_resident) continue;
    Tensor host = Tensor::empty(p.data.shape(), p.data.dtype());
    staged.emplace_back(p.data, host);
    p.data = host;
  }
  const json::Value state = load_checkpoint_pieces(*dir, into, whole);
  {
    NoGradGuard ng;
    for (const auto& [dst, host] : staged) copy_(dst, host.to(dst.device()));
  }
  if (offload_alone_) offload_->scatter_state(full_state);
  if (dp_) dp_->pieces_loaded();
  check_resume_compatible(state.at("config"), run_config_);
  resumed_step_ = state.at("step").as_int();
  opt_->set_step_count(state.at("optimizer_step").as_int());
  nn::rng_state() = {static_cast<uint64_t>(state.at("rng_seed").as_int()),
                     static_cast<uint64_t>(state.at("rng_offset").as_int())};
  if (const json::Value* s = state.find("loss_scaler"); s != nullptr && scaling_) {
    scaler_.load_state(*s);
  }
  if (!quiet_)
    std::fprintf(stderr, "[train] resumed from %s at step %lld\n", dir->c_str(),
                 static_cast<long long>(resumed_step_));
}

void TrainLoop::save(int64_t at_step) {
  if (o_.save_dir.empty()) return;
  json::Value state = json::Value::object();
  state.set("step", json::Value(at_step));
  state.set("optimizer_step", json::Value(opt_->step_count()));
  state.set("rng_seed", json::Value(static_cast<int64_t>(nn::rng_state().seed)));
  state.set("rng_offset", json::Value(static_cast<int64_t>(nn::rng_state().offset)));
  state.set("loss_scale", json::Value(scaling_ ? scaler_.scale() : 1.0));
  if (scaling_) state.set("loss_scaler", scaler_.state());
  state.set("config", run_config_);
  std::string dir;
  if (sharded_checkpoints_) {
    if (checkpoint_lead_) begin_sharded_checkpoint(o_.save_dir, at_step);
    o_.world_barrier();
    std::vector<CheckpointPiece> pieces = checkpoint_pieces(/*writing=*/true, nullptr);
    for (CheckpointPiece& p : pieces) p.data = to_host(p.data);  // files are written from host
    write_checkpoint_shard(sharded_checkpoint_tmp(o_.save_dir, at_step), o_.world_rank, pieces);
    fault::point("checkpoint");
    o_.world_barrier();
    if (checkpoint_lead_) {
      // The index describes the single-process tensors: the whole model's parameters and
      // their optimizer state.
      ShardedLayout layout;
      layout.world = o_.world_size;
      layout.layout = o_.layout.is_object() ? o_.layout : json::Value::object();
      // (Under tp the model shards map LoRA's pieces too: their single-process tensors first.)
      const nn::NamedTensors whole = shards_             ? shards_->single_process_parameters()
                                     : o_.trained_params ? *o_.trained_params
                                                         : model_.named_parameters();
      layout.tensors = whole;
      for (const std::string& suffix : state_suffixes_) {
        for (const auto& [name, p] : whole) layout.tensors.emplace_back(name + "." + suffix, p);
      }
      dir = commit_sharded_checkpoint(o_.save_dir, at_step,
                                      sharded_checkpoint_tmp(o_.save_dir, at_step), layout, state,
                                      o_.keep_last);
    }
    o_.world_barrier();  // nobody reads `latest` before it is complete
  } else if (lead_) {
    // Device tensors are written through host copies (CPU ones as they are).
    const nn::NamedTensors host_params = to_host(params_);
    const nn::NamedTensors opt_state = to_host(offload_ ? offload_->gather_state() : opt_->state());
    dir = save_checkpoint(o_.save_dir, at_step, {&host_params, &opt_state, state}, o_.keep_last);
  }
  if (checkpoint_lead_ && !quiet_)
    std::fprintf(stderr, "[train] saved checkpoint %s\n", dir.c_str());
  if (checkpoint_lead_ && !dir.empty() && o_.after_checkpoint) o_.after_checkpoint(dir);
}

std::pair<double, double> TrainLoop::evaluate() {
  NoGradGuard ng;
  model_.eval();
  double total = 0;
  int64_t correct = 0, seen = 0;
  amp::AutocastGuard autocast(precision_);
  for (int64_t k = 0; k < o_.eval_batches; ++k) {
    auto [in, tg] = source_.val_batch(k);
    if (o_.eval_fn) {
      const auto [loss, right] = o_.eval_fn(in, tg);
      total += loss;
      correct += right;
      seen += in.size(0);
    } else {
      total += loss_fn_(in, tg).item();
    }
  }
  model_.train();
  const double accuracy = seen > 0 ? static_cast<double>(correct) / static_cast<double>(seen) : NAN;
  return {total / static_cast<double>(o_.eval_batches), accuracy};
}

namespace {

// Each module's gradient L2 norm (its own parameters: "h.0.attn.c_attn" holds .weight and
// .bias), unscaled; in parameter order.
json::Value module_grad_norms(const nn::NamedTensors& params, double loss_scale) {
  std::vector<std::pair<std::string, nn::NamedTensors>> modules;
  for (const auto& [name, p] : params) {
    const size_t dot = name.rfind('.');
    const std::string module = dot == std::string::npos ? name : name.substr(0, dot);
    if (modules.empty() || modules.back().first != module) modules.push_back({module, {}});
    modules.back().second.emplace_back(name, p);
  }
  json::Value norms = json::Value::object();
  for (const auto& [module, ps] : modules) {
    const double n = optim::grad_norm(ps) / loss_scale;
    norms.set(module, std::isfinite(n) ? json::Value(n) : json::Value());  // JSON has no NaN
  }
  return norms;
}

}  // namespace

void TrainLoop::inject_nan() {
  for (const auto& [name, p] : model_.named_parameters()) {
    if (name != o_.inject_nan_param) continue;
    NoGradGuard ng;
    fill_(p.reshape({-1}).slice(0, 0, 1), NAN);
    return;
  }
  MAMMOTH_THROW() << "[train] the NaN test hook names parameter '" << o_.inject_nan_param
                  << "', which this rank's model does not have";
}

// Forward and backward of the step's micro-batches (or the pipeline's schedule over them),
// gradient synchronisation, the global norm, and the update.
TrainLoop::Step TrainLoop::step(int64_t step) {
  fault::set_context(o_.world_rank, step + 1);
  fault::point("forward");
  Step s;
  if (!o_.inject_nan_param.empty() && step == o_.inject_nan_step) inject_nan();
  s.lr = sched_.at(step, o_.lr);
  opt_->set_lr(s.lr);
  s.loss_scale = scaling_ ? scaler_.scale() : 1.0;
  {
    // Forward and backward both multiply under autocast (PyTorch's backward matmuls run in the
    // dtype autocast gave their inputs).
    amp::AutocastGuard autocast(precision_);
    std::vector<Tensor> pipeline_batches;
    for (int64_t m = 0; m < o_.grad_accum; ++m) {
      // Micro-batch m of this rank's contiguous share of the step's global batch.
      auto [in, tg] = source_.train_batch(step, m);
      if (o_.pipeline_step) {
        // Next-token: the window as one row of seq_len + 1 tokens, the input plus its last
        // target. Masked LM: the masked ids, then their targets (LanguageModel::pipeline_*).
        pipeline_batches.push_back(o_.pipeline_pack ? o_.pipeline_pack(in, tg)
                                   : o_.objective == "masked_lm"
                                       ? concat({in, tg}, 1)
                                       : concat({in, tg.slice(1, o_.seq_len - 1, o_.seq_len)}, 1));
        continue;
      }
      // No communication before the last micro-batch; none during backward at all when the
      // gradients must be synchronised within the replica first (after_backward).
      if (dp_) dp_->begin_backward(m == o_.grad_accum - 1 && !sync_after_);
      Tensor loss = loss_fn_(in, tg);
      s.loss += loss.item() / static_cast<double>(o_.grad_accum);
      const double factor = s.loss_scale / static_cast<double>(o_.grad_accum);
      (factor != 1.0 ? mul_scalar(loss, factor) : loss).backward();
    }
    if (o_.pipeline_step) {
      // The schedule interleaves the micro-batches' backwards, so dp reduces once, after all of
      // them (no overlap with the pipeline's backward yet).
      if (dp_) dp_->begin_backward(false);
      s.loss = o_.pipeline_step(pipeline_batches, s.loss_scale);
      if (dp_) dp_->begin_backward(true);
    }
  }
  // Model-parallel gradient sums (sequence-partial, replicated heads) come before the dp
  // reduction, which under ZeRO >= 1 leaves the parameters without their own gradients.
  if (sync_after_) {
    after_backward_();
    if (dp_) dp_->begin_backward(true);  // reduces every bucket in finish_backward
  }
  if (dp_) {
    dp_->finish_backward();
    s.loss = dp_->average(s.loss);
  }
  const nn::NamedTensors& grads_of = opt_->params();
  if (o_.log_grad_norms && (step + 1 == o_.steps || (step + 1) % o_.log_every == 0)) {
    s.module_norms = module_grad_norms(grads_of, s.loss_scale);
  }
  if (step == o_.inject_inf_grad_step) {
    for (const auto& [name, p] : grads_of) {
      if (p.grad().defined()) {
        fill_(p.grad(), INFINITY);
        break;
      }
    }
  }
  // Gradients hold loss_scale * dL/dw; the norm and the update see them unscaled. Under dp the
  // norm is global, so an overflow on any rank makes every rank skip the step.
  s.norm = (o_.grad_norm ? o_.grad_norm()
            : dp_        ? dp_->grad_norm()
                         : optim::grad_norm(grads_of)) /
           s.loss_scale;
  if (scaling_) {
    s.applied = scaler_.update(std::isfinite(s.loss) && std::isfinite(s.norm) &&
                               (dp_ != nullptr || amp::grads_finite(grads_of)));
  } else {
    MAMMOTH_CHECK(std::isfinite(s.loss) && std::isfinite(s.norm))
        << "[train] step " << step << ": loss " << s.loss << ", grad norm " << s.norm
        << " is not finite; lower --lr or check the data";
  }
  fault::point("optimizer");
  if (s.applied) {
    profile::Scope scope(profile::Lane::kCompute, "optimizer");
    if (scope.active()) {
      // What the update must move: each parameter read and written, its gradient read, each
      // state read and written.
      double bytes = 0;
      for (const auto& [name, p] : opt_->params()) {
        bytes += 2.0 * static_cast<double>(p.nbytes());
        if (p.grad().defined()) bytes += static_cast<double>(p.grad().nbytes());
      }
      for (const auto& [name, t] : opt_->state()) bytes += 2.0 * static_cast<double>(t.nbytes());
      std::snprintf(scope.args(), profile::Scope::kArgs, "\"bytes\":%.0f", bytes);
    }
    profile::MemTagScope tag(profile::MemTag::kOptimizer);
    opt_->step(optim::clip_factor(s.norm, o_.grad_clip) / s.loss_scale);
    if (dp_) dp_->after_step();
  }
  opt_->zero_grad();
  if (offload_) offload_->end_step();
  return s;
}

TrainResult TrainLoop::run() {
  // Resets the dp runtime's per-parameter gradient sync when the run ends, however it ends.
  struct GradSyncReset {
    DataParallelRuntime* dp;
    ~GradSyncReset() {
      if (dp) dp->set_grad_sync(nullptr);
    }
  } grad_sync_reset{sync_in_dp_ ? dp_ : nullptr};
  TrainResult result;
  result.last_val_loss = NAN;
  result.last_val_accuracy = NAN;
  nn::rng_state() = {o_.seed, 0};
  if (o_.resume) resume();
  int64_t step = resumed_step_;
  result.first_step = step;
  std::optional<AnomalyDetectionScope> anomaly;
  if (o_.detect_anomaly) {
    anomaly.emplace(model_.named_parameters(), "rank " + std::to_string(o_.world_rank) + " of " +
                                                   std::to_string(o_.world_size));
  }
  MetricsSink sink(lead_ ? MetricsSinkOptions{.console = !quiet_,
                                              .log_every = o_.log_every,
                                              .metrics_path = o_.metrics_path,
                                              .append = o_.resume,
                                              .tensorboard_dir = o_.tensorboard_dir}
                         : MetricsSinkOptions{.console = false});
  SignalScope signals;
  model_.train();
  const double tokens_per_step = static_cast<double>(global_batch_ * o_.seq_len);
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t start_step = step;
  while (step < o_.steps) {
    if (o_.on_step) o_.on_step(step, true);
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = process_cpu_seconds();
    memory::allocator_for(o_.device).reset_peak();
    Step s;
    {
      profile::Scope scope(profile::Lane::kCompute, "step");
      // The memory tracer's default in a step: the forward's tensors (backward, gradients
      // and the optimizer set their own tags).
      profile::MemTagScope tag(profile::MemTag::kActivations);
      if (scope.active())
        std::snprintf(scope.args(), profile::Scope::kArgs, "\"step\":%lld",
                      static_cast<long long>(step));
      s = this->step(step);
    }
    if (o_.on_step) o_.on_step(step, false);
    ++step;
    result.losses.push_back(s.loss);
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - t0).count();
    const double cpu_dt = process_cpu_seconds() - cpu0;
    const double elapsed = std::chrono::duration<double>(now - t_start).count();
    double val_loss = NAN, val_accuracy = NAN;
    if (can_eval_ && o_.eval_every > 0 && (step % o_.eval_every == 0 || step == o_.steps)) {
      std::tie(val_loss, val_accuracy) = evaluate();
      result.last_val_loss = val_loss;
      result.last_val_accuracy = val_accuracy;
    }
    // The peak of the device the model trains on (the CPU's, or the CUDA caching allocator's).
    const int64_t peak = memory::allocator_for(o_.device).stats().peak_bytes;
    if (step == start_step + 1 && o_.report_peak_memory) o_.report_peak_memory(peak);
    StepRecord r;
    r.step = step;
    r.steps = o_.steps;
    r.loss = s.loss;
    r.lr = s.lr;
    r.grad_norm = s.norm;
    r.grad_norms = s.module_norms;
    r.loss_scale = s.loss_scale;
    r.scaling = scaling_;
    r.skipped_steps = scaler_.skipped_steps();
    r.applied = s.applied;
    r.tokens_per_s = tokens_per_step / dt;
    r.step_s = dt;
    r.cpu_s = cpu_dt;
    r.predicted_step_s = o_.predicted_step_s;
    r.predicted_peak_mem_bytes = o_.predicted_peak_mem_bytes;
    if (o_.flops_per_token > 0 && o_.peak_flops > 0)
      r.mfu = o_.flops_per_token * r.tokens_per_s / o_.peak_flops;
    r.peak_mem_bytes = peak;
    r.val_loss = val_loss;
    r.val_accuracy = val_accuracy;
    r.eta_s =
        elapsed / static_cast<double>(step - start_step) * static_cast<double>(o_.steps - step);
    // The chunk tiers are only written to the metrics file.
    if (offload_ && lead_ && !o_.metrics_path.empty()) r.offload = offload_->metrics();
    if (o_.step_metrics && !o_.metrics_path.empty()) {
      json::Value extra = o_.step_metrics();  // on every rank: it may be collective
      if (lead_) r.extra = std::move(extra);
    }
    sink.record(r);
    if (o_.save_every > 0 && step % o_.save_every == 0 && step < o_.steps) save(step);
    // Every rank must stop at the same step (saving is collective): agree on the signal.
    const bool signalled = g_signal.load() != 0;
    const bool stop = o_.world_any ? o_.world_any(signalled)
                      : dp_        ? dp_->average(signalled ? 1.0 : 0.0) > 0
                                   : signalled;
    if (stop) {
      if (!quiet_) {
        std::fprintf(stderr, "[train] %s: saving and stopping at step %lld\n",
                     signalled ? ("signal " + std::to_string(g_signal.load())).c_str()
                               : "a signal on another rank",
                     static_cast<long long>(step));
      }
      result.interrupted = true;
      break;
    }
  }
  if (step > start_step || result.interrupted) save(step);
  result.last_step = step;
  result.skipped_steps = scaler_.skipped_steps();
  result.loss_scale = scaling_ ? scaler_.scale() : 1.0;
  return result;
}

}  // namespace

TrainResult train(nn::Module& model, const LossFn& loss_fn, const data::TokenDataset& data,
                  const data::TokenDataset& val, const TrainOptions& o, const json::Value& config) {
  TokenWindows source(data, val, o);
  // An error on one rank of several ends the whole job in tools/mammoth.cc (MPI_Abort).
  TrainLoop loop(model, loss_fn, source, o, config);
  return loop.run();
}

TrainResult train(nn::Module& model, const LossFn& loss_fn, const data::LabelledExamples& data,
                  const data::LabelledExamples* val, const TrainOptions& o,
                  const json::Value& config) {
  ExampleBatches source(data, val, o);
  // The examples are part of what a checkpoint continues (the trainer compares "data").
  json::Value c = config.is_object() ? config : json::Value::object();
  c.set("data",
        json::Value(data.describe() + (val ? "; validation " + val->describe() : std::string())));
  TrainLoop loop(model, loss_fn, source, o, c);
  return loop.run();
}

}  // namespace mammoth::engine::train
