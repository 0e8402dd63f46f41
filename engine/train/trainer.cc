#include "engine/train/trainer.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>

#include "engine/amp/amp.h"
#include "engine/autograd.h"
#include "engine/data/sampler.h"
#include "engine/nn/rng.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "engine/train/checkpoint.h"
#include "engine/train/device.h"
#include "engine/train/tensorboard.h"
#include "memory/allocator.h"

namespace mammoth::engine::train {
namespace {

std::atomic<int> g_signal{0};
extern "C" void on_signal(int sig) { g_signal.store(sig); }

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
std::pair<Tensor, Tensor> make_batch(const data::TokenDataset& d, const data::WindowSampler& s,
                                     const std::vector<int64_t>& windows, Device device,
                                     const data::MaskingRule* mlm,
                                     const std::vector<int64_t>& epochs = {}) {
  const int64_t B = static_cast<int64_t>(windows.size()), T = s.seq_len();
  std::vector<int32_t> in(static_cast<size_t>(B * T)), tg(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b) {
    data::read_window(d, s, windows[b], in.data() + b * T, tg.data() + b * T);
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

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  return buf;
}

// Fields whose change makes a checkpoint's continuation meaningless.
void check_resume_compatible(const json::Value& saved, const json::Value& now) {
  for (const char* key : {"model", "global_batch", "seq_len", "seed", "objective"}) {
    const json::Value* a = saved.find(key);
    const json::Value* b = now.find(key);
    if (a == nullptr || b == nullptr) continue;
    MAMMOTH_CHECK(json::dump(*a) == json::dump(*b))
        << "[train] --resume: the checkpoint was written with " << key << " = " << json::dump(*a)
        << " but this run has " << key << " = " << json::dump(*b);
  }
}

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

TrainResult train(nn::Module& model, const LossFn& loss_fn, const data::TokenDataset& data,
                  const data::TokenDataset& val, const TrainOptions& o, const json::Value& config) {
  MAMMOTH_CHECK(o.steps >= 0) << "[train] --steps must be >= 0, got " << o.steps;
  MAMMOTH_CHECK(o.micro_batch > 0) << "[train] --micro-batch must be > 0, got " << o.micro_batch;
  MAMMOTH_CHECK(o.seq_len > 0) << "[train] --seq-len must be > 0, got " << o.seq_len;
  MAMMOTH_CHECK(o.grad_accum > 0) << "[train] --grad-accum must be > 0, got " << o.grad_accum;
  MAMMOTH_CHECK(!o.resume || !o.save_dir.empty()) << "[train] --resume needs --save-dir";
  // One job per checkpoint directory; rank 0 claims it for the whole job.
  std::optional<SaveDirLock> save_dir_lock;
  if (!o.save_dir.empty() && o.world_rank == 0) save_dir_lock.emplace(o.save_dir);
  const amp::Precision precision = amp::parse_precision(o.amp);
  const bool scaling = precision == amp::Precision::kF16;
  amp::LossScalerOptions so;
  so.init_scale = o.init_loss_scale;
  so.growth_interval = o.loss_scale_growth_interval;
  amp::DynamicLossScaler scaler(so);
  MAMMOTH_CHECK(o.objective == "next_token" || o.objective == "masked_lm")
      << "[train] objective must be next_token or masked_lm, got '" << o.objective << "'";
  std::unique_ptr<data::MaskingRule> mlm;
  if (o.objective == "masked_lm") {
    MAMMOTH_CHECK(!o.pipeline_step)
        << "[train] the masked-LM objective has no pipeline-parallel form (a stage carries a "
           "window as seq_len + 1 tokens of next-token data; BERT has no pipeline stages): "
           "use --pp 1";
    data::MaskingOptions mo = o.masking;
    mo.seed = o.seed;
    mlm = std::make_unique<data::MaskingRule>(mo);
  }
  const bool own_val = val.size() > 0;
  data::WindowSampler sampler(data.size(), o.seq_len, o.seed, own_val ? 0.0 : o.val_fraction);
  MAMMOTH_CHECK(sampler.num_train_windows() > 0)
      << "[train] the training data has " << data.size() << " tokens: too few for one window of "
      << o.seq_len + 1;
  // Validation windows in order: all of `val`, or the held-out tail of `data`.
  data::WindowSampler val_sampler(own_val ? val.size() : data.size(), o.seq_len, o.seed,
                                  own_val ? 0.0 : o.val_fraction, false);
  const data::TokenDataset& val_data = own_val ? val : data;
  const bool can_eval =
      own_val ? val_sampler.num_train_windows() > 0 : val_sampler.num_val_windows() > 0;
  auto val_windows = [&](int64_t k) {
    return own_val ? val_sampler.batch_indices(k, o.micro_batch)
                   : val_sampler.val_batch_indices(k, o.micro_batch);
  };

  optim::AdamWOptions ao;
  ao.lr = o.lr;
  ao.beta1 = o.beta1;
  ao.beta2 = o.beta2;
  ao.weight_decay = o.weight_decay;
  DataParallelRuntime* dp = o.dp;
  const int rank = dp ? dp->dp_rank() : 0, world = dp ? dp->dp_size() : 1;
  const bool lead = rank == 0 && o.logging_rank;
  const bool quiet = o.quiet || !lead;
  // What this rank trains: its pipeline stages' parameters, or the whole model.
  const nn::NamedTensors params =
      o.optimizer_params ? *o.optimizer_params : model.named_parameters();
  // Model-parallel gradient sums run inside dp's bucket launches when dp can run them there,
  // so that the reduction overlaps the backward; otherwise after the whole backward.
  const bool sync_in_dp = dp != nullptr && o.sync_grad && dp->set_grad_sync(o.sync_grad);
  struct GradSyncReset {
    DataParallelRuntime* dp;
    ~GradSyncReset() {
      if (dp) dp->set_grad_sync(nullptr);
    }
  } grad_sync_reset{sync_in_dp ? dp : nullptr};
  // Otherwise after the backward: after_backward, or sync_grad over every parameter.
  std::function<void()> after_backward = o.after_backward;
  if (!after_backward && o.sync_grad) {
    after_backward = [&o, &params] {
      for (const auto& [name, p] : params) o.sync_grad(name, p);
    };
  }
  const bool sync_after = after_backward && !sync_in_dp;
  OffloadRuntime* offload = o.offload;
  MAMMOTH_CHECK(offload == nullptr || dp == nullptr || dp == offload->data_parallel())
      << "[train] --offload with data parallelism (--dp " << world
      << ") needs the offload runtime's own dp over its chunks (offload->data_parallel()), not "
         "a separate runtime managing the same parameters";
  // The offload runtime's dp shards the AdamW states by chunk and saves/loads through
  // checkpoint_pieces; without dp it gathers/scatters the single-process state.
  const bool offload_alone = offload != nullptr && dp == nullptr;
  // Under ZeRO the optimizer sees this rank's shard slices; decay follows the full parameter.
  std::unique_ptr<optim::AdamW> own_opt;
  if (offload == nullptr) {
    own_opt = std::make_unique<optim::AdamW>(
        dp ? dp->optimizer_params() : params, ao,
        dp ? optim::DecayFilter([dp](const std::string& n, const Tensor&) { return dp->decays(n); })
           : optim::DecayFilter(optim::decay_matrices));
  }
  optim::Optimizer& opt = offload ? offload->optimizer(ao) : *own_opt;
  // Optimizer state in the single-process layout ("<param>.exp_avg"), as checkpoints hold it.
  const std::vector<std::string> state_suffixes = {"exp_avg", "exp_avg_sq"};
  // Several processes write one sharded checkpoint together (checkpoint.h).
  const bool sharded_checkpoints = o.world_size > 1;
  MAMMOTH_CHECK(!sharded_checkpoints ||
                (o.world_barrier && o.world_rank >= 0 && o.world_rank < o.world_size))
      << "[train] world_size " << o.world_size << " needs world_barrier and a world_rank in range";
  MAMMOTH_CHECK(sharded_checkpoints || world == 1 || o.save_dir.empty())
      << "[train] checkpoints of a run with " << world
      << " dp ranks need world_rank, world_size and world_barrier";
  const bool checkpoint_lead = sharded_checkpoints ? o.world_rank == 0 : lead;
  ModelShardRuntime* shards = o.model_shards;
  MAMMOTH_CHECK(shards == nullptr || offload == nullptr)
      << "[train] offload with tensor parallelism is not supported";
  // "h.0.attn.c_attn.weight.exp_avg" -> "h.0.attn.c_attn.weight".
  auto param_of = [&](const std::string& name) {
    for (const std::string& suffix : state_suffixes) {
      const std::string tail = "." + suffix;
      if (name.size() > tail.size() &&
          name.compare(name.size() - tail.size(), tail.size(), tail) == 0) {
        return name.substr(0, name.size() - tail.size());
      }
    }
    return name;
  };
  // Whether this rank writes what it holds of `param`: one rank per distinct part (a pipeline
  // writes a tied parameter from its first stage, tp one rank per shard or replica).
  auto writes = [&](const std::string& param) {
    return (!o.writes_parameter || o.writes_parameter(param)) && (!shards || shards->writes(param));
  };
  // This rank's parameters and optimizer state as pieces of the single-process tensors: what
  // it writes (`writing`), or everything it loads. `full_state`: the single-process state to
  // load into when the optimizer's own does not have that layout (offload). Under tensor
  // parallelism each piece of a shard is cut into the runs of single-process elements it holds
  // (padding dropped).
  auto checkpoint_pieces = [&](bool writing, const nn::NamedTensors* full_state) {
    std::vector<CheckpointPiece> held;
    if (dp) {
      held = dp->checkpoint_pieces(opt.state(), state_suffixes, writing);
    } else {
      for (const auto& [name, p] : params) held.push_back({name, 0, p});
      for (const auto& [name, t] : full_state ? *full_state : opt.state()) {
        held.push_back({name, 0, t});
      }
    }
    std::vector<CheckpointPiece> out;
    for (CheckpointPiece& p : held) {
      const std::string param = param_of(p.name);
      if (writing && !writes(param)) continue;
      if (!shards) {
        out.push_back(std::move(p));
        continue;
      }
      const Tensor flat = p.data.reshape({-1});
      for (const ModelShardRuntime::FlatRun& run :
           shards->single_process_runs(param, p.offset, p.offset + flat.numel())) {
        const int64_t at = run.local - p.offset;
        out.push_back({p.name, run.global, flat.slice(0, at, at + run.length)});
      }
    }
    return out;
  };
  optim::LrSchedule sched;
  sched.kind = optim::LrSchedule::parse_kind(o.schedule);
  sched.warmup_steps = o.warmup;
  sched.total_steps = o.steps;
  sched.min_lr_ratio = o.min_lr_ratio;

  json::Value run_config = config.is_object() ? config : json::Value::object();
  for (const auto& key : {"micro_batch", "seq_len", "grad_accum", "seed", "objective"}) {
    run_config.set(key, options_to_json(o).at(key));
  }
  run_config.set("dp", json::Value(world));
  run_config.set("global_batch", json::Value(o.micro_batch * o.grad_accum * world));

  TrainResult result;
  result.last_val_loss = NAN;
  int64_t step = 0;
  nn::rng_state() = {o.seed, 0};
  if (o.resume) {
    if (auto dir = latest_checkpoint(o.save_dir)) {
      // Each rank reads the ranges it holds, whichever layout wrote the checkpoint.
      nn::NamedTensors full_state;
      if (offload_alone) {
        for (const std::string& suffix : state_suffixes) {
          for (const auto& [name, p] : params) {
            full_state.emplace_back(name + "." + suffix, Tensor::zeros(p.shape(), p.dtype()));
          }
        }
      }
      // One process holding the whole model also refuses tensors it does not have.
      const bool whole = !dp && !shards && o.optimizer_params == nullptr;
      std::vector<CheckpointPiece> into =
          checkpoint_pieces(/*writing=*/false, offload_alone ? &full_state : nullptr);
      // Files are read into host memory: a device destination gets a host staging tensor,
      // copied to the device after the load.
      std::vector<std::pair<Tensor, Tensor>> staged;  // (device destination, host staging)
      for (CheckpointPiece& p : into) {
        if (p.data.device().is_cpu()) continue;
        Tensor host = Tensor::empty(p.data.shape(), p.data.dtype());
        staged.emplace_back(p.data, host);
        p.data = host;
      }
      const json::Value state = load_checkpoint_pieces(*dir, into, whole);
      {
        NoGradGuard ng;
        for (const auto& [dst, host] : staged) copy_(dst, host.to(dst.device()));
      }
      if (offload_alone) offload->scatter_state(full_state);
      if (dp) dp->pieces_loaded();
      check_resume_compatible(state.at("config"), run_config);
      step = state.at("step").as_int();
      opt.set_step_count(state.at("optimizer_step").as_int());
      nn::rng_state() = {static_cast<uint64_t>(state.at("rng_seed").as_int()),
                         static_cast<uint64_t>(state.at("rng_offset").as_int())};
      if (const json::Value* s = state.find("loss_scaler"); s != nullptr && scaling) {
        scaler.load_state(*s);
      }
      if (!quiet)
        std::fprintf(stderr, "[train] resumed from %s at step %lld\n", dir->c_str(),
                     static_cast<long long>(step));
    } else if (!quiet) {
      std::fprintf(stderr, "[train] --resume: no checkpoint in %s yet, starting fresh\n",
                   o.save_dir.c_str());
    }
  }
  result.first_step = step;

  std::unique_ptr<TensorBoardWriter> tensorboard;
  if (lead && !o.tensorboard_dir.empty())
    tensorboard = std::make_unique<TensorBoardWriter>(o.tensorboard_dir);

  std::ofstream metrics;
  if (lead && !o.metrics_path.empty()) {
    metrics.open(o.metrics_path, o.resume ? std::ios::app : std::ios::trunc);
    MAMMOTH_CHECK(metrics.good()) << "[train] cannot open --metrics " << o.metrics_path;
  }

  auto save = [&](int64_t at_step) {
    if (o.save_dir.empty()) return;
    json::Value state = json::Value::object();
    state.set("step", json::Value(at_step));
    state.set("optimizer_step", json::Value(opt.step_count()));
    state.set("rng_seed", json::Value(static_cast<int64_t>(nn::rng_state().seed)));
    state.set("rng_offset", json::Value(static_cast<int64_t>(nn::rng_state().offset)));
    state.set("loss_scale", json::Value(scaling ? scaler.scale() : 1.0));
    if (scaling) state.set("loss_scaler", scaler.state());
    state.set("config", run_config);
    std::string dir;
    if (sharded_checkpoints) {
      if (checkpoint_lead) begin_sharded_checkpoint(o.save_dir, at_step);
      o.world_barrier();
      std::vector<CheckpointPiece> pieces = checkpoint_pieces(/*writing=*/true, nullptr);
      for (CheckpointPiece& p : pieces) p.data = to_host(p.data);  // files are written from host
      write_checkpoint_shard(sharded_checkpoint_tmp(o.save_dir, at_step), o.world_rank, pieces);
      o.world_barrier();
      if (checkpoint_lead) {
        // The index describes the single-process tensors: the whole model's parameters and
        // their optimizer state.
        ShardedLayout layout;
        layout.world = o.world_size;
        layout.layout = o.layout.is_object() ? o.layout : json::Value::object();
        const nn::NamedTensors whole =
            shards ? shards->single_process_parameters() : model.named_parameters();
        layout.tensors = whole;
        for (const std::string& suffix : state_suffixes) {
          for (const auto& [name, p] : whole) layout.tensors.emplace_back(name + "." + suffix, p);
        }
        dir = commit_sharded_checkpoint(o.save_dir, at_step,
                                        sharded_checkpoint_tmp(o.save_dir, at_step), layout, state,
                                        o.keep_last);
      }
      o.world_barrier();  // nobody reads `latest` before it is complete
    } else if (lead) {
      // Device tensors are written through host copies (CPU ones as they are).
      const nn::NamedTensors host_params = to_host(params);
      const nn::NamedTensors opt_state = to_host(offload ? offload->gather_state() : opt.state());
      dir = save_checkpoint(o.save_dir, at_step, {&host_params, &opt_state, state}, o.keep_last);
    }
    if (checkpoint_lead && !quiet)
      std::fprintf(stderr, "[train] saved checkpoint %s\n", dir.c_str());
  };

  auto evaluate = [&]() {
    NoGradGuard ng;
    model.eval();
    double total = 0;
    amp::AutocastGuard autocast(precision);
    for (int64_t k = 0; k < o.eval_batches; ++k) {
      auto [in, tg] = make_batch(val_data, val_sampler, val_windows(k), o.device, mlm.get());
      total += loss_fn(in, tg).item();
    }
    model.train();
    return total / static_cast<double>(o.eval_batches);
  };

  SignalScope signals;
  model.train();
  const int64_t global_batch = o.micro_batch * o.grad_accum * world;
  const double tokens_per_step = static_cast<double>(global_batch * o.seq_len);
  const auto t_start = std::chrono::steady_clock::now();
  const int64_t start_step = step;
  while (step < o.steps) {
    const auto t0 = std::chrono::steady_clock::now();
    memory::allocator_for(o.device).reset_peak();
    const double lr = sched.at(step, o.lr);
    opt.set_lr(lr);
    // This rank's contiguous share of the step's global batch.
    const std::vector<int64_t> windows = sampler.batch_indices(step, global_batch, rank, world);
    // The epoch each window is read in: masked-LM draws new masks every epoch.
    const std::vector<int64_t> epochs =
        mlm ? sampler.batch_epochs(step, global_batch, rank, world) : std::vector<int64_t>();
    double step_loss = 0;
    const double loss_scale = scaling ? scaler.scale() : 1.0;
    {
      // Forward and backward both multiply under autocast (PyTorch's backward matmuls run in
      // the dtype autocast gave their inputs).
      amp::AutocastGuard autocast(precision);
      std::vector<Tensor> pipeline_batches;
      for (int64_t m = 0; m < o.grad_accum; ++m) {
        const std::vector<int64_t> part(windows.begin() + m * o.micro_batch,
                                        windows.begin() + (m + 1) * o.micro_batch);
        const std::vector<int64_t> part_epochs =
            mlm ? std::vector<int64_t>(epochs.begin() + m * o.micro_batch,
                                       epochs.begin() + (m + 1) * o.micro_batch)
                : std::vector<int64_t>();
        auto [in, tg] = make_batch(data, sampler, part, o.device, mlm.get(), part_epochs);
        if (o.pipeline_step) {
          // The window as one row of seq_len + 1 tokens: the input plus its last target.
          pipeline_batches.push_back(concat({in, tg.slice(1, o.seq_len - 1, o.seq_len)}, 1));
          continue;
        }
        // No communication before the last micro-batch; none during backward at all when the
        // gradients must be synchronised within the replica first (after_backward).
        if (dp) dp->begin_backward(m == o.grad_accum - 1 && !sync_after);
        Tensor loss = loss_fn(in, tg);
        step_loss += loss.item() / static_cast<double>(o.grad_accum);
        const double factor = loss_scale / static_cast<double>(o.grad_accum);
        (factor != 1.0 ? mul_scalar(loss, factor) : loss).backward();
      }
      if (o.pipeline_step) {
        // The schedule interleaves the micro-batches' backwards, so dp reduces once, after all
        // of them (no overlap with the pipeline's backward yet).
        if (dp) dp->begin_backward(false);
        step_loss = o.pipeline_step(pipeline_batches, loss_scale);
        if (dp) dp->begin_backward(true);
      }
    }
    // Model-parallel gradient sums (sequence-partial, replicated heads) come before the dp
    // reduction, which under ZeRO >= 1 leaves the parameters without their own gradients.
    if (sync_after) {
      after_backward();
      if (dp) dp->begin_backward(true);  // reduces every bucket in finish_backward
    }
    if (dp) {
      dp->finish_backward();
      step_loss = dp->average(step_loss);
    }
    const nn::NamedTensors& grads_of = opt.params();
    if (step == o.inject_inf_grad_step) {
      for (const auto& [name, p] : grads_of) {
        if (p.grad().defined()) {
          fill_(p.grad(), INFINITY);
          break;
        }
      }
    }
    // Gradients hold loss_scale * dL/dw; the norm and the update see them unscaled.
    // Under dp the norm is global, so an overflow on any rank makes every rank skip the step.
    const double norm = (o.grad_norm ? o.grad_norm()
                         : dp        ? dp->grad_norm()
                                     : optim::grad_norm(grads_of)) /
                        loss_scale;
    bool applied = true;
    if (scaling) {
      applied = scaler.update(std::isfinite(step_loss) && std::isfinite(norm) &&
                              (dp != nullptr || amp::grads_finite(grads_of)));
    } else {
      MAMMOTH_CHECK(std::isfinite(step_loss) && std::isfinite(norm))
          << "[train] step " << step << ": loss " << step_loss << ", grad norm " << norm
          << " is not finite; lower --lr or check the data";
    }
    if (applied) {
      opt.step(optim::clip_factor(norm, o.grad_clip) / loss_scale);
      if (dp) dp->after_step();
    }
    opt.zero_grad();
    if (offload) offload->end_step();
    ++step;
    result.losses.push_back(step_loss);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    const double tok_s = tokens_per_step / dt;
    const double eta =
        elapsed / static_cast<double>(step - start_step) * static_cast<double>(o.steps - step);
    double val_loss = NAN;
    if (can_eval && o.eval_every > 0 && (step % o.eval_every == 0 || step == o.steps)) {
      val_loss = evaluate();
      result.last_val_loss = val_loss;
    }
    // The peak of the device the model trains on (the CPU's, or the CUDA caching allocator's).
    const int64_t peak = memory::allocator_for(o.device).stats().peak_bytes;
    if (step == start_step + 1 && o.report_peak_memory) o.report_peak_memory(peak);
    const double mfu =
        o.flops_per_token > 0 && o.peak_flops > 0 ? o.flops_per_token * tok_s / o.peak_flops : 0;
    if (metrics.is_open()) {
      json::Value m = json::Value::object();
      m.set("step", json::Value(step));
      // JSON has no inf/NaN: a skipped fp16 step's non-finite values are written as null.
      auto number = [](double d) { return std::isfinite(d) ? json::Value(d) : json::Value(); };
      m.set("loss", number(step_loss));
      m.set("lr", json::Value(lr));
      m.set("grad_norm", number(norm));
      m.set("loss_scale", json::Value(loss_scale));
      m.set("skipped_steps", json::Value(scaler.skipped_steps()));
      if (!applied) m.set("skipped", json::Value(true));
      m.set("tokens_per_s", json::Value(tok_s));
      if (o.flops_per_token > 0 && o.peak_flops > 0) m.set("mfu", json::Value(mfu));
      m.set("peak_mem_bytes", json::Value(peak));
      if (!std::isnan(val_loss)) m.set("val_loss", json::Value(val_loss));
      if (offload) m.set("offload", offload->metrics());
      metrics << json::dump(m) << "\n";
      metrics.flush();
    }
    if (tensorboard) {
      std::vector<std::pair<std::string, float>> scalars = {
          {"train/loss", static_cast<float>(step_loss)},
          {"train/lr", static_cast<float>(lr)},
          {"train/grad_norm", static_cast<float>(norm)},
          {"train/tokens_per_s", static_cast<float>(tok_s)},
          {"train/peak_mem_bytes", static_cast<float>(peak)}};
      if (scaling) {
        scalars.emplace_back("train/loss_scale", static_cast<float>(loss_scale));
        scalars.emplace_back("train/skipped_steps", static_cast<float>(scaler.skipped_steps()));
      }
      if (o.flops_per_token > 0 && o.peak_flops > 0)
        scalars.emplace_back("train/mfu", static_cast<float>(mfu));
      if (!std::isnan(val_loss)) scalars.emplace_back("val/loss", static_cast<float>(val_loss));
      tensorboard->add_scalars(step, scalars);
      tensorboard->flush();
    }
    if (!quiet && (step % std::max<int64_t>(o.log_every, 1) == 0 || step == o.steps ||
                   !std::isnan(val_loss))) {
      std::fprintf(stderr,
                   "step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | ETA %s",
                   static_cast<long long>(step), static_cast<long long>(o.steps), step_loss, lr,
                   norm, tok_s, format_duration(eta).c_str());
      if (!std::isnan(val_loss)) std::fprintf(stderr, " | val %.4f", val_loss);
      if (scaling) std::fprintf(stderr, " | scale %g", loss_scale);
      if (!applied) std::fprintf(stderr, " | skipped (inf/NaN gradients)");
      std::fprintf(stderr, "\n");
    }
    if (o.save_every > 0 && step % o.save_every == 0 && step < o.steps) save(step);
    // Every rank must stop at the same step (saving is collective): agree on the signal.
    const bool stop = dp ? dp->average(g_signal.load() != 0 ? 1.0 : 0.0) > 0 : g_signal.load() != 0;
    if (stop) {
      if (!quiet)
        std::fprintf(stderr, "[train] signal %d: saving and stopping at step %lld\n",
                     g_signal.load(), static_cast<long long>(step));
      result.interrupted = true;
      break;
    }
  }
  if (step > start_step || result.interrupted) save(step);
  result.last_step = step;
  result.skipped_steps = scaler.skipped_steps();
  result.loss_scale = scaling ? scaler.scale() : 1.0;
  return result;
}

}  // namespace mammoth::engine::train
