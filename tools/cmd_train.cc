// `mammoth train`: trains a model-zoo language model on llm.c token shards, or, with no
// --data, on the embedded default corpus (tokenized once and cached). GPT-2 and LLaMA learn
// next-token prediction; the BERT family learns masked-LM (engine/data/masking.h: --mask-prob,
// --mask-token), the same rule `mammoth eval` scores.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/error.h"
#include "base/json.h"
#include "base/thread_pool.h"
#include "engine/data/bpe.h"
#include "engine/data/build_shards.h"
#include "engine/data/masking.h"
#include "engine/data/token_shard.h"
#include "engine/offload/offload.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "engine/train/device.h"
#include "engine/train/trainer.h"
#include "memory/allocator.h"
#include "models/gpt2/gpt2.h"
#include "models/pipeline/pipeline.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/offload_group.h"
#include "parallel/pipeline/schedule.h"
#include "plan/memory_model.h"
#include "tools/command.h"
#include "tools/masked_lm.h"

ABSL_FLAG(std::string, model, "gpt2-tiny", "registered model name or Hugging Face model directory");
ABSL_FLAG(std::string, data, "",
          "token shards (file, glob or directory of llm.c .bin files); empty: the embedded corpus");
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
ABSL_FLAG(int, vocab_size, 1024,
          "BPE vocabulary trained for the embedded corpus (train) or the inputs (data)");
ABSL_FLAG(double, peak_gflops, 0, "machine peak GFLOP/s for MFU (0: not reported)");
ABSL_FLAG(bool, activation_checkpointing, false,
          "keep only each transformer block's input and recompute the block in backward");
ABSL_DECLARE_FLAG(int64_t, mask_token);
ABSL_DECLARE_FLAG(double, mask_prob);
ABSL_FLAG(std::string, dump_batches, "",
          "debugging: write every training micro-batch the model is fed (input ids, targets, "
          "mesh coordinates) as one JSON line to this file (FILE.rankR for rank R of a "
          "multi-process run), replacing it");
ABSL_DECLARE_FLAG(int, pp);
ABSL_DECLARE_FLAG(std::string, pp_schedule);
ABSL_DECLARE_FLAG(int, virtual_stages);
ABSL_DECLARE_FLAG(std::string, pp_partition);

ABSL_FLAG(int, tp, 1, "tensor-parallel ranks per model replica (GPT-2, LLaMA, BERT)");
ABSL_FLAG(int, sp, 1, "sequence-parallel ranks for --sp-mode ulysses or ring");
ABSL_FLAG(std::string, sp_mode, "none",
          "sequence parallelism: none, split_gather (on the tp group), ulysses or ring (on sp)");
ABSL_FLAG(int, dp, 0, "data-parallel ranks (0: all ranks mpirun started)");
ABSL_FLAG(
    int, zero, 0,
    "ZeRO stage: 0 (replicated), 1 (optimizer states sharded), 2 (+ gradients), 3 (+ parameters)");
ABSL_FLAG(double, bucket_mb, 25.0, "gradient bucket size for data-parallel reductions, MiB");
ABSL_FLAG(std::string, offload, "none",
          "where AdamW states live: none (beside the parameters), host (CPU AdamW on host "
          "memory) or nvme (files under --nvme-dir, streamed chunk by chunk); with --dp N "
          "each rank keeps the AdamW states of its chunks only (chunk k: rank k % N)");
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

// Checkpoints of a tensor/sequence-parallel run see the single-process model through this:
// each piece of a rank's shard is mapped onto the single-process tensor (ShardSpec's layout;
// a replicated KV head is rows of the full projection), and one rank per distinct part writes.
class PolicyShards final : public engine::train::ModelShardRuntime {
 public:
  PolicyShards(const models::ShardedLanguageModel& sharded, const models::Model& full,
               const parallel::DeviceMesh& mesh)
      : sharded_(sharded), full_(full.named_parameters()), mesh_(mesh) {
    for (const auto& [name, t] : sharded.named_parameters()) local_shape_[name] = t.shape();
    for (const auto& [name, t] : full_) full_shape_[name] = t.shape();
  }
  std::vector<FlatRun> single_process_runs(const std::string& param, int64_t lo,
                                           int64_t hi) const override {
    const engine::Shape& local = shape_in(local_shape_, param);
    const int tp = mesh_.size(parallel::Axis::kTp), r = mesh_.coord(parallel::Axis::kTp);
    const parallel::ShardSpec spec = sharded_.spec(param);
    std::vector<FlatRun> runs;
    if (spec.sharded()) {
      for (const auto& run : parallel::shard_flat_runs(spec, local, r, tp, lo, hi)) {
        runs.push_back({run.global, run.local, run.length});
      }
      return runs;
    }
    int64_t offset = 0;
    if (!sharded_.holds_full(param)) {
      // A replicated KV head: this rank holds head r / (tp / heads), rows of dim 0.
      const int64_t rows = local[0], heads = shape_in(full_shape_, param)[0] / rows;
      const int64_t head = r / (tp / heads);
      offset = head * engine::shape_numel(local);
    }
    if (lo < hi) runs.push_back({offset + lo, lo, hi - lo});
    return runs;
  }
  bool writes(const std::string& param) const override {
    return mesh_.coord(parallel::Axis::kSp) == 0 && sharded_.grad_owner(param);
  }
  const engine::nn::NamedTensors& single_process_parameters() const override { return full_; }

 private:
  static const engine::Shape& shape_in(const std::map<std::string, engine::Shape>& shapes,
                                       const std::string& param) {
    auto it = shapes.find(param);
    MAMMOTH_CHECK(it != shapes.end()) << "[train] no parameter '" << param << "'";
    return it->second;
  }
  const models::ShardedLanguageModel& sharded_;
  engine::nn::NamedTensors full_;
  const parallel::DeviceMesh& mesh_;
  std::map<std::string, engine::Shape> local_shape_, full_shape_;
};

std::string cache_dir() {
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/mammoth";
}

// Tokenizes the embedded corpus once per vocabulary size and reuses the shards afterwards.
data::BuildShardsResult default_data(int vocab_size) {
  const std::string dir = cache_dir() + "/default-corpus-v1-bpe" + std::to_string(vocab_size);
  const std::string train = dir + "/train_000000.bin", val = dir + "/val_000000.bin";
  data::BuildShardsResult r;
  if (std::filesystem::exists(train) && std::filesystem::exists(val)) {
    r.train_shards = {train};
    r.val_shards = {val};
    // Training stops early when the corpus runs out of pairs to merge: read the real size.
    r.vocab_size = data::BpeTokenizer::load(dir + "/vocab.json", dir + "/merges.txt").vocab_size();
    return r;
  }
  std::fprintf(stderr, "[train] tokenizing the embedded corpus into %s (once)\n", dir.c_str());
  data::BuildShardsOptions o;
  o.out_dir = dir;
  o.vocab_size = vocab_size;
  o.val_fraction = 0.05;
  return data::build_shards(o);
}

int run_train(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.empty()) << "[train] unexpected argument '" << args[0] << "'";
  const std::string amp = absl::GetFlag(FLAGS_amp);
  MAMMOTH_CHECK(amp == "fp32" || amp == "bf16" || amp == "fp16")
      << "[train] --amp must be fp32, bf16 or fp16, got '" << amp << "'";
  set_num_threads(absl::GetFlag(FLAGS_threads));

  // Processes: the launcher's world = dp x pp x tp x sp.
  const int launched = parallel::process_info().world_size;
  const int tp_size = absl::GetFlag(FLAGS_tp), sp_size = absl::GetFlag(FLAGS_sp);
  const int pp_size = absl::GetFlag(FLAGS_pp);
  MAMMOTH_CHECK(pp_size >= 1) << "[train] --pp must be >= 1, got " << pp_size;
  MAMMOTH_CHECK(tp_size >= 1 && sp_size >= 1)
      << "[train] --tp and --sp must be >= 1, got " << tp_size << " and " << sp_size;
  const models::SpMode sp_mode = models::sp_mode_from_name(absl::GetFlag(FLAGS_sp_mode));
  MAMMOTH_CHECK(sp_size == 1 || sp_mode == models::SpMode::kUlysses ||
                sp_mode == models::SpMode::kRing)
      << "[train] --sp " << sp_size << " needs --sp-mode ulysses or ring";
  MAMMOTH_CHECK(launched % (tp_size * sp_size * pp_size) == 0)
      << "[train] " << launched << " process(es) cannot be split into --pp " << pp_size
      << " x --tp " << tp_size << " x --sp " << sp_size << " groups";
  const int mp_size = tp_size * sp_size * pp_size;  // ranks per model replica
  const int dp_size = absl::GetFlag(FLAGS_dp) > 0 ? absl::GetFlag(FLAGS_dp) : launched / mp_size;
  MAMMOTH_CHECK(dp_size * mp_size == launched)
      << "[train] --dp " << dp_size << " x --pp " << pp_size << " x --tp " << tp_size << " x --sp "
      << sp_size << " = " << dp_size * mp_size << " but " << launched << " process(es) were started"
      << (launched == 1 ? " (launch with: mpirun -np " + std::to_string(dp_size * mp_size) +
                              " mammoth train ...)"
                        : "");
  MAMMOTH_CHECK(absl::GetFlag(FLAGS_zero) >= 0 && absl::GetFlag(FLAGS_zero) <= 3)
      << "[train] --zero must be 0, 1, 2 or 3, got " << absl::GetFlag(FLAGS_zero);
  const bool model_parallel = tp_size * sp_size > 1 || sp_mode != models::SpMode::kNone;
  // Where this process trains (DESIGN.md: CUDA device = local rank when CUDA devices exist).
  const engine::train::DeviceChoice device =
      engine::train::choose_device(absl::GetFlag(FLAGS_device), "train");
  if (device.device.is_cuda()) {
    // What the CUDA path does not have yet is refused here, before anything is built.
    MAMMOTH_CHECK(!model_parallel && pp_size == 1)
        << "[train] --device cuda: tensor/sequence/pipeline parallelism (--tp " << tp_size
        << " --sp " << sp_size << " --pp " << pp_size
        << ") is not wired to NCCL yet; only data parallelism (--dp, ZeRO 0-1) runs on CUDA "
           "(--device cpu runs them over MPI)";
    MAMMOTH_CHECK(launched == 1 || absl::GetFlag(FLAGS_zero) <= 1)
        << "[train] --device cuda with --dp: ZeRO " << absl::GetFlag(FLAGS_zero)
        << " is not enabled on CUDA yet (--zero 0 or 1)";
    MAMMOTH_CHECK(absl::GetFlag(FLAGS_device_mem).rfind("auto", 0) != 0)
        << "[train] --device-mem auto is not implemented on CUDA yet: give a size "
           "(--device-mem 8G)";
  }
  std::unique_ptr<parallel::DeviceMesh> mesh;
  if (launched > 1) {
    parallel::MeshOptions mo;
    mo.comm.timeout_s = absl::GetFlag(FLAGS_comm_timeout);
    // On CUDA every axis gets an NCCL group (bootstrapped over its MPI group).
    mo.device = device.device;
    mesh = std::make_unique<parallel::DeviceMesh>(
        parallel::mpi_world(mo.comm),
        parallel::MeshShape{.dp = dp_size, .pp = pp_size, .tp = tp_size, .sp = sp_size}, mo);
  }
  const bool lead = mesh == nullptr || mesh->rank() == 0;
  if (lead) {
    std::fprintf(stderr, "[train] device: %s (%s)\n", device.device.str().c_str(),
                 device.why.c_str());
  }

  data::TokenDataset train_data, val_data;
  int64_t vocab = 0;
  if (absl::GetFlag(FLAGS_data).empty()) {
    // Rank 0 tokenizes the corpus into the cache once; the others then read it.
    if (mesh && !lead) mesh->world().barrier();
    const data::BuildShardsResult r = default_data(absl::GetFlag(FLAGS_vocab_size));
    if (mesh && lead) mesh->world().barrier();
    train_data = data::TokenDataset::open(r.train_shards);
    val_data = data::TokenDataset::open(r.val_shards);
    vocab = r.vocab_size;
  } else {
    train_data = data::TokenDataset::open(absl::GetFlag(FLAGS_data));
    if (!absl::GetFlag(FLAGS_val_data).empty()) {
      val_data = data::TokenDataset::open(absl::GetFlag(FLAGS_val_data));
    }
  }

  models::ModelOptions mo;
  if (vocab > 0) mo.vocab_size = vocab;
  const std::string model_name = absl::GetFlag(FLAGS_model);
  const bool masked_lm = models::resolve_config(model_name).family == models::Family::kBert;
  if (vocab > 0 && masked_lm) {
    // The embedded corpus's byte-level BPE has no [MASK]: the model's vocabulary is the BPE's
    // plus one id for it, and <|endoftext|> (the BPE's last id) separates documents as [SEP].
    mo.vocab_size = vocab + 1;
    mo.special_tokens = models::SpecialTokenIds{.sep = vocab - 1, .mask = vocab};
  }
  mo.dropout = absl::GetFlag(FLAGS_dropout);
  mo.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  mo.fresh_init = absl::GetFlag(FLAGS_fresh_init);
  std::shared_ptr<models::LanguageModel> model = models::create_language_model(model_name, mo);
  model->set_activation_checkpointing(absl::GetFlag(FLAGS_activation_checkpointing));
  // Built and initialised on the host (the same weights on every device), then moved.
  engine::train::move_to_device(model->named_parameters(), device.device);
  engine::train::move_to_device(model->named_buffers(), device.device);
  const models::ModelConfig& cfg = model->config();
  // A pipeline stage carries each window as one row of seq_len + 1 tokens.
  const int64_t positions = absl::GetFlag(FLAGS_seq_len) + (pp_size > 1 ? 1 : 0);
  MAMMOTH_CHECK(absl::GetFlag(FLAGS_seq_len) > 0 && positions <= cfg.max_seq)
      << "[train] --seq-len " << absl::GetFlag(FLAGS_seq_len)
      << (pp_size > 1 ? " (+1 with --pp)" : "") << " exceeds the model's " << cfg.max_seq
      << " positions";

  engine::train::TrainOptions o;
  o.steps = absl::GetFlag(FLAGS_steps);
  o.micro_batch = absl::GetFlag(FLAGS_micro_batch);
  o.seq_len = absl::GetFlag(FLAGS_seq_len);
  o.grad_accum = absl::GetFlag(FLAGS_grad_accum);
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
  o.amp = amp;
  o.init_loss_scale = absl::GetFlag(FLAGS_loss_scale);
  o.loss_scale_growth_interval = absl::GetFlag(FLAGS_loss_scale_window);
  MAMMOTH_CHECK(o.init_loss_scale > 0)
      << "[train] --loss-scale must be > 0, got " << o.init_loss_scale;
  MAMMOTH_CHECK(o.loss_scale_growth_interval > 0)
      << "[train] --loss-scale-window must be > 0, got " << o.loss_scale_growth_interval;
  o.tensorboard_dir = absl::GetFlag(FLAGS_tensorboard);
  // Model FLOPs per trained token (PaLM's count): 6 per parameter plus attention's
  // 12 * layers * d_model * seq_len; recomputation is never counted.
  o.flops_per_token = 6.0 * static_cast<double>(model->num_parameters()) +
                      12.0 * static_cast<double>(cfg.n_layer * cfg.d_model * o.seq_len);
  o.peak_flops = absl::GetFlag(FLAGS_peak_gflops) * 1e9;
  o.device = device.device;
  if (masked_lm) {
    o.objective = "masked_lm";
    o.masking = masked_lm_options(cfg, "train");
  }

  // Tensor/sequence parallelism: the model's sharded form (its family's policy) trains instead.
  std::shared_ptr<models::ShardedLanguageModel> sharded;
  std::unique_ptr<PolicyShards> policy_shards;
  std::unique_ptr<parallel::DataParallel> dp;  // made below, once the trained form is known
  models::LanguageModel* trained = model.get();
  if (model_parallel) {
    MAMMOTH_CHECK(mesh != nullptr) << "[train] --tp/--sp need mpirun with several ranks";
    sharded = models::apply_policy(*model, *mesh, {.sp_mode = sp_mode});
    trained = sharded.get();
    policy_shards = std::make_unique<PolicyShards>(*sharded, *model, *mesh);
    o.model_shards = policy_shards.get();
    o.after_backward = [&sharded] { sharded->sync_grads(); };
    o.sync_grad = [&sharded](const std::string& n, const engine::Tensor& t) {
      sharded->sync_grad(n, t);
    };
  }
  // Pipeline parallelism: this rank runs its stages of the schedule over the step's
  // gradient-accumulation micro-batches, and updates only its stages' parameters.
  std::unique_ptr<models::LanguageModelPipeline> pipeline;
  if (pp_size > 1) {
    // The trained form: the model, or its tensor/sequence-parallel shards.
    std::shared_ptr<models::LanguageModel> staged =
        sharded ? std::shared_ptr<models::LanguageModel>(sharded) : model;
    MAMMOTH_CHECK(staged->supports_pipeline())
        << "[train] --pp: model family " << models::family_name(cfg.family)
        << " has no pipeline stages yet (GPT-2 has)";
    const auto schedule = parallel::pipeline::make_schedule(
        parallel::pipeline::schedule_kind_from_name(absl::GetFlag(FLAGS_pp_schedule)),
        {.stages = pp_size,
         .micro_batches = static_cast<int>(o.grad_accum),
         .virtual_stages = absl::GetFlag(FLAGS_virtual_stages)});
    // Balanced by FLOPs by default: the LM head alone costs several blocks.
    const parallel::pipeline::Partition partition =
        parallel::pipeline::partition_is_balanced(absl::GetFlag(FLAGS_pp_partition))
            ? models::LanguageModelPipeline::balanced(cfg, positions, schedule.num_virtual_stages())
            : parallel::pipeline::Partition{};
    pipeline = std::make_unique<models::LanguageModelPipeline>(
        staged, schedule, mesh->group(parallel::Axis::kPp), partition);
    if (mesh->rank() == 0) {
      std::string cuts;
      for (size_t s = 0; s + 1 < pipeline->partition().size(); ++s) {
        cuts += (s ? ", " : "") + std::to_string(pipeline->partition()[s]) + "-" +
                std::to_string(pipeline->partition()[s + 1] - 1);
      }
      std::fprintf(stderr, "[train] pipeline stages (%s): layers %s\n",
                   absl::GetFlag(FLAGS_pp_partition).c_str(), cuts.c_str());
    }
    o.pipeline_step = [&pipeline](const std::vector<engine::Tensor>& batches, double scale) {
      return pipeline->step(batches, scale);
    };
    o.optimizer_params = &pipeline->parameters();
    if (o.eval_every > 0 && mesh->rank() == 0) {
      std::fprintf(stderr,
                   "[train] --pp: periodic evaluation is off (stages hold only their "
                   "own parameters' updates)\n");
    }
    o.eval_every = 0;
  }
  if (mesh) {
    o.logging_rank = mesh->rank() == 0;
    // Every rank writes its shard of a sharded checkpoint.
    o.world_rank = mesh->rank();
    o.world_size = mesh->world_size();
    o.world_barrier = [&mesh] { mesh->world().barrier(); };
    o.layout = json::Value::object();
    o.layout.set("dp", json::Value(dp_size));
    o.layout.set("pp", json::Value(pp_size));
    o.layout.set("tp", json::Value(tp_size));
    o.layout.set("sp", json::Value(sp_size));
    o.layout.set("zero", json::Value(absl::GetFlag(FLAGS_zero)));
    if (pipeline) {
      // The tied wte lives on the first and the last stage; the first writes it.
      o.writes_parameter = [&pipeline](const std::string& name) {
        return pipeline->counts_in_norm(name);
      };
    }
  }

  // Chunked memory: any of --offload, --device-mem, --host-mem turns it on. Under dp the
  // offload runtime does the data parallelism itself, over its chunks (engine/offload/offload.h):
  // parallel::DataParallel would move the same parameters into its own buckets.
  engine::offload::OffloadOptions oo;
  oo.mode = engine::offload::parse_mode(absl::GetFlag(FLAGS_offload));
  const memory::chunks::DeviceMemSpec device_spec =
      memory::chunks::parse_device_mem(absl::GetFlag(FLAGS_device_mem));
  if (device_spec.auto_budget) {
    oo.auto_device_size = device_spec.bytes;
  } else {
    oo.device_mem = device_spec.bytes;
  }
  oo.host_mem = memory::chunks::parse_bytes(absl::GetFlag(FLAGS_host_mem), "--host-mem");
  const bool offload_on = oo.mode != engine::offload::Mode::kNone || oo.device_mem > 0 ||
                          oo.host_mem > 0 || oo.auto_device_size > 0;
  std::unique_ptr<parallel::OffloadGroup> offload_group;
  if (offload_on && mesh) {
    MAMMOTH_CHECK(!device.device.is_cuda())
        << "[train] --device cuda: --offload/--device-mem/--host-mem with --dp (chunks reduced "
           "over dp) is not implemented on CUDA yet; one process offloads on CUDA";
    MAMMOTH_CHECK(!model_parallel && !pipeline)
        << "[train] --offload/--device-mem/--host-mem combine with data parallelism (--dp) only, "
           "not with --tp "
        << tp_size << " / --sp " << sp_size << " / --pp " << pp_size;
    MAMMOTH_CHECK(absl::GetFlag(FLAGS_zero) == 0)
        << "[train] --offload shards the AdamW states over dp by chunk itself (ZeRO-Offload); "
           "--zero "
        << absl::GetFlag(FLAGS_zero) << " does not apply: leave it at 0";
    offload_group = std::make_unique<parallel::OffloadGroup>(mesh->group(parallel::Axis::kDp));
  }

  if (mesh && dp_size > 1 && !offload_on) {
    // Under pp each stage's replicas reduce their stage's parameters.
    dp = std::make_unique<parallel::DataParallel>(
        pipeline ? pipeline->parameters() : trained->named_parameters(),
        mesh->group(parallel::Axis::kDp),
        parallel::DataParallelOptions{.zero_stage = absl::GetFlag(FLAGS_zero),
                                      .bucket_mb = absl::GetFlag(FLAGS_bucket_mb)});
    dp->broadcast_parameters();
    o.dp = dp.get();

  } else if (!offload_on) {
    MAMMOTH_CHECK(absl::GetFlag(FLAGS_zero) == 0)
        << "[train] --zero " << absl::GetFlag(FLAGS_zero)
        << " shards over data-parallel ranks: launch with mpirun -np N (and --dp > 1)";
  }

  // The global gradient norm when the model is split: each rank sums the squares of the
  // gradients it counts (tp: sharded ones, replicated ones on their owner; sp: sp rank 0; pp:
  // a tied parameter on the first stage only), over its ZeRO shards and the dp group when dp
  // shards, then over tp, sp and pp.
  if (sharded || pipeline) {
    o.grad_norm = [&sharded, &pipeline, &dp, &mesh] {
      const bool sp0 = mesh->coord(parallel::Axis::kSp) == 0;
      auto counts = [&](const std::string& name) {
        return (!sharded || (sp0 && sharded->grad_owner(name))) &&
               (!pipeline || pipeline->counts_in_norm(name));
      };
      double sq = 0;
      if (dp) {
        sq = dp->grad_sq_sum(counts);
      } else {
        engine::nn::NamedTensors counted;
        for (const auto& [name, p] :
             pipeline ? pipeline->parameters() : sharded->named_parameters()) {
          if (counts(name)) counted.emplace_back(name, p);
        }
        sq = engine::optim::grad_sq_sum(counted);
      }
      if (sharded) {
        engine::Tensor t = engine::Tensor::from_vector({sq}, {1}, DType::kF64);
        mesh->cpu_group(parallel::Axis::kTp).all_reduce(t, parallel::ReduceOp::kSum);
        mesh->cpu_group(parallel::Axis::kSp).all_reduce(t, parallel::ReduceOp::kSum);
        sq = t.item();
      }
      return pipeline ? pipeline->grad_norm(sq) : std::sqrt(sq);
    };
  }

  std::unique_ptr<engine::offload::Offload> offload;
  if (offload_on) {
    oo.nvme_dir = absl::GetFlag(FLAGS_nvme_dir);
    const double chunk_mb = absl::GetFlag(FLAGS_chunk_mb);
    MAMMOTH_CHECK(chunk_mb > 0 && chunk_mb <= 65536)
        << "[train] --chunk-mb must be in (0, 65536], got " << chunk_mb;
    oo.chunk_bytes = static_cast<int64_t>(chunk_mb * 1048576.0);
    oo.group = offload_group.get();
    // Chunks follow the order in which a forward pass first touches the parameters (one short
    // sequence, no gradients), so they are needed one after the other.
    oo.use_order = engine::offload::first_use_order(model->named_parameters(), [&] {
      const int64_t t = std::min<int64_t>(o.seq_len, 8);
      const engine::Tensor ids = engine::Tensor::zeros({1, t}, DType::kI64, device.device);
      model->eval();
      model->loss(ids, ids);
      model->train();
    });
    offload = std::make_unique<engine::offload::Offload>(model->named_parameters(), oo);
    o.offload = offload.get();
    o.dp = offload->data_parallel();
    if (lead) std::fprintf(stderr, "%s", offload->report().c_str());
  }

  if (lead) {
    std::fprintf(
        stderr,
        "[train] model %s: %lld parameters | data: %lld training tokens%s | threads %d\n"
        "[train] batch %lld x %lld tokens x %lld accumulation x %d dp = %lld tokens/step, %lld "
        "steps\n",
        model_name.c_str(), static_cast<long long>(model->num_parameters()),
        static_cast<long long>(train_data.size()),
        val_data.size() ? (", " + std::to_string(val_data.size()) + " validation").c_str() : "",
        num_threads(), static_cast<long long>(o.micro_batch), static_cast<long long>(o.seq_len),
        static_cast<long long>(o.grad_accum), dp_size,
        static_cast<long long>(o.micro_batch * o.seq_len * o.grad_accum * dp_size),
        static_cast<long long>(o.steps));
    // Bytes on this rank for parameters, gradients and AdamW's two states: its tp shards or
    // pipeline stages, divided further by ZeRO.
    const int64_t elem = static_cast<int64_t>(dtype_size(cfg.dtype));
    int64_t n = 0;
    if (pipeline) {
      for (const auto& [name, t] : pipeline->parameters()) n += t.numel();
    } else {
      n = trained->num_parameters();
    }
    parallel::DataParallel::MemoryReport m =
        dp ? dp->memory() : parallel::DataParallel::MemoryReport{n * elem, n * elem, 2 * n * elem};
    if (offload) {
      const engine::offload::Offload::MemoryReport om = offload->memory();
      m = {om.params, om.grads, om.optimizer};
    }
    std::fprintf(
        stderr,
        "[train] per rank: parameters %.1f MiB (%.1f%% of the model's %.1f MiB), "
        "gradients %.1f MiB, optimizer states %.1f MiB (%s)\n",
        m.params / 1048576.0,
        100.0 * static_cast<double>(m.params) / static_cast<double>(model->num_parameters() * elem),
        static_cast<double>(model->num_parameters() * elem) / 1048576.0, m.grads / 1048576.0,
        m.optimizer / 1048576.0,
        offload && dp_size > 1
            ? "offload: sharded by chunk over dp"
            : ("ZeRO stage " + std::to_string(absl::GetFlag(FLAGS_zero))).c_str());
    // The formula above counts the persistent state; what the rank really reached (activations,
    // buffers in flight, gathered ZeRO-3 buckets included) is the allocator's peak.
    const double formula_mib = static_cast<double>(m.params + m.grads + m.optimizer) / 1048576.0;
    o.report_peak_memory = [formula_mib](int64_t peak) {
      std::fprintf(stderr,
                   "[train] per rank: measured peak %.1f MiB (allocator, first step; the formula "
                   "above sums to %.1f MiB without activations)\n",
                   static_cast<double>(peak) / 1048576.0, formula_mib);
    };
  }
  // Every rank: plan/memory_model's prediction for its pipeline stage against the allocator's
  // peak, printed as train() returns. Measured: the larger of the first step's peak and the
  // last one's (the allocator's peak since that step began); the first step alone would miss
  // what it makes lazily and keeps (offload's dp comm buffers), which later steps start with.
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
  // Destroyed before dp and offload are (their teardown allocates): declared after them.
  PeakMemoryReport peak_report;
  {
    plan::ParallelPlan flags_plan;
    flags_plan.dp = dp_size;
    flags_plan.pp = pp_size;
    flags_plan.tp = tp_size;
    flags_plan.sp = sp_size;
    flags_plan.sp_mode = absl::GetFlag(FLAGS_sp_mode);
    flags_plan.pp_schedule = absl::GetFlag(FLAGS_pp_schedule);
    flags_plan.virtual_stages = absl::GetFlag(FLAGS_virtual_stages);
    flags_plan.pp_partition = absl::GetFlag(FLAGS_pp_partition);
    if (pipeline) flags_plan.stage_cut = pipeline->partition();
    flags_plan.micro_batch = o.micro_batch;
    flags_plan.grad_accum = o.grad_accum;
    flags_plan.seq_len = o.seq_len;
    flags_plan.zero = absl::GetFlag(FLAGS_zero);
    flags_plan.bucket_mb = absl::GetFlag(FLAGS_bucket_mb);
    flags_plan.offload = absl::GetFlag(FLAGS_offload);
    flags_plan.device_mem = oo.device_mem;
    flags_plan.auto_device_mem = oo.auto_device_size;
    flags_plan.host_mem = oo.host_mem;
    flags_plan.chunk_mb = absl::GetFlag(FLAGS_chunk_mb);
    flags_plan.recompute_blocks = absl::GetFlag(FLAGS_activation_checkpointing) ? -1 : 0;
    flags_plan.amp = amp;
    flags_plan.device = device.device.is_cuda() ? "cuda" : "cpu";
    const int stage = mesh ? mesh->coord(parallel::Axis::kPp) : 0;
    peak_report.rank = mesh ? mesh->rank() : 0;
    peak_report.device = device.device;
    peak_report.predicted =
        plan::predict_memory(cfg, flags_plan).stages[static_cast<size_t>(stage)].device_peak;
    o.report_peak_memory = [lead_report = o.report_peak_memory,
                            report = &peak_report](int64_t peak) {
      if (lead_report) lead_report(peak);
      report->first_step = peak;
    };
  }

  json::Value config = json::Value::object();
  config.set("model", json::Value(model_name));
  config.set("model_config", models::config_to_hf_json(cfg));
  // --dump-batches: what the model is fed, as the tests of the masking rule read it.
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> dump(nullptr, std::fclose);
  if (!absl::GetFlag(FLAGS_dump_batches).empty()) {
    const std::string path = absl::GetFlag(FLAGS_dump_batches) +
                             (mesh ? ".rank" + std::to_string(mesh->rank()) : std::string());
    dump.reset(std::fopen(path.c_str(), "w"));
    MAMMOTH_CHECK(dump != nullptr) << "[train] --dump-batches: cannot write " << path;
  }
  const engine::train::TrainResult r = engine::train::train(
      *trained,
      [&](const engine::Tensor& in, const engine::Tensor& tg) {
        if (dump && trained->is_training()) {
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
        return trained->loss(in, tg);
      },
      train_data, val_data, o, config);
  if (lead && !r.losses.empty()) {
    std::fprintf(stderr, "[train] done: steps %lld..%lld, loss %.4f -> %.4f",
                 static_cast<long long>(r.first_step), static_cast<long long>(r.last_step),
                 r.losses.front(), r.losses.back());
    if (r.last_val_loss == r.last_val_loss)
      std::fprintf(stderr, ", validation %.4f", r.last_val_loss);
    if (amp == "fp16")
      std::fprintf(stderr, ", %lld step(s) skipped, loss scale %g",
                   static_cast<long long>(r.skipped_steps), r.loss_scale);
    std::fprintf(stderr, "%s\n", r.interrupted ? " (interrupted; checkpoint saved)" : "");
  }
  if (lead && offload) std::fprintf(stderr, "%s", offload->report().c_str());
  return r.interrupted ? 130 : 0;
}

}  // namespace

MAMMOTH_COMMAND(train, "train a model (default: gpt2-tiny on the embedded corpus)", run_train);

}  // namespace mammoth::tools
