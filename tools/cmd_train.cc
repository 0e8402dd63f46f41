// `mammoth train`: trains a model-zoo language model on llm.c token shards, or, with no
// --data, on the embedded default corpus (tokenized once and cached). GPT-2 and LLaMA learn
// next-token prediction; the BERT family learns masked-LM (engine/data/masking.h: --mask-prob,
// --mask-token), the same rule `mammoth eval` scores. Instruction data (a directory `mammoth
// data` made from .jsonl, or a .jsonl file tokenized here with the --tokenizer / --model
// directory) trains with the loss on the responses only (--loss-on response, its default).

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/error.h"
#include "base/json.h"
#include "base/thread_pool.h"
#include "engine/autograd.h"
#include "engine/data/bpe.h"
#include "engine/data/build_shards.h"
#include "engine/data/instruction_data.h"
#include "engine/data/masking.h"
#include "engine/data/token_shard.h"
#include "engine/profile/session.h"
#include "engine/train/checkpoint.h"
#include "engine/train/device.h"
#include "engine/train/trainer.h"
#include "memory/allocator.h"
#include "memory/chunks/chunk_manager.h"
#include "models/analyze.h"
#include "models/family.h"
#include "models/lora.h"
#include "models/mixtral/mixtral.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/mesh.h"
#include "plan/calibrate.h"
#include "plan/cluster.h"
#include "plan/memory_model.h"
#include "plan/offload_traffic.h"
#include "plan/parallel_plan.h"
#include "plan/search.h"
#include "plan/time_model.h"
#include "runtime/runtime.h"
#include "tools/command.h"
#include "tools/default_corpus.h"
#include "tools/masked_lm.h"
#include "tools/plan_flags.h"
#include "tools/train_classify.h"

ABSL_FLAG(std::string, model, "gpt2-tiny", "registered model name or Hugging Face model directory");
ABSL_FLAG(std::string, data, "",
          "token shards (file, glob or directory of llm.c .bin files), instruction data (a "
          "directory `mammoth data` wrote from .jsonl, or a .jsonl file); empty: the embedded "
          "corpus");
ABSL_FLAG(std::string, loss_on, "",
          "instruction data: which next-token targets count, response (the assistant turns and "
          "what closes them; the default for instruction data) or all (prompts too; never "
          "padding)");
ABSL_DECLARE_FLAG(std::string, tokenizer);
ABSL_FLAG(std::string, val_data, "", "validation shards; empty: hold out --val-fraction of --data");
ABSL_FLAG(int64_t, steps, 300, "optimizer steps");
ABSL_FLAG(int64_t, micro_batch, 8, "sequences per micro-batch");
ABSL_FLAG(int64_t, seq_len, 64, "tokens per sequence");
ABSL_FLAG(int64_t, grad_accum, 1, "micro-batches accumulated per step");
ABSL_FLAG(double, lr, 3e-3, "peak learning rate");
ABSL_FLAG(double, min_lr_ratio, 0.1, "final learning rate as a fraction of --lr");
ABSL_FLAG(int64_t, warmup, 30, "linear warmup steps");
ABSL_FLAG(std::string, schedule, "cosine", "learning-rate decay: constant, cosine or linear");
ABSL_FLAG(double, weight_decay, 0.1, "AdamW weight decay (matrices only)");
ABSL_FLAG(double, grad_clip, 1.0, "global gradient-norm clip (0: off)");
ABSL_FLAG(double, dropout, 0.0, "dropout probability");
ABSL_FLAG(double, moe_aux_loss_coef, 0.0,
          "mixture of experts: the load-balancing loss's coefficient (unset: the model's "
          "router_aux_loss_coef when its output_router_logits is on; 0: off)");
ABSL_FLAG(double, moe_capacity_factor, 0.0,
          "mixture of experts: tokens per expert capped at ceil(factor * tokens * top_k / "
          "experts) per forward, the rest dropped (0: dropless, as Hugging Face)");
ABSL_FLAG(int64_t, seed, 1337, "seed for initialisation, data order and dropout");
ABSL_FLAG(bool, fresh_init, false,
          "initialise a model directory's parameters from --seed instead of loading its weights "
          "(without it, a directory with no weights is an error)");
ABSL_FLAG(std::string, amp, "fp32",
          "compute precision: fp32, bf16 (autocast matmuls, fp32 master weights) or fp16 "
          "(autocast plus dynamic loss scaling)");
ABSL_FLAG(double, loss_scale, 65536.0, "--amp fp16: initial loss scale");
ABSL_FLAG(int64_t, loss_scale_window, 2000,
          "--amp fp16: clean steps after which the loss scale doubles");
ABSL_FLAG(std::string, tensorboard, "",
          "write TensorBoard event files (scalars) to this directory");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all cores)");
ABSL_FLAG(std::string, device, "auto",
          "train/eval/generate: where the model runs: auto (CUDA device local rank mod device "
          "count when a CUDA device is usable, else the CPU), cpu, or cuda (an error naming the "
          "reason when no CUDA device is usable)");
ABSL_FLAG(std::string, save_dir, "", "checkpoint directory (empty: no checkpoints)");
ABSL_FLAG(int64_t, save_every, 0, "checkpoint every N steps (0: only at the end)");
ABSL_FLAG(int, keep_last, 3, "checkpoints kept in --save-dir");
ABSL_FLAG(bool, resume, false, "continue from the latest checkpoint in --save-dir");
ABSL_FLAG(std::string, metrics, "", "append one JSON line per step to this file");
ABSL_FLAG(int64_t, eval_every, 50, "evaluate on held-out data every N steps (0: never)");
ABSL_FLAG(int64_t, eval_batches, 4, "micro-batches per evaluation");
ABSL_FLAG(double, val_fraction, 0.05,
          "fraction of --data held out when --val-data is empty (train); of the token stream "
          "written as validation shards (data)");
ABSL_FLAG(int64_t, log_every, 10, "print a progress line every N steps");
ABSL_FLAG(bool, detect_anomaly, false,
          "stop at the first op whose output or gradient holds NaN or inf, naming it, its module, "
          "shapes and rank (slow: a debugging mode)");
ABSL_FLAG(bool, log_grad_norms, false,
          "each --log-every step, every module's gradient norm in the --metrics line "
          "(\"grad_norms\"); one process or plain dp");
ABSL_FLAG(int, vocab_size, mammoth::tools::kDefaultCorpusVocab,
          "BPE vocabulary trained for the embedded corpus (train) or the inputs (data)");
ABSL_FLAG(double, peak_gflops, 0,
          "machine peak GFLOP/s for MFU and --profile's roofline bounds (0: not reported)");
ABSL_FLAG(double, peak_gbps, 0,
          "machine memory bandwidth in GB/s for --profile's roofline bounds (0: not reported)");
ABSL_FLAG(std::string, profile, "",
          "train: write a Chrome trace per rank (DIR/rank_R.trace.json), a merged one and a "
          "summary for the --profile-steps steps to this directory (engine/profile)");
ABSL_FLAG(std::string, profile_steps, "1:4", "train --profile: the steps A:B profiled (A..B-1)");
ABSL_FLAG(bool, activation_checkpointing, false,
          "keep only each transformer block's input and recompute the block in backward");
ABSL_FLAG(int64_t, recompute_blocks, 0,
          "recompute the first N transformer blocks in backward (keeping only their inputs); "
          "-1: every block, as --activation-checkpointing");
ABSL_FLAG(std::string, plan, "",
          "a ParallelPlan JSON file (mammoth plan --out writes them) giving the whole layout: "
          "mesh, sequence parallelism, pipeline, micro-batching, ZeRO, offload, recompute, amp; "
          "or auto: the planner's best plan for the launched world, --global-batch and "
          "--seq-len on --cluster (default: this machine, calibrated at start-up); the layout "
          "flags are then refused");
ABSL_DECLARE_FLAG(int64_t, mask_token);
ABSL_DECLARE_FLAG(std::string, cluster);
ABSL_DECLARE_FLAG(int64_t, global_batch);
ABSL_DECLARE_FLAG(double, mask_prob);
ABSL_FLAG(std::string, dump_batches, "",
          "debugging: write every training micro-batch the model is fed (input ids, targets, "
          "mesh coordinates) as one JSON line to this file (FILE.rankR for rank R of a "
          "multi-process run), replacing it");
ABSL_FLAG(int64_t, lora_rank, 0,
          "LoRA: train rank-R adapters on the --lora-targets layers, the model frozen (0: off); "
          "saved as a PEFT adapter directory in --save-dir/adapter");
ABSL_FLAG(double, lora_alpha, 8.0, "LoRA: the update is scaled by alpha / rank (PEFT's default 8)");
ABSL_FLAG(double, lora_dropout, 0.0, "LoRA: dropout on the adapters' input while training");
ABSL_FLAG(std::string, lora_targets, "",
          "LoRA: module names as PEFT's target_modules writes them, comma-separated (a layer "
          "matches when its Hugging Face module path is or ends with one), e.g. c_attn for "
          "GPT-2, q_proj,v_proj for LLaMA");
ABSL_DECLARE_FLAG(std::string, adapter);
ABSL_DECLARE_FLAG(int, pp);
ABSL_DECLARE_FLAG(std::string, pp_schedule);
ABSL_DECLARE_FLAG(int, virtual_stages);
ABSL_DECLARE_FLAG(std::string, pp_partition);

ABSL_FLAG(int, tp, 1, "tensor-parallel ranks per model replica (GPT-2, LLaMA, BERT)");
ABSL_FLAG(int, sp, 1, "sequence-parallel ranks for --sp-mode ulysses or ring");
ABSL_FLAG(std::string, sp_mode, "none",
          "sequence parallelism: none, split_gather (on the tp group), ulysses or ring (on sp)");
ABSL_FLAG(int, dp, 0, "data-parallel ranks (0: all ranks mpirun started)");
ABSL_FLAG(int, ep, 1,
          "expert parallelism (mixtral): groups of this many dp ranks split the experts; must "
          "divide --dp and the experts");
ABSL_FLAG(
    int, zero, 0,
    "ZeRO stage: 0 (replicated), 1 (optimizer states sharded), 2 (+ gradients), 3 (+ parameters)");
ABSL_FLAG(double, bucket_mb, 25.0, "gradient bucket size for data-parallel reductions, MiB");
ABSL_FLAG(std::string, offload_optimizer, "none",
          "where AdamW states live (DeepSpeed's offload_optimizer): none (beside the "
          "parameters), host (CPU AdamW on host memory) or nvme (files under --nvme-dir, "
          "streamed chunk by chunk); with --dp N each rank keeps the AdamW states of its chunks "
          "only (chunk k: rank k % N)");
ABSL_FLAG(std::string, offload, "none", "short form of --offload-optimizer (the same values)");
ABSL_FLAG(std::string, offload_params, "none",
          "where parameter and gradient chunks are homed (DeepSpeed's offload_param): none "
          "(the device when they fit --device-mem, else host), host, or nvme (files under "
          "--nvme-dir, read into the device cache along the traced order); one process, host "
          "under --pp, or nvme with --dp N --zero 3 (each rank's parameter shards)");
ABSL_FLAG(std::string, device_mem, "0",
          "device memory budget for parameters, gradients and states (K/M/G; 0: unlimited), "
          "or auto:SIZE: a device of SIZE whose first step's traced peak of activations and "
          "temporaries (+1/8 margin) is taken off, the chunks getting the rest from step 2; "
          "on the CPU backend host memory stands in for the device, paged through the same "
          "chunks");
ABSL_FLAG(std::string, host_mem, "0",
          "host memory budget for offloaded chunks (K/M/G; 0: unlimited)");
ABSL_FLAG(std::string, nvme_dir, "", "directory for --offload=nvme swap files (removed at exit)");
ABSL_FLAG(double, chunk_mb, 32.0, "chunk size in MiB (raised to the largest parameter)");
ABSL_FLAG(double, comm_timeout, 600.0,
          "seconds a collective may take before the job is aborted naming it (<= 0: no limit)");

namespace mammoth::tools {

namespace {

// A directory under $TMPDIR removed with this object: instruction data tokenized for one run.
class ScratchDir {
 public:
  ScratchDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "mammoth-sft-XXXXXX").string();
    MAMMOTH_CHECK(::mkdtemp(tmpl.data()) != nullptr) << "[train] cannot create " << tmpl;
    path_ = tmpl;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The machine the planner predicts for: --cluster FILE|NAME, or under --plan auto without it,
// this machine calibrated now (plan/calibrate.h, the quick variant: a few seconds; collective
// under mpirun, so every rank takes part; rank 0's figures are the ones used). None otherwise.
std::optional<plan::Cluster> run_cluster(const parallel::ProcessInfo& proc) {
  if (!absl::GetFlag(FLAGS_cluster).empty())
    return plan::load_cluster(absl::GetFlag(FLAGS_cluster));
  if (absl::GetFlag(FLAGS_plan) != "auto") return std::nullopt;
  if (proc.rank == 0)
    std::fprintf(stderr,
                 "[train] --plan auto: calibrating this machine (mammoth plan --calibrate "
                 "writes a file for --cluster, which skips this)\n");
  plan::CalibrateOptions co;
  co.quick = true;
  co.threads_per_rank = num_threads();
  co.verbose = false;
  return plan::calibrate_this_machine(co);
}

// --plan auto: rank 0 searches (plan/search.h) for the fastest plan `mammoth train` can run on
// this world, model, --global-batch and --seq-len, on the machine --cluster describes, prints
// the ranked plans and why, and sends its choice to every rank (one search, one answer).
plan::ParallelPlan auto_plan(const parallel::ProcessInfo& proc, const plan::Cluster& cluster) {
  refuse_layout_flags("train", "auto", {"seq_len", "amp", "nvme_dir"});
  const int64_t global_batch = absl::GetFlag(FLAGS_global_batch);
  MAMMOTH_CHECK(global_batch > 0)
      << "[train] --plan auto needs --global-batch B (sequences per step over all ranks)";
  std::string text;
  if (proc.rank == 0) {
    models::ModelConfig config = models::resolve_config(absl::GetFlag(FLAGS_model));
    // A registered model on the embedded corpus takes the corpus BPE's vocabulary (run_train),
    // which sizes its embedding and head: plan for that model.
    if (absl::GetFlag(FLAGS_data).empty() &&
        !std::filesystem::is_directory(absl::GetFlag(FLAGS_model))) {
      config = on_default_corpus(config, absl::GetFlag(FLAGS_vocab_size));
    }
    plan::SearchOptions so;
    so.world = proc.world_size;
    so.global_batch = global_batch;
    so.seq_len = absl::GetFlag(FLAGS_seq_len);
    so.amp = absl::GetFlag(FLAGS_amp);
    so.device = "cpu";
    so.top_k = 3;
    so.runnable_only = true;
    // NVMe needs a directory to page into: only with --nvme-dir.
    so.offloads = absl::GetFlag(FLAGS_nvme_dir).empty()
                      ? std::vector<std::string>{"none", "host"}
                      : std::vector<std::string>{"none", "host", "nvme"};
    const plan::SearchResult found = plan::search(config, cluster, so);
    MAMMOTH_CHECK(!found.plans.empty())
        << "[train] --plan auto: no plan runs " << absl::GetFlag(FLAGS_model) << " on "
        << proc.world_size << " rank(s) with global batch " << global_batch << " x " << so.seq_len
        << " tokens on " << cluster.name << " (" << found.invalid
        << " refused by the plan's rules, " << found.over_memory << " over memory)";
    std::fprintf(stderr, "[train] --plan auto on %s, %d rank(s):\n%s", cluster.name.c_str(),
                 proc.world_size, plan::format_plans(found, cluster).c_str());
    plan::ParallelPlan chosen = found.plans.front().plan;
    chosen.nvme_dir = absl::GetFlag(FLAGS_nvme_dir);
    text = json::dump(plan::plan_to_json(chosen));
  }
  if (proc.world_size > 1) {
    // The length, then the bytes, from rank 0.
    std::unique_ptr<parallel::MpiCommunicator> world = parallel::mpi_world();
    engine::Tensor n = engine::Tensor::from_ints({static_cast<int64_t>(text.size())}, {1});
    world->broadcast(n, 0);
    text.resize(static_cast<size_t>(n.to_int_vector()[0]));
    // The string's own buffer, received in place.
    engine::Tensor bytes = engine::Tensor::from_blob(
        text.data(), {static_cast<int64_t>(text.size())}, DType::kU8, Device::cpu(), nullptr);
    world->broadcast(bytes, 0);
  }
  return plan::plan_from_json(json::parse(text, "--plan auto"));
}

// --profile DIR: the session the trainer's step observer drives. The FLOPs are mammoth
// analyze's count (models/analyze.h) for the plan's global batch.
std::unique_ptr<profile::Session> make_profile_session(engine::train::TrainOptions& o,
                                                       const models::ModelConfig& cfg,
                                                       const plan::ParallelPlan& pl,
                                                       parallel::DeviceMesh* mesh,
                                                       const engine::train::DeviceChoice& device,
                                                       const runtime::TrainingRuntime& rt) {
  const std::string dir = absl::GetFlag(FLAGS_profile);
  if (dir.empty()) {
    MAMMOTH_CHECK(!flag_changed("profile_steps")) << "[train] --profile-steps needs --profile DIR";
    return nullptr;
  }
  MAMMOTH_CHECK(device.device.is_cpu())
      << "[train] --profile traces the CPU backend only (CUDA kernel events and the CUDA "
         "caching allocator are not traced); this run trains on "
      << device.device;
  profile::SessionOptions so;
  so.dir = dir;
  std::tie(so.first, so.last) = profile::parse_steps(absl::GetFlag(FLAGS_profile_steps));
  so.last = std::min(so.last, o.steps);
  MAMMOTH_CHECK(so.first < so.last)
      << "[train] --profile-steps " << absl::GetFlag(FLAGS_profile_steps) << ": the run has "
      << o.steps << " steps (0.." << o.steps - 1 << ")";
  so.rank = mesh ? mesh->rank() : 0;
  so.world = mesh ? mesh->world_size() : 1;
  if (mesh) so.barrier = [mesh] { mesh->world().barrier(); };
  so.flops_per_step = models::analyze(cfg, pl.seq_len).flops_per_token_train *
                      static_cast<double>(pl.global_batch() * pl.seq_len);
  so.model_config = json::dump(models::config_to_hf_json(cfg));
  so.peak_flops = absl::GetFlag(FLAGS_peak_gflops) * 1e9;
  so.peak_bytes_per_s = absl::GetFlag(FLAGS_peak_gbps) * 1e9;
  const Device on = device.device;
  so.allocator_peak = [on] { return memory::allocator_for(on).stats().peak_bytes; };
  so.allocator_live = [on] { return memory::allocator_for(on).stats().allocated_bytes; };
  const runtime::TrainingRuntime::Memory m = rt.memory();
  so.param_bytes = m.params;
  so.grad_bytes = m.grads;
  so.optimizer_bytes = m.optimizer;
  std::vector<std::pair<const void*, std::string>> names;
  for (const auto& [name, t] : rt.trained().named_parameters())
    names.emplace_back(t.arg().data, name);
  profile::set_param_names(names);
  auto session = std::make_unique<profile::Session>(std::move(so));
  o.on_step = [s = session.get()](int64_t step, bool begin) { s->on_step(step, begin); };
  return session;
}

// The run's plan: the planner's (--plan auto), --plan FILE's, or train's layout flags'.
plan::ParallelPlan plan_from_flags(const parallel::ProcessInfo& proc,
                                   const std::optional<plan::Cluster>& cluster) {
  if (absl::GetFlag(FLAGS_plan) == "auto") return auto_plan(proc, *cluster);
  return plan_from_layout_flags("train", proc.world_size);
}

// The LoRA adapters the flags ask for (null: none): --adapter DIR's (its own shape, to train
// further), or --lora-rank's on --lora-targets (PEFT's defaults per family when empty).
std::shared_ptr<models::LoraAdapters> make_lora(models::LanguageModel& model) {
  const std::string adapter = absl::GetFlag(FLAGS_adapter);
  const bool shaped = flag_changed("lora_rank") || flag_changed("lora_alpha") ||
                      flag_changed("lora_dropout") || flag_changed("lora_targets");
  if (adapter.empty() && absl::GetFlag(FLAGS_lora_rank) == 0) {
    MAMMOTH_CHECK(!shaped) << "[train] --lora-alpha, --lora-dropout and --lora-targets need "
                              "--lora-rank R (> 0)";
    return nullptr;
  }
  // PEFT's CAUSAL_LM adapters, checked against peft for the families that name their default
  // targets.
  const models::FamilySpec& family = models::family_spec(model.config().family);
  if (family.lora_targets.empty()) {
    std::string with;
    for (const models::FamilySpec& f : models::families())
      if (!f.lora_targets.empty()) with += (with.empty() ? "" : ", ") + std::string(f.title);
    MAMMOTH_THROW() << "[train] LoRA is supported for the causal LMs (" << with << "), not "
                    << family.name;
  }
  if (!adapter.empty()) {
    MAMMOTH_CHECK(!shaped) << "[train] --adapter " << adapter
                           << " brings its own LoRA shape (adapter_config.json); drop --lora-*";
    return models::load_adapter(model, adapter);
  }
  models::LoraOptions o;
  o.rank = absl::GetFlag(FLAGS_lora_rank);
  o.alpha = absl::GetFlag(FLAGS_lora_alpha);
  o.dropout = absl::GetFlag(FLAGS_lora_dropout);
  o.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  std::string targets = absl::GetFlag(FLAGS_lora_targets);
  if (targets.empty()) {
    // PEFT's default for the model type (its TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES).
    targets = family.lora_targets;
  }
  o.targets = models::parse_lora_targets(targets);
  return models::apply_lora(model, o);
}

// The PEFT adapter directory from checkpoint `ckpt`'s tensors: the adapters whole, in their
// single-process shapes, whichever layout wrote them (under ZeRO-3 no rank holds them whole).
void save_adapter_from_checkpoint(const models::LoraAdapters& lora, const models::Model& model,
                                  const std::string& ckpt, const std::string& out,
                                  const std::string& base_model) {
  json::Value state;
  const engine::nn::NamedTensors whole = engine::train::load_whole_checkpoint(ckpt, &state);
  models::save_adapter(lora, model, out, base_model, &whole);
}

// --resume: the checkpoint must train what this run trains (LoRA adapters of the same shape, or
// the whole model), said before its tensors are read (their shapes would differ first).
void check_lora_resume(const engine::train::TrainOptions& o, const json::Value& config) {
  if (!o.resume) return;
  const std::optional<std::string> dir = engine::train::latest_checkpoint(o.save_dir);
  if (!dir || !std::filesystem::exists(*dir + "/state.json")) return;
  const json::Value state = json::parse_file(*dir + "/state.json");
  const json::Value* saved = state.find("config") ? state.at("config").find("lora") : nullptr;
  const json::Value* ours = config.find("lora");
  auto shape = [](const json::Value* c) {
    if (c == nullptr) return std::string("the whole model (no LoRA)");
    return "LoRA r=" + json::dump(c->at("r")) + " alpha=" + json::dump(c->at("lora_alpha")) +
           " targets " + json::dump(c->at("target_modules"));
  };
  MAMMOTH_CHECK(shape(saved) == shape(ours))
      << "[train] --resume: " << *dir << " trained " << shape(saved) << ", this run trains "
      << shape(ours) << " (--lora-rank, --lora-alpha, --lora-targets must match)";
}

// The loop's options every objective shares (schedule, evaluation, checkpoints, metrics).
engine::train::TrainOptions options_from_flags() {
  engine::train::TrainOptions o;
  o.steps = absl::GetFlag(FLAGS_steps);
  o.lr = absl::GetFlag(FLAGS_lr);
  o.min_lr_ratio = absl::GetFlag(FLAGS_min_lr_ratio);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.schedule = absl::GetFlag(FLAGS_schedule);
  o.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  o.grad_clip = absl::GetFlag(FLAGS_grad_clip);
  o.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  o.eval_every = absl::GetFlag(FLAGS_eval_every);
  o.eval_batches = absl::GetFlag(FLAGS_eval_batches);
  o.val_fraction = absl::GetFlag(FLAGS_val_fraction);
  o.save_dir = absl::GetFlag(FLAGS_save_dir);
  o.save_every = absl::GetFlag(FLAGS_save_every);
  o.keep_last = absl::GetFlag(FLAGS_keep_last);
  o.resume = absl::GetFlag(FLAGS_resume);
  o.metrics_path = absl::GetFlag(FLAGS_metrics);
  o.log_every = absl::GetFlag(FLAGS_log_every);
  o.init_loss_scale = absl::GetFlag(FLAGS_loss_scale);
  o.loss_scale_growth_interval = absl::GetFlag(FLAGS_loss_scale_window);
  MAMMOTH_CHECK(o.init_loss_scale > 0)
      << "[train] --loss-scale must be > 0, got " << o.init_loss_scale;
  MAMMOTH_CHECK(o.loss_scale_growth_interval > 0)
      << "[train] --loss-scale-window must be > 0, got " << o.loss_scale_growth_interval;
  o.tensorboard_dir = absl::GetFlag(FLAGS_tensorboard);
  return o;
}

// The token data a language model trains on: shards, instruction data (with its loss mask) or
// the embedded corpus, and the vocabulary it brings.
struct LmData {
  std::unique_ptr<ScratchDir> scratch;  // instruction data or shards tokenized for this run
  data::TokenDataset train, val, loss_mask;
  int64_t vocab = 0;      // the model's vocabulary from the data (0: the model's own)
  int64_t sft_vocab = 0;  // the instruction data's tokenizer's
  bool instructions = false;
  bool loss_on_response = false;
};

// Instruction data from a .jsonl file is tokenized here (on every rank alike) with the
// tokenizer and chat template of --tokenizer, else of the --model directory, packed to
// --seq-len; returns the directory it was written to.
std::string tokenize_instructions(const std::string& jsonl, const plan::ParallelPlan& pl, bool lead,
                                  LmData& d) {
  std::string dir = absl::GetFlag(FLAGS_tokenizer);
  if (dir.empty()) dir = absl::GetFlag(FLAGS_model);
  MAMMOTH_CHECK(std::filesystem::is_directory(dir))
      << "[train] --data " << jsonl << " is instruction data: it needs a model directory's "
      << "tokenizer and chat template (--model HF_DIR, or --tokenizer DIR)";
  d.scratch = std::make_unique<ScratchDir>();
  data::InstructionDataOptions io;
  io.jsonl_files = {jsonl};
  io.out_dir = d.scratch->path();
  io.seq_len = pl.seq_len;
  io.verbose = lead;
  data::build_instruction_data(io, dir);
  return d.scratch->path();
}

// Instruction data (a directory `mammoth data` wrote): its tokens and loss mask.
void open_instructions(const std::string& spec, const plan::ParallelPlan& pl, bool lead,
                       LmData& d) {
  data::InstructionData sft = data::open_instruction_data(spec);
  d.sft_vocab = sft.vocab_size;
  MAMMOTH_CHECK(sft.seq_len == pl.seq_len)
      << "[train] the instruction data in " << spec << " is packed to --seq-len " << sft.seq_len
      << ", not " << pl.seq_len << ": train with --seq-len " << sft.seq_len;
  MAMMOTH_CHECK(absl::GetFlag(FLAGS_val_data).empty())
      << "[train] --val-data with instruction data is not supported (--val-fraction holds "
         "out its last sequences)";
  d.train = std::move(sft.tokens);
  d.loss_mask = std::move(sft.loss_mask);
  // A registered model takes the tokenizer's vocabulary; a directory keeps its own.
  if (!std::filesystem::is_directory(absl::GetFlag(FLAGS_model))) d.vocab = sft.vocab_size;
  if (lead)
    std::fprintf(stderr,
                 "[train] instruction data: %lld tokens in sequences of %lld; loss on %s "
                 "tokens (--loss-on %s%s)\n",
                 static_cast<long long>(d.train.size() - 1), static_cast<long long>(sft.seq_len),
                 d.loss_on_response ? "response" : "prompt and response",
                 d.loss_on_response ? "response" : "all",
                 absl::GetFlag(FLAGS_loss_on).empty() ? ", the default for instruction data" : "");
}

// What --data (and --val-data, --loss-on) name; with no --data, the embedded corpus: tokenized
// with a model directory's own tokenizer (its vocabulary kept), else with the corpus BPE that
// rank 0 trains into the cache once.
LmData load_lm_data(const plan::ParallelPlan& pl, parallel::DeviceMesh* mesh, bool lead) {
  LmData d;
  std::string spec = absl::GetFlag(FLAGS_data);
  const std::string model_name = absl::GetFlag(FLAGS_model);
  if (std::filesystem::path(spec).extension() == ".jsonl")
    spec = tokenize_instructions(spec, pl, lead, d);
  d.instructions = !spec.empty() && data::is_instruction_dir(spec);
  const std::string loss_on = absl::GetFlag(FLAGS_loss_on).empty()
                                  ? (d.instructions ? "response" : "all")
                                  : absl::GetFlag(FLAGS_loss_on);
  MAMMOTH_CHECK(loss_on == "response" || loss_on == "all")
      << "[train] --loss-on must be response or all, got '" << loss_on << "'";
  MAMMOTH_CHECK(d.instructions || loss_on == "all")
      << "[train] --loss-on response needs instruction data (a directory `mammoth data` wrote "
         "from .jsonl, or a .jsonl file); --data '"
      << spec << "' has no loss mask";
  d.loss_on_response = loss_on == "response";
  if (d.instructions) {
    open_instructions(spec, pl, lead, d);
  } else if (spec.empty() && std::filesystem::is_directory(model_name)) {
    d.scratch = std::make_unique<ScratchDir>();
    data::BuildShardsOptions bo;
    bo.out_dir = d.scratch->path();
    bo.tokenizer_dir = model_name;
    bo.val_fraction = 0.05;
    bo.verbose = false;
    const data::BuildShardsResult r = data::build_shards(bo);
    if (lead)
      std::fprintf(stderr, "[train] data: the embedded corpus, tokenized with %s's tokenizer\n",
                   model_name.c_str());
    d.train = data::TokenDataset::open(r.train_shards);
    d.val = data::TokenDataset::open(r.val_shards);
  } else if (spec.empty()) {
    if (mesh && !lead) mesh->world().barrier();
    const data::BuildShardsResult r = default_corpus(absl::GetFlag(FLAGS_vocab_size));
    if (mesh && lead) mesh->world().barrier();
    d.train = data::TokenDataset::open(r.train_shards);
    d.val = data::TokenDataset::open(r.val_shards);
    d.vocab = r.vocab_size;
  } else {
    d.train = data::TokenDataset::open(spec);
    if (!absl::GetFlag(FLAGS_val_data).empty())
      d.val = data::TokenDataset::open(absl::GetFlag(FLAGS_val_data));
  }
  return d;
}

// The --model, sized to the data's vocabulary, built and initialised on the host (the same
// weights on every device), then moved to the device.
std::shared_ptr<models::LanguageModel> build_model(const LmData& d, Device device) {
  const std::string model_name = absl::GetFlag(FLAGS_model);
  const bool masked_lm = models::family_spec(models::resolve_config(model_name).family).objective ==
                         models::Objective::kMaskedLm;
  MAMMOTH_CHECK(!(d.instructions && masked_lm))
      << "[train] instruction data trains causal models (gpt2, llama), not " << model_name;
  models::ModelOptions mo;
  if (d.vocab > 0) mo.vocab_size = d.vocab;
  if (d.vocab > 0 && masked_lm) {
    // <|endoftext|> (the BPE's last id) separates documents as [SEP]; [MASK] is one id more.
    mo.vocab_size = corpus_model_vocab(masked_lm, d.vocab);
    mo.special_tokens = models::SpecialTokenIds{.sep = d.vocab - 1, .mask = d.vocab};
  }
  mo.dropout = absl::GetFlag(FLAGS_dropout);
  mo.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  mo.fresh_init = absl::GetFlag(FLAGS_fresh_init);
  if (flag_changed("moe_aux_loss_coef"))
    mo.moe_aux_loss_coef = absl::GetFlag(FLAGS_moe_aux_loss_coef);
  if (flag_changed("moe_capacity_factor"))
    mo.moe_capacity_factor = absl::GetFlag(FLAGS_moe_capacity_factor);
  std::shared_ptr<models::LanguageModel> model = models::create_language_model(model_name, mo);
  engine::train::move_to_device(model->named_parameters(), device);
  engine::train::move_to_device(model->named_buffers(), device);
  MAMMOTH_CHECK(!d.instructions || model->config().vocab_size >= d.sft_vocab)
      << "[train] the instruction data's tokenizer has more ids than " << model_name
      << "'s vocabulary of " << model->config().vocab_size;
  return model;
}

// The LoRA adapters of a run (none: adapters is null), on the device, and what they train.
struct LoraRun {
  std::shared_ptr<models::LoraAdapters> adapters;
  engine::nn::NamedTensors params;
  int64_t trainable = 0;  // the adapters' parameters
};

LoraRun make_lora_run(models::LanguageModel& model, Device device) {
  LoraRun l;
  l.adapters = make_lora(model);
  if (!l.adapters) return l;
  l.params = l.adapters->named_parameters();
  engine::train::move_to_device(l.params, device);
  for (const auto& [name, t] : l.params) l.trainable += t.numel();
  return l;
}

// The loop's options for a language model: the shared ones, the objective, the FLOPs per token
// (PaLM's count: 6 per trained parameter plus attention's 12 * layers * d_model * seq_len, a
// frozen weight costing its forward and input gradient only: 4; recomputation never counted),
// the trained parameters and the debugging switches.
engine::train::TrainOptions lm_options(const models::LanguageModel& model, const LmData& d,
                                       const LoraRun& lora, const runtime::TrainingRuntime& rt) {
  const plan::ParallelPlan& pl = rt.plan();
  const models::ModelConfig& cfg = model.config();
  engine::train::TrainOptions o = options_from_flags();
  const double params = static_cast<double>(model.num_parameters());
  o.flops_per_token =
      (lora.adapters ? 4.0 * params + 6.0 * static_cast<double>(lora.trainable) : 6.0 * params) +
      12.0 * static_cast<double>(cfg.n_layer * cfg.d_model * pl.seq_len);
  o.peak_flops = absl::GetFlag(FLAGS_peak_gflops) * 1e9;
  if (models::family_spec(cfg.family).objective == models::Objective::kMaskedLm) {
    o.objective = "masked_lm";
    o.masking = masked_lm_options(cfg, "train");
  }
  if (d.instructions) {
    o.loss_parts = &d.loss_mask;
    o.loss_min_part = static_cast<int>(d.loss_on_response ? data::TokenPart::kResponse
                                                          : data::TokenPart::kPrompt);
  }
  if (lora.adapters) o.trained_params = &lora.params;
  o.detect_anomaly = absl::GetFlag(FLAGS_detect_anomaly);
  o.log_grad_norms = absl::GetFlag(FLAGS_log_grad_norms);
  // The per-module norms are of this process's whole gradients: sharded ones (ZeRO, tp, sp,
  // pp, offload chunks) would need a reduction per module, which is not built.
  MAMMOTH_CHECK(!o.log_grad_norms || (pl.zero == 0 && pl.tp == 1 && pl.sp == 1 && pl.pp == 1 &&
                                      pl.ep == 1 && !pl.offloaded()))
      << "[train] --log-grad-norms supports one process and plain dp (--zero 0, no --tp, --sp, "
         "--pp, --ep or offload); this run is "
      << plan::plan_summary(pl);
  // Test hook for --detect-anomaly (test/engine/train/anomaly_test.sh): a NaN in a parameter.
  if (const char* nan_param = std::getenv("MAMMOTH_TEST_NAN_PARAM")) {
    const char* rank = std::getenv("MAMMOTH_TEST_NAN_RANK");
    if (rank == nullptr || std::atoi(rank) == rt.rank()) {
      o.inject_nan_param = nan_param;
      const char* step = std::getenv("MAMMOTH_TEST_NAN_STEP");
      o.inject_nan_step = step ? std::atoll(step) : 0;
    }
  }
  return o;
}

// The run's shape, printed once: model, data, batch, and the bytes per rank for parameters,
// gradients and AdamW's two states (its tp shards or pipeline stages, divided further by ZeRO).
void print_run(const runtime::TrainingRuntime& rt, const models::LanguageModel& model,
               const LmData& d, const engine::train::TrainOptions& o, const LoraRun& lora) {
  const plan::ParallelPlan& pl = rt.plan();
  std::fprintf(
      stderr,
      "[train] model %s: %lld parameters | data: %lld training tokens%s | threads %d\n"
      "[train] batch %lld x %lld tokens x %lld accumulation x %d dp = %lld tokens/step, %lld "
      "steps\n",
      absl::GetFlag(FLAGS_model).c_str(), static_cast<long long>(model.num_parameters()),
      static_cast<long long>(d.train.size()),
      d.val.size() ? (", " + std::to_string(d.val.size()) + " validation").c_str() : "",
      num_threads(), static_cast<long long>(pl.micro_batch), static_cast<long long>(pl.seq_len),
      static_cast<long long>(pl.grad_accum), pl.dp,
      static_cast<long long>(pl.global_batch() * pl.seq_len), static_cast<long long>(o.steps));
  const int64_t elem = static_cast<int64_t>(dtype_size(model.config().dtype));
  const runtime::TrainingRuntime::Memory m = rt.memory();
  // LoRA: the runtime holds the adapters (sharded by ZeRO); the frozen model sits beside
  // them, whole on every rank or (tp) as this rank's shards.
  const double frozen =
      lora.adapters ? static_cast<double>(rt.trained().num_parameters() * elem) : 0.0;
  const double whole = static_cast<double>((model.num_parameters() + lora.trainable) * elem);
  const double params = static_cast<double>(m.params) + frozen;
  std::fprintf(stderr,
               "[train] per rank: parameters %.1f MiB (%.1f%% of the model's %.1f MiB%s), "
               "gradients %.1f MiB, optimizer states %.1f MiB (%s)\n",
               params / 1048576.0, 100.0 * params / whole, whole / 1048576.0,
               lora.adapters
                   ? (pl.tp > 1 ? ", the frozen base's tp shards" : ", the frozen base whole")
                   : "",
               m.grads / 1048576.0, m.optimizer / 1048576.0, m.how.c_str());
  if (lora.adapters) {
    const models::LoraOptions& lo = lora.adapters->options();
    const int64_t total = model.num_parameters() + lora.trainable;
    std::fprintf(stderr,
                 "[train] LoRA r=%lld alpha=%g dropout=%g on %zu layers: trainable %lld of "
                 "%lld parameters (%.3f%%), the model's %lld frozen\n",
                 static_cast<long long>(lo.rank), lo.alpha, lo.dropout,
                 lora.adapters->targets().size(), static_cast<long long>(lora.trainable),
                 static_cast<long long>(total),
                 100.0 * static_cast<double>(lora.trainable) / static_cast<double>(total),
                 static_cast<long long>(model.num_parameters()));
  }
}

// The planner's predictions for the plan being run, recorded beside what the run measures
// (the metrics' predicted_* fields): this rank's peak memory (plan/memory_model.h, for its
// pipeline stage), printed with its placement table, and the step time when --cluster
// describes the machine.
void predict_run(engine::train::TrainOptions& o, const models::ModelConfig& cfg,
                 const runtime::TrainingRuntime& rt, const std::optional<plan::Cluster>& cluster) {
  const plan::ParallelPlan& pl = rt.plan();
  const int stage = rt.mesh() ? rt.mesh()->coord(parallel::Axis::kPp) : 0;
  const plan::MemoryPrediction predicted = plan::predict_memory(cfg, pl);
  o.predicted_peak_mem_bytes = predicted.stages[static_cast<size_t>(stage)].device_peak;
  if (rt.lead()) {
    std::fprintf(stderr, "[train] placement per rank (plan/memory_model, stage %d):\n%s", stage,
                 plan::placement_table(predicted.stages[static_cast<size_t>(stage)], pl).c_str());
  }
  if (pl.offloaded() && !pl.zero3_shards_on_nvme() &&
      !predicted.stages[static_cast<size_t>(stage)].offload_tensors.empty()) {
    // What the chunk manager will move, from its dry run: the metrics' offload counters are the
    // measurement (per step: the difference between two steps').
    const plan::OffloadTraffic t = plan::simulate_offload(
        plan::offload_setup(predicted.stages[static_cast<size_t>(stage)], pl));
    if (!t.error.empty()) {
      std::fprintf(stderr,
                   "[train] rank %d predicted chunk moves: none (the dry run refused: %s)\n",
                   rt.rank(), t.error.c_str());
    } else {
      const plan::OffloadPhase all = plan::add(t.compute, t.optimizer);
      std::fprintf(stderr,
                   "[train] rank %d predicted chunk moves per step (dry run, %lld chunks of %s): "
                   "forward/backward %s; optimizer %s; total bytes device_in %.0f device_out %.0f "
                   "nvme_read %.0f nvme_write %.0f\n",
                   rt.rank(), static_cast<long long>(t.chunks),
                   memory::chunks::short_bytes(t.chunk_bytes).c_str(),
                   plan::describe(t.compute).c_str(), plan::describe(t.optimizer).c_str(),
                   all.device_in, all.device_out, all.nvme_read, all.nvme_write);
    }
  }
  if (cluster) {
    const plan::TimePrediction t = plan::predict_time(cfg, pl, *cluster);
    o.predicted_step_s = t.step_time;
    if (rt.lead())
      std::fprintf(stderr, "[train] predicted step time %.3g s on %s (%s binds)\n", t.step_time,
                   cluster->name.c_str(), t.binding.c_str());
  } else if (rt.lead()) {
    std::fprintf(stderr,
                 "[train] predicted step time: none (--cluster FILE describes the machine; "
                 "mammoth plan --calibrate writes one)\n");
  }
}

// Every rank's predicted against measured peak memory, printed as train() returns: measured as
// the larger of the first step's peak and the last one's (the allocator's peak since that step
// began). The first step already holds the AdamW states and dp buckets (made before it), but
// not what it makes lazily and keeps (offload's dp comm buffers), which later steps start with.
struct PeakMemoryReport {
  int rank = 0;
  int64_t predicted = 0, first_step = 0;
  Device device = Device::cpu();
  ~PeakMemoryReport() {
    if (std::uncaught_exceptions() > 0 || first_step == 0) return;
    const int64_t peak = std::max(first_step, memory::allocator_for(device).stats().peak_bytes);
    std::fprintf(stderr,
                 "[train] rank %d memory: predicted peak %lld bytes, measured peak %lld bytes "
                 "(error %+.1f%%)\n",
                 rank, static_cast<long long>(predicted), static_cast<long long>(peak),
                 100.0 * static_cast<double>(predicted - peak) / static_cast<double>(peak));
  }
};

// The last forward's expert load per layer and its router losses (models/mixtral), for the
// metrics. Read from what trains: under --tp its sharded form ran the forward; under --pp each
// stage its own layers, gathered over the stages (every rank calls it).
std::function<json::Value()> moe_step_metrics(runtime::TrainingRuntime& rt) {
  const models::LanguageModel* moe = &rt.trained();
  parallel::Communicator* stages =
      rt.plan().pp > 1 ? &rt.mesh()->group(parallel::Axis::kPp) : nullptr;
  return [moe, stages] {
    const models::RouterReport report = models::router_report(*moe, stages);
    json::Value layers = json::Value::array();
    for (const models::ExpertLoad& l : report.load) {
      json::Value tokens = json::Value::array();
      for (int64_t t : l.tokens) tokens.push_back(json::Value(t));
      layers.push_back(
          json::Value::object().set("tokens", std::move(tokens)).set("dropped", l.dropped));
    }
    return json::Value::object()
        .set("moe_load", std::move(layers))
        .set("moe_aux_loss", report.aux_loss)
        .set("moe_z_loss", report.z_loss);
  };
}

// The trained model's loss; with --dump-batches, every training micro-batch it is fed is first
// written as one JSON line (what the tests of the masking rule read).
engine::train::LossFn lm_loss(models::LanguageModel& trained, parallel::DeviceMesh* mesh) {
  if (absl::GetFlag(FLAGS_dump_batches).empty())
    return [&trained](const engine::Tensor& in, const engine::Tensor& tg) {
      return trained.loss(in, tg);
    };
  const std::string path = absl::GetFlag(FLAGS_dump_batches) +
                           (mesh ? ".rank" + std::to_string(mesh->rank()) : std::string());
  std::shared_ptr<std::FILE> dump(std::fopen(path.c_str(), "w"), [](std::FILE* f) {
    if (f) std::fclose(f);
  });
  MAMMOTH_CHECK(dump != nullptr) << "[train] --dump-batches: cannot write " << path;
  return [&trained, mesh, dump](const engine::Tensor& in, const engine::Tensor& tg) {
    if (trained.is_training()) {
      json::Value line = json::Value::object();
      for (const auto& [key, t] : {std::pair{"input", &in}, std::pair{"target", &tg}}) {
        json::Value ids = json::Value::array();
        for (int64_t id : t->to(Device::cpu()).to_int_vector()) ids.push_back(json::Value(id));
        line.set(key, std::move(ids));
      }
      line.set("shape", json::Value::array().push_back(in.size(0)).push_back(in.size(1)));
      for (parallel::Axis a : parallel::kAllAxes)
        line.set(parallel::axis_name(a), json::Value(mesh ? mesh->coord(a) : 0));
      std::fprintf(dump.get(), "%s\n", json::dump(line).c_str());
      std::fflush(dump.get());
    }
    return trained.loss(in, tg);
  };
}

// The run's end: losses, and under LoRA the adapter written (PEFT) from the last checkpoint.
void report_done(const engine::train::TrainResult& r, const runtime::TrainingRuntime& rt,
                 const LoraRun& lora, const models::Model& model,
                 const engine::train::TrainOptions& o) {
  if (!r.losses.empty()) {
    std::fprintf(stderr, "[train] done: steps %lld..%lld, loss %.4f -> %.4f",
                 static_cast<long long>(r.first_step), static_cast<long long>(r.last_step),
                 r.losses.front(), r.losses.back());
    if (r.last_val_loss == r.last_val_loss)
      std::fprintf(stderr, ", validation %.4f", r.last_val_loss);
    if (rt.plan().amp == "fp16")
      std::fprintf(stderr, ", %lld step(s) skipped, loss scale %g",
                   static_cast<long long>(r.skipped_steps), r.loss_scale);
    std::fprintf(stderr, "%s\n", r.interrupted ? " (interrupted; checkpoint saved)" : "");
  }
  std::fprintf(stderr, "%s", rt.offload_report().c_str());
  if (!lora.adapters) return;
  if (o.save_dir.empty()) {
    std::fprintf(stderr, "[train] LoRA: no --save-dir, so the adapter is not saved\n");
    return;
  }
  const std::string dir = o.save_dir + "/adapter";
  const std::optional<std::string> last = engine::train::latest_checkpoint(o.save_dir);
  MAMMOTH_CHECK(last.has_value()) << "[train] no checkpoint in " << o.save_dir
                                  << " to write the LoRA adapter from";
  save_adapter_from_checkpoint(*lora.adapters, model, *last, dir, absl::GetFlag(FLAGS_model));
  std::fprintf(stderr, "[train] LoRA adapter (PEFT) written to %s\n", dir.c_str());
}

int run_train(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.empty()) << "[train] unexpected argument '" << args[0] << "'";
  // --dtype (ckpt export, eval, generate) stores 16-bit weights; training keeps f32
  // master weights, so the flag would change nothing here.
  MAMMOTH_CHECK(!flag_changed("dtype"))
      << "[train] --dtype is for ckpt export, eval and generate; training keeps f32 "
         "master weights (--amp bf16|fp16 computes in 16 bits)";
  set_num_threads(absl::GetFlag(FLAGS_threads));
  // Where every rank writes its flight record if communication times out (parallel/comm/
  // flight_recorder.h); a directory the user set in the environment wins.
  if (!absl::GetFlag(FLAGS_save_dir).empty()) {
    setenv("MAMMOTH_FLIGHT_DIR", (absl::GetFlag(FLAGS_save_dir) + "/flight").c_str(), 0);
  }

  // The plan (dp x pp x tp x sp = the launcher's world, and the rest of the layout), checked
  // in one place (plan::validate) before anything is built.
  const parallel::ProcessInfo proc = parallel::process_info();
  const std::optional<plan::Cluster> cluster = run_cluster(proc);
  plan::ParallelPlan layout = plan_from_flags(proc, cluster);
  // Where this process trains (DESIGN.md: CUDA device = local rank when CUDA devices exist).
  // A plan file names its device kind; --device, when set, overrides it.
  const bool device_given = absl::GetFlag(FLAGS_plan).empty() || flag_changed("device");
  const engine::train::DeviceChoice device = engine::train::choose_device(
      device_given ? absl::GetFlag(FLAGS_device) : layout.device, "train");
  layout.device = device.device.is_cuda() ? "cuda" : "cpu";
  runtime::TrainingRuntime rt(layout, device.device, absl::GetFlag(FLAGS_comm_timeout));
  const bool lead = rt.lead();
  if (lead) {
    std::fprintf(stderr, "[train] device: %s (%s)\n", device.device.str().c_str(),
                 device.why.c_str());
    std::fprintf(stderr, "[train] plan: %s\n", plan::plan_summary(rt.plan()).c_str());
  }
  if (classification_requested()) return run_classification(rt, device, options_from_flags());

  const LmData data = load_lm_data(rt.plan(), rt.mesh(), lead);
  std::shared_ptr<models::LanguageModel> model = build_model(data, device.device);
  const models::ModelConfig& cfg = model->config();
  LoraRun lora = make_lora_run(*model, device.device);
  engine::train::TrainOptions o = lm_options(*model, data, lora, rt);

  // Everything the plan turns on (tp/sp shards, pipeline stages, dp/ZeRO, offload).
  if (lora.adapters) rt.set_lora(*lora.adapters);
  rt.assemble(model, o);
  std::unique_ptr<profile::Session> profiling =
      make_profile_session(o, cfg, rt.plan(), rt.mesh(), device, rt);
  if (lead) print_run(rt, *model, data, o, lora);
  predict_run(o, cfg, rt, cluster);
  // Destroyed before the runtime is (its teardown allocates): declared after it.
  PeakMemoryReport peak_report{rt.rank(), o.predicted_peak_mem_bytes, 0, device.device};
  o.report_peak_memory = [report = &peak_report](int64_t peak) { report->first_step = peak; };
  if (models::family_spec(cfg.family).router_losses) o.step_metrics = moe_step_metrics(rt);

  json::Value config = json::Value::object();
  config.set("model", json::Value(absl::GetFlag(FLAGS_model)));
  config.set("model_config", models::config_to_hf_json(cfg));
  if (lora.adapters) {
    // A resumed run must train the same adapters (the trainer compares this).
    config.set("lora", lora.adapters->peft_config(absl::GetFlag(FLAGS_model)));
    o.after_checkpoint = [&](const std::string& dir) {
      save_adapter_from_checkpoint(*lora.adapters, *model, dir, dir + "/adapter",
                                   absl::GetFlag(FLAGS_model));
    };
  }
  check_lora_resume(o, config);
  const engine::train::TrainResult r = engine::train::train(
      rt.trained(), lm_loss(rt.trained(), rt.mesh()), data.train, data.val, o, config);
  if (lead) report_done(r, rt, lora, *model, o);
  return r.interrupted ? 130 : 0;
}

}  // namespace

MAMMOTH_COMMAND(train, "train a model (default: gpt2-tiny on the embedded corpus)", run_train);

}  // namespace mammoth::tools
