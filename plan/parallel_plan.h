// ParallelPlan: everything that shapes a training run's layout, as one value.
//
// A plan is what `mammoth train` runs (its flags build one, `--plan FILE` reads one), what
// `mammoth plan` searches over and predicts, and what checkpoints record as the layout. It is
// plain data: mesh axes and their order, sequence-parallel mode, pipeline schedule and stage
// cut, micro-batch and accumulation, ZeRO stage, offload tiers and budgets, chunk size,
// recompute, mixed precision and the device kind.
//
// validate() holds every rule about which combinations run, with the message users see; no
// other code refuses a combination of these fields (library code keeps only invariant checks
// that a valid plan never trips). check() is the same rules without throwing, for the search.
//
// JSON (plan_to_json / plan_from_json) uses the field names below; unknown keys are refused by
// name, absent keys take the defaults, so a plan file may say only what differs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/json.h"
#include "models/config.h"

namespace mammoth::plan {

struct ParallelPlan {
  // Mesh: world = dp * pp * tp * sp. `order` lists the axes fastest-varying first
  // (parallel/mesh.h): "tp-sp-dp-pp" keeps a tp group on neighbouring ranks.
  int dp = 1;
  int pp = 1;
  int tp = 1;
  int sp = 1;
  std::string order = "tp-sp-dp-pp";
  // none | split_gather (Megatron-style, on the tp group) | ulysses | ring (on the sp axis).
  std::string sp_mode = "none";

  // Pipeline (pp > 1): gpipe | 1f1b | interleaved | zb; model chunks per rank (interleaved);
  // how layers are cut: "balanced" (by FLOPs, head included) or "count"; `stage_cut`, when not
  // empty, gives the pp * virtual_stages + 1 layer boundaries explicitly (0 first, n_layer last).
  std::string pp_schedule = "1f1b";
  int virtual_stages = 1;
  std::string pp_partition = "balanced";
  std::vector<int64_t> stage_cut;

  // Batch: sequences per micro-batch, micro-batches per step per dp rank (the pipeline's
  // micro-batches under pp), tokens per sequence. Global batch = micro_batch * grad_accum * dp.
  int64_t micro_batch = 8;
  int64_t grad_accum = 1;
  int64_t seq_len = 64;

  // Data parallelism: ZeRO stage 0-3 over dp, gradient bucket size.
  int zero = 0;
  double bucket_mb = 25.0;

  // Expert parallelism (mixture-of-experts models): the dp ranks fall into groups of `ep`
  // consecutive dp ranks that split the experts (E / ep each) and exchange tokens; the ranks
  // holding the same experts (dp / ep of them) reduce those experts' gradients. Not a mesh axis:
  // every dp rank still reads its own micro-batches, so the world and the batch stay dp's.
  int ep = 1;

  // Chunked memory (engine/offload), named as DeepSpeed's offload_optimizer / offload_param:
  // `offload` (JSON and flag offload_optimizer; --offload is its short form) is where AdamW
  // states live, `offload_params` where the parameter and gradient chunks are homed (none: the
  // device when they fit device_mem, else host), each none | host | nvme; budgets in bytes
  // (0: unlimited) for the device and host tiers, or auto_device_mem: the size of a device whose
  // first step's traced activation peak is taken off; chunk size; NVMe directory.
  std::string offload = "none";
  std::string offload_params = "none";
  int64_t device_mem = 0;
  int64_t auto_device_mem = 0;
  int64_t host_mem = 0;
  double chunk_mb = 32.0;
  std::string nvme_dir;

  // Recompute: the first `recompute_blocks` transformer blocks keep only their input and are
  // recomputed in backward (0: none; -1: every block).
  int64_t recompute_blocks = 0;

  // Mixed precision: fp32 | bf16 | fp16.
  std::string amp = "fp32";
  // Where the ranks compute: cpu | cuda.
  std::string device = "cpu";

  int world() const { return dp * pp * tp * sp; }
  int64_t global_batch() const { return micro_batch * grad_accum * dp; }
  bool offloaded() const {
    return offload != "none" || offload_params != "none" || device_mem > 0 || auto_device_mem > 0 ||
           host_mem > 0;
  }
  // ZeRO-3 with its parameter shards homed on NVMe (parallel::DataParallel pages them; the
  // engine's chunked offload is not used): --dp N --zero 3 --offload-params nvme.
  bool zero3_shards_on_nvme() const { return zero == 3 && dp > 1 && offload_params == "nvme"; }
  bool operator==(const ParallelPlan&) const = default;
};

// What validate() checks a plan against; a field left at its default is not checked.
// What a run trains: a language model (causal or masked) or a classifier (a classification
// head: BERT's sequence classification, ViT's images).
enum class Task { kLanguageModel, kClassifier };

struct PlanContext {
  int world = 0;                               // processes launched (0: any)
  const models::ModelConfig* model = nullptr;  // null: model rules not checked
  bool run = false;  // about to run here: what only a run needs (an NVMe directory) is checked
  Task task = Task::kLanguageModel;  // checked with `model`
  bool adapters = false;             // LoRA adapters train beside the frozen model
};

// The first rule the plan breaks, as the message users see ("" when it is valid).
std::string check(const ParallelPlan& plan, const PlanContext& context = {});
// Throws mammoth::Error with check()'s message, prefixed "[plan] ".
void validate(const ParallelPlan& plan, const PlanContext& context = {});

json::Value plan_to_json(const ParallelPlan& plan);
// Unknown keys and values of the wrong type are errors naming the key.
ParallelPlan plan_from_json(const json::Value& value);
ParallelPlan load_plan(const std::string& path);
void save_plan(const ParallelPlan& plan, const std::string& path);

// Expert parallelism's token traffic: bytes one rank sends per step in the expert exchanges
// (all_to_all_v), assuming the router spreads the rows evenly over the experts (no capacity
// drop). Per micro-batch and MoE layer, the micro_batch * seq_len * top_k routed rows of
// d_model elements go to the experts' ranks, (ep - 1) / ep of them to other ranks; they leave
// once for the experts and once back, and the backward repeats both: 4 exchanges. Received
// bytes are the same on average. 0 when ep == 1 or the model has no experts.
int64_t expert_exchange_bytes_per_step(const ParallelPlan& plan, const models::ModelConfig& model);

// The experts one rank holds: all of the model's, or 1/ep of them under --ep (0 without).
int64_t local_experts(const ParallelPlan& plan, const models::ModelConfig& model);

// ZeRO-3 buckets a rank keeps gathered (parallel::DataParallelOptions::resident_buckets): two
// for parameters without experts, or the rank's experts where there are more, since one grouped
// GEMM reads every local expert's weight at once and a launch makes all its inputs resident
// before it starts.
inline constexpr int kZero3ResidentBuckets = 2;
int zero3_resident_buckets(const ParallelPlan& plan, const models::ModelConfig& model);

// One line: "dp2 pp1 tp2 sp1 (tp-sp-dp-pp) mb4x2 zero1 offload none recompute 0 fp32" (and
// " ep2" after the mesh under expert parallelism).
std::string plan_summary(const ParallelPlan& plan);

}  // namespace mammoth::plan
