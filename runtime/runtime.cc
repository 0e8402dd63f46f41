#include "runtime/runtime.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <utility>

#include "base/error.h"
#include "engine/offload/offload.h"
#include "engine/optim/optim.h"
#include "engine/train/device.h"
#include "memory/allocator.h"
#include "models/family.h"
#include "models/mixtral/mixtral.h"
#include "models/pipeline/pipeline.h"
#include "models/policies/lora_tp.h"
#include "models/policies/policy.h"
#include "models/vit/vit.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/data_parallel.h"
#include "parallel/expert_parallel.h"
#include "parallel/offload_group.h"
#include "parallel/pipeline/partition.h"
#include "parallel/pipeline/schedule.h"

namespace mammoth::runtime {
namespace {

// Checkpoints of a tensor/sequence-parallel run see the single-process model through this:
// each piece of a rank's shard is mapped onto the single-process tensor (ShardSpec's layout;
// a replicated KV head is rows of the full projection), and one rank per distinct part writes.
class PolicyShards final : public engine::train::ModelShardRuntime {
 public:
  // With `lora`, what trains (and is checkpointed) is its adapters, not the frozen model.
  // `sharded`: the sharded form's layout (a ShardedLanguageModel or ShardedVit) and `module`,
  // the same object as the module whose parameters it holds. `trained`: the part of `full`
  // that trains and is checkpointed (null: all of it).
  PolicyShards(const models::ShardLayout& sharded, const engine::nn::Module& module,
               const models::Model& full, const parallel::DeviceMesh& mesh, models::TpLora* lora,
               const engine::nn::NamedTensors* trained)
      : sharded_(sharded),
        lora_(lora),
        full_(lora      ? lora->single_process_parameters()
              : trained ? *trained
                        : full.named_parameters()),
        mesh_(mesh) {
    for (const auto& [name, t] : lora ? lora->parameters() : module.named_parameters())
      local_shape_[name] = t.shape();
    for (const auto& [name, t] : full_) full_shape_[name] = t.shape();
  }
  std::vector<FlatRun> single_process_runs(const std::string& param, int64_t lo,
                                           int64_t hi) const override {
    const engine::Shape& local = shape_in(local_shape_, param);
    const int tp = mesh_.size(parallel::Axis::kTp), r = mesh_.coord(parallel::Axis::kTp);
    const parallel::ShardSpec spec = lora_ ? lora_->spec(param) : sharded_.spec(param);
    std::vector<FlatRun> runs;
    if (spec.sharded()) {
      for (const auto& run : parallel::shard_flat_runs(spec, local, r, tp, lo, hi)) {
        runs.push_back({run.global, run.local, run.length});
      }
      return runs;
    }
    int64_t offset = 0;
    if (!lora_ && !sharded_.holds_full(param)) {
      // A replicated KV head: this rank holds head r / (tp / heads), rows of dim 0.
      const int64_t rows = local[0], heads = shape_in(full_shape_, param)[0] / rows;
      const int64_t head = r / (tp / heads);
      offset = head * engine::shape_numel(local);
    }
    if (lo < hi) runs.push_back({offset + lo, lo, hi - lo});
    return runs;
  }
  bool writes(const std::string& param) const override {
    return mesh_.coord(parallel::Axis::kSp) == 0 &&
           (lora_ ? lora_->grad_owner(param) : sharded_.grad_owner(param));
  }
  const engine::nn::NamedTensors& single_process_parameters() const override { return full_; }

 private:
  static const engine::Shape& shape_in(const std::map<std::string, engine::Shape>& shapes,
                                       const std::string& param) {
    auto it = shapes.find(param);
    MAMMOTH_CHECK(it != shapes.end()) << "[train] no parameter '" << param << "'";
    return it->second;
  }
  const models::ShardLayout& sharded_;
  models::TpLora* lora_;
  engine::nn::NamedTensors full_;
  const parallel::DeviceMesh& mesh_;
  std::map<std::string, engine::Shape> local_shape_, full_shape_;
};

}  // namespace

// What assemble() builds; each is null when the plan does not use it.
struct TrainingRuntime::Parts {
  std::shared_ptr<models::ShardedLanguageModel> sharded;
  // A classifier's tp/sp form (ShardedVit, or BERT's policy form for classify) and, when only
  // part of it trains (BERT: all but the masked-LM head), that part.
  std::shared_ptr<models::Model> sharded_classifier;
  engine::nn::NamedTensors sharded_trained;
  // Whichever of the two trains: its shard bookkeeping and its module.
  const models::ShardLayout* shards = nullptr;
  const engine::nn::Module* shard_module = nullptr;
  std::unique_ptr<models::TpLora> tp_lora;  // LoRA's pieces on `sharded`
  std::unique_ptr<PolicyShards> policy_shards;
  std::unique_ptr<models::ModelPipeline> pipeline;
  engine::nn::NamedTensors stage_trained;  // pp with trained_params: this rank's stages' share
  std::unique_ptr<parallel::DataParallel> dp;
  // Expert parallelism: the expert group and the expert-data-parallel group (split from dp),
  // and the runtime that reduces over both.
  std::unique_ptr<parallel::Communicator> ep_group, expert_dp_group;
  std::unique_ptr<parallel::ExpertDataParallel> ep_dp;
  std::unique_ptr<parallel::OffloadGroup> offload_group;
  std::unique_ptr<engine::offload::Offload> offload;
};

TrainingRuntime::TrainingRuntime(const plan::ParallelPlan& plan, Device device,
                                 double comm_timeout_s)
    : plan_(plan), device_(device), parts_(std::make_unique<Parts>()) {
  plan::validate(plan_, {.world = parallel::process_info().world_size, .run = true});
  if (plan_.world() > 1) {
    parallel::MeshOptions mo;
    mo.order = plan_.order;
    mo.comm.timeout_s = comm_timeout_s;
    // On CUDA every axis gets an NCCL group (bootstrapped over its MPI group).
    mo.device = device_;
    mesh_ = std::make_unique<parallel::DeviceMesh>(
        parallel::mpi_world(mo.comm),
        parallel::MeshShape{.dp = plan_.dp, .pp = plan_.pp, .tp = plan_.tp, .sp = plan_.sp}, mo);
  }
}

TrainingRuntime::~TrainingRuntime() = default;

int TrainingRuntime::rank() const { return mesh_ ? mesh_->rank() : 0; }

void TrainingRuntime::barrier() const {
  if (mesh_) mesh_->world().barrier();
}

void TrainingRuntime::assemble(std::shared_ptr<models::LanguageModel> model,
                               engine::train::TrainOptions& o) {
  MAMMOTH_CHECK(model_ == nullptr) << "[runtime] assemble() runs once";
  const models::ModelConfig& cfg = model->config();
  plan::validate(plan_, {.model = &cfg, .adapters = o.trained_params != nullptr});
  model_ = std::move(model);
  trained_ = model_.get();
  // LoRA (o.trained_params: adapters beside a frozen model) trains under dp, ZeRO, tp and sp
  // (its pieces on the sharded layers) and pp (each stage its layers' adapters).
  if (o.trained_params) {
    trained_params_ = o.trained_params;
    MAMMOTH_CHECK((plan_.tp == 1 && plan_.sp == 1 && plan_.sp_mode == "none") || lora_ != nullptr)
        << "[runtime] LoRA under tp/sp needs the adapters (set_lora) before assemble()";
  }
  model_->set_recompute_blocks(plan_.recompute_blocks);
  Parts& p = *parts_;
  const models::SpMode sp_mode = models::sp_mode_from_name(plan_.sp_mode);
  o.micro_batch = plan_.micro_batch;
  o.grad_accum = plan_.grad_accum;
  o.seq_len = plan_.seq_len;
  o.amp = plan_.amp;
  o.device = device_;

  // Tensor/sequence parallelism: the model's sharded form (its family's policy) trains instead.
  if (plan_.tp * plan_.sp > 1 || sp_mode != models::SpMode::kNone) {
    p.sharded = models::apply_policy(*model_, *mesh_, {.sp_mode = sp_mode});
    trained_ = p.sharded.get();
    if (trained_params_) {
      p.tp_lora = std::make_unique<models::TpLora>(*lora_, *p.sharded);
      engine::train::move_to_device(p.tp_lora->parameters(), device_);
      trained_params_ = &p.tp_lora->parameters();
      o.trained_params = trained_params_;
    }
    wire_shards(*p.sharded, *p.sharded, *model_, o, nullptr);
    if (models::TpLora* lora = p.tp_lora.get()) {
      o.after_backward = [lora] { lora->sync_grads(); };
      o.sync_grad = [lora](const std::string& n, const engine::Tensor& t) {
        lora->sync_grad(n, t);
      };
    }
  }

  // Pipeline parallelism: this rank runs its stages of the schedule over the step's
  // gradient-accumulation micro-batches, and updates only its stages' parameters.
  if (plan_.pp > 1) {
    std::shared_ptr<models::LanguageModel> staged =
        p.sharded ? std::shared_ptr<models::LanguageModel>(p.sharded) : model_;
    // A decoder's stage carries each window as one row of seq_len + 1 tokens.
    build_pipeline(staged, plan_.seq_len + 1, o);
    if (trained_params_) {
      keep_trained_stage_params(o);
      MAMMOTH_CHECK(!p.stage_trained.empty())
          << "[train] LoRA with --pp: no --lora-targets layer is on pipeline stage "
          << mesh_->coord(parallel::Axis::kPp) << "; target layers of every block";
    }
  }

  if (mesh_) set_world_fields(o);

  // Chunked memory. Under dp the offload runtime does the data parallelism itself, over its
  // chunks (engine/offload/offload.h): parallel::DataParallel would move the same parameters
  // into its own buckets.
  const bool chunked = plan_.offloaded() && !plan_.zero3_shards_on_nvme();
  if (chunked && mesh_) {
    p.offload_group = std::make_unique<parallel::OffloadGroup>(mesh_->group(parallel::Axis::kDp));
  }
  if (mesh_ && plan_.ep > 1) {
    // Expert groups of ep consecutive dp ranks (parallel/expert_parallel.h). The dp group is
    // that of this rank's tp coordinate and the experts are whole on every tp rank
    // (models/mixtral), so under --tp each tp rank is an expert rank of its own group; the
    // sharded form's parameters are what trains then; under pp each stage's expert groups
    // exchange its layers' tokens. plan::validate admitted only a mixture of experts here.
    parallel::Communicator& dp = mesh_->group(parallel::Axis::kDp);
    const int d = mesh_->coord(parallel::Axis::kDp);
    p.ep_group = dp.split(d / plan_.ep, d, "ep");
    p.expert_dp_group = dp.split(d % plan_.ep, d, "expert_dp");
    models::set_expert_parallel(*trained_, p.ep_group.get());
    const int64_t local = plan::local_experts(plan_, cfg), first = (d % plan_.ep) * local;
    // Under pp, of this rank's stages only (each stage's replicas reduce their stage's).
    std::set<const void*> staged;
    if (p.pipeline) {
      for (const auto& np : *o.optimizer_params) staged.insert(np.second.impl());
    }
    engine::nn::NamedTensors shared, experts, others;
    for (const auto& [name, t] : trained_->named_parameters()) {
      const int64_t e = models::Mixtral::expert_of(name);
      const bool here = !p.pipeline || staged.count(t.impl()) > 0;
      if (e >= 0 && (e < first || e >= first + local))
        others.emplace_back(name, t);
      else if (!here)
        continue;
      else if (e < 0)
        shared.emplace_back(name, t);
      else
        experts.emplace_back(name, t);
    }
    // This rank holds its share of the experts only: the others' weights are freed (their
    // shapes stay, for the checkpoint index), and a kernel that reaches one says whose it is.
    for (const auto& [name, t] : others) {
      engine::Storage& st = *t.storage();
      MAMMOTH_CHECK(st.nbytes == t.nbytes() && st.allocator != nullptr)
          << "[train] --ep: expert parameter '" << name << "' does not own its storage";
      st.allocator->deallocate(st.data, st.nbytes);
      st.data = nullptr;
      st.allocator = nullptr;
      const int64_t owner = models::Mixtral::expert_of(name) / local;
      st.ensure_resident = [name = name, owner](bool) {
        MAMMOTH_THROW() << "[train] --ep: " << name << " is held by expert rank " << owner
                        << " of this rank's expert group, not here";
      };
    }
    const parallel::DataParallelOptions options{.zero_stage = plan_.zero,
                                                .bucket_mb = plan_.bucket_mb,
                                                .resident_buckets = plan::kZero3ResidentBuckets};
    parallel::DataParallelOptions expert_options = options;
    expert_options.resident_buckets = plan::zero3_resident_buckets(plan_, cfg);
    p.ep_dp = std::make_unique<parallel::ExpertDataParallel>(
        shared, experts, dp, *p.expert_dp_group, *p.ep_group, options, expert_options);
    p.ep_dp->broadcast_parameters();
    o.dp = p.ep_dp.get();
  } else if (mesh_ && plan_.dp > 1 && !chunked) {
    // Under pp each stage's replicas reduce their stage's parameters.
    p.dp = std::make_unique<parallel::DataParallel>(
        p.pipeline        ? *o.optimizer_params
        : trained_params_ ? *trained_params_
                          : trained_->named_parameters(),
        mesh_->group(parallel::Axis::kDp),
        parallel::DataParallelOptions{
            .zero_stage = plan_.zero,
            .bucket_mb = plan_.bucket_mb,
            .shard_nvme_dir = plan_.zero3_shards_on_nvme() ? plan_.nvme_dir : std::string(),
            .shard_device_mem = plan_.device_mem,
            .shard_host_mem = plan_.host_mem,
            .resident_buckets = plan::zero3_resident_buckets(plan_, cfg)});
    p.dp->broadcast_parameters();
    o.dp = p.dp.get();
    if (const memory::chunks::ChunkManager* shards = p.dp->shard_chunks()) {
      // The shards' tiers as the chunk manager accounts them, in every metrics line.
      o.step_metrics = [shards] {
        return json::Value::object().set("zero3_shards", engine::offload::tier_stats_json(*shards));
      };
      if (lead())
        std::fprintf(stderr, "[train] ZeRO-3 parameter shards:\n%s", shards->report().c_str());
    }
  }

  set_grad_norm(o);

  if (chunked) {
    engine::offload::OffloadOptions oo;
    oo.mode = engine::offload::parse_mode(plan_.offload);
    oo.params = engine::offload::parse_mode(plan_.offload_params);
    oo.device_mem = plan_.device_mem;
    oo.auto_device_size = plan_.auto_device_mem;
    oo.host_mem = plan_.host_mem;
    oo.nvme_dir = plan_.nvme_dir;
    oo.chunk_bytes = static_cast<int64_t>(plan_.chunk_mb * 1048576.0);
    oo.group = p.offload_group.get();
    // What this rank trains: its tp shard (the sharded form) or its pipeline stages.
    const engine::nn::NamedTensors& trained =
        p.pipeline ? p.pipeline->parameters() : trained_->named_parameters();
    // Chunks follow the order in which a forward pass first touches the parameters (one short
    // sequence, no gradients; under tp every rank runs it, with its collectives), so they are
    // needed one after the other. A pipeline stage has no forward of its own to trace: model
    // order.
    if (!p.pipeline) {
      models::LanguageModel* m = trained_;
      const int64_t t = std::min<int64_t>(plan_.seq_len, 8);
      oo.use_order = engine::offload::first_use_order(trained, [m, t, this] {
        const engine::Tensor ids = engine::Tensor::zeros({1, t}, DType::kI64, device_);
        m->eval();
        m->loss(ids, ids);
        m->train();
      });
    }
    p.offload = std::make_unique<engine::offload::Offload>(trained, oo);
    o.offload = p.offload.get();
    o.dp = p.offload->data_parallel();
    if (lead()) std::fprintf(stderr, "%s", p.offload->report().c_str());
  }
}

void TrainingRuntime::build_pipeline(std::shared_ptr<models::Model> staged, int64_t positions,
                                     engine::train::TrainOptions& o) {
  namespace pl = parallel::pipeline;
  Parts& p = *parts_;
  const pl::Schedule schedule =
      pl::make_schedule(pl::schedule_kind_from_name(plan_.pp_schedule),
                        {.stages = plan_.pp,
                         .micro_batches = static_cast<int>(plan_.grad_accum),
                         .virtual_stages = plan_.virtual_stages});
  // Balanced by FLOPs by default: the LM head alone costs several blocks.
  const std::string how = plan_.stage_cut.empty() ? plan_.pp_partition : "stage_cut";
  pl::Partition partition(plan_.stage_cut.begin(), plan_.stage_cut.end());
  if (partition.empty() && pl::partition_is_balanced(plan_.pp_partition)) {
    partition =
        models::ModelPipeline::balanced(staged->config(), positions, schedule.num_virtual_stages());
  }
  p.pipeline = std::make_unique<models::ModelPipeline>(
      staged, schedule, mesh_->group(parallel::Axis::kPp), partition);
  // The plan from here on says where the stages were cut (the memory model reads it).
  plan_.stage_cut = p.pipeline->partition();
  if (lead()) {
    std::string cuts;
    for (size_t s = 0; s + 1 < p.pipeline->partition().size(); ++s) {
      cuts += (s ? ", " : "") + std::to_string(p.pipeline->partition()[s]) + "-" +
              std::to_string(p.pipeline->partition()[s + 1] - 1);
    }
    std::fprintf(stderr, "[train] pipeline stages (%s): layers %s\n", how.c_str(), cuts.c_str());
  }
  models::ModelPipeline* pipeline = p.pipeline.get();
  o.pipeline_step = [pipeline](const std::vector<engine::Tensor>& batches, double scale) {
    return pipeline->step(batches, scale);
  };
  o.optimizer_params = &p.pipeline->parameters();
  // A tied table (wte) lives on the first and the last stage; the first writes it.
  o.writes_parameter = [pipeline](const std::string& name) {
    return pipeline->counts_in_norm(name);
  };
  if (o.eval_every > 0 && lead()) {
    std::fprintf(stderr,
                 "[train] --pp: periodic evaluation is off (stages hold only their "
                 "own parameters' updates)\n");
  }
  o.eval_every = 0;
}

void TrainingRuntime::keep_trained_stage_params(engine::train::TrainOptions& o) {
  // LoRA adapters live outside the model's parameters and a classifier trains without BERT's
  // masked-LM head, so the names that train are filtered by the pipeline's own rule.
  Parts& p = *parts_;
  p.stage_trained.clear();
  for (const auto& [name, t] : *trained_params_) {
    if (p.pipeline->holds(name)) p.stage_trained.emplace_back(name, t);
  }
  o.optimizer_params = &p.stage_trained;
}

void TrainingRuntime::wire_shards(const models::ShardLayout& shards,
                                  const engine::nn::Module& module, const models::Model& full,
                                  engine::train::TrainOptions& o,
                                  const engine::nn::NamedTensors* trained) {
  Parts& p = *parts_;
  p.shards = &shards;
  p.shard_module = &module;
  p.policy_shards =
      std::make_unique<PolicyShards>(shards, module, full, *mesh_, p.tp_lora.get(), trained);
  o.model_shards = p.policy_shards.get();
  const models::ShardLayout* layout = &shards;
  o.after_backward = [layout] { layout->sync_grads(); };
  o.sync_grad = [layout](const std::string& n, const engine::Tensor& t) {
    layout->sync_grad(n, t);
  };
}

void TrainingRuntime::set_grad_norm(engine::train::TrainOptions& o) {
  // The global gradient norm when the model is split: each rank sums the squares of the
  // gradients it counts (tp: sharded ones, replicated ones on their owner; sp: sp rank 0; pp:
  // a tied parameter on the first stage only), over its ZeRO shards and the dp group when dp
  // shards, then over tp, sp and pp.
  const Parts& p = *parts_;
  if (p.shards || p.pipeline) {
    Parts* parts = parts_.get();
    parallel::DeviceMesh* mesh = mesh_.get();
    o.grad_norm = [parts, mesh] {
      const bool sp0 = mesh->coord(parallel::Axis::kSp) == 0;
      auto counts = [&](const std::string& name) {
        if (parts->tp_lora) {
          return sp0 && parts->tp_lora->grad_owner(name) &&
                 (!parts->pipeline || parts->pipeline->counts_in_norm(name));
        }
        return (!parts->shards || (sp0 && parts->shards->grad_owner(name))) &&
               (!parts->pipeline || parts->pipeline->counts_in_norm(name));
      };
      double sq = 0;
      if (parts->dp) {
        sq = parts->dp->grad_sq_sum(counts);
      } else if (parts->ep_dp) {
        // --ep under tp: the experts too are replicated over tp, counted on tp rank 0.
        sq = parts->ep_dp->grad_sq_sum(counts);
      } else {
        engine::nn::NamedTensors counted;
        for (const auto& [name, t] :
             parts->pipeline  ? (parts->stage_trained.empty() ? parts->pipeline->parameters()
                                                              : parts->stage_trained)
             : parts->tp_lora ? parts->tp_lora->parameters()
                              : parts->shard_module->named_parameters()) {
          if (counts(name)) counted.emplace_back(name, t);
        }
        sq = engine::optim::grad_sq_sum(counted);
      }
      if (parts->shards) {
        engine::Tensor t = engine::Tensor::from_vector({sq}, {1}, DType::kF64);
        mesh->cpu_group(parallel::Axis::kTp).all_reduce(t, parallel::ReduceOp::kSum);
        mesh->cpu_group(parallel::Axis::kSp).all_reduce(t, parallel::ReduceOp::kSum);
        sq = t.item();
      }
      return parts->pipeline ? parts->pipeline->grad_norm(sq) : std::sqrt(sq);
    };
  }
}

void TrainingRuntime::set_world_fields(engine::train::TrainOptions& o) const {
  o.logging_rank = lead();
  // Every rank writes its shard of a sharded checkpoint.
  o.world_rank = mesh_->rank();
  o.world_size = mesh_->world_size();
  parallel::DeviceMesh* mesh = mesh_.get();
  o.world_barrier = [mesh] { mesh->world().barrier(); };
  o.world_any = [mesh](bool mine) {
    engine::Tensor flag = engine::Tensor::from_ints({mine ? 1 : 0}, {1});
    mesh->world().all_reduce(flag, parallel::ReduceOp::kMax);
    return flag.to_int_vector()[0] != 0;
  };
  o.layout = json::Value::object();
  o.layout.set("dp", json::Value(plan_.dp));
  o.layout.set("pp", json::Value(plan_.pp));
  o.layout.set("tp", json::Value(plan_.tp));
  o.layout.set("sp", json::Value(plan_.sp));
  o.layout.set("zero", json::Value(plan_.zero));
  if (plan_.ep > 1) o.layout.set("ep", json::Value(plan_.ep));
}

void TrainingRuntime::assemble_classifier(std::shared_ptr<models::Model> model,
                                          engine::train::TrainOptions& o) {
  MAMMOTH_CHECK(model_ == nullptr && classifier_ == nullptr) << "[runtime] assemble() runs once";
  const models::FamilySpec& spec = models::family_spec(model->config().family);
  plan::validate(plan_, {.model = &model->config(), .task = plan::Task::kClassifier});
  const models::SpMode sp_mode = models::sp_mode_from_name(plan_.sp_mode);
  const bool sharded = plan_.tp * plan_.sp > 1 || sp_mode != models::SpMode::kNone;
  classifier_ = std::move(model);
  classifier_->set_recompute_blocks(plan_.recompute_blocks);
  trained_params_ = o.trained_params;
  o.micro_batch = plan_.micro_batch;
  o.grad_accum = plan_.grad_accum;
  o.seq_len = plan_.seq_len;
  o.amp = plan_.amp;
  o.device = device_;
  if (!mesh_) return;
  Parts& p = *parts_;
  if (sharded) {
    const engine::nn::NamedTensors* whole_trained = trained_params_;
    const models::ShardLayout* layout = nullptr;
    // A language model's form through its family's registered policy (BERT's has classify);
    // ViT, no language model, has its own.
    if (const auto* vit = dynamic_cast<const models::Vit*>(classifier_.get())) {
      auto form = models::vit_policy(*vit, *mesh_, {.sp_mode = sp_mode});
      layout = form.get();
      p.sharded_classifier = form;
    } else {
      auto form = models::apply_policy(*classifier_, *mesh_, {.sp_mode = sp_mode});
      layout = form.get();
      p.sharded_classifier = form;
    }
    models::Model& form = *p.sharded_classifier;
    if (whole_trained) {
      // The sharded form's parameters of the names that train; the rest frozen as in `model`.
      std::set<std::string> names;
      for (const auto& [name, t] : *whole_trained) names.insert(name);
      for (auto& [name, t] : form.named_parameters()) {
        if (names.count(name)) {
          p.sharded_trained.emplace_back(name, t);
        } else {
          t.requires_grad_(false);
        }
      }
      trained_params_ = &p.sharded_trained;
      o.trained_params = trained_params_;
    }
    engine::train::move_to_device(form.named_parameters(), device_);
    wire_shards(*layout, form, *classifier_, o, whole_trained);
  }
  if (plan_.pp > 1) {
    // One-device stages; the model packs each micro-batch into the one tensor they receive.
    const models::ModelConfig& c = classifier_->config();
    build_pipeline(classifier_, spec.cost.default_seq_len(c), o);
    models::Model* m = classifier_.get();
    o.pipeline_pack = [m](const engine::Tensor& in, const engine::Tensor& tg) {
      return m->pipeline_batch(in, tg);
    };
    if (trained_params_) keep_trained_stage_params(o);
  }
  set_world_fields(o);
  if (plan_.dp > 1) {
    p.dp = std::make_unique<parallel::DataParallel>(
        p.pipeline        ? *o.optimizer_params
        : trained_params_ ? *trained_params_
                          : trained_classifier().named_parameters(),
        mesh_->group(parallel::Axis::kDp),
        parallel::DataParallelOptions{.zero_stage = plan_.zero, .bucket_mb = plan_.bucket_mb});
    p.dp->broadcast_parameters();
    o.dp = p.dp.get();
  }
  set_grad_norm(o);
}

models::Model& TrainingRuntime::trained_classifier() const {
  MAMMOTH_CHECK(classifier_ != nullptr) << "[runtime] trained_classifier() before assemble";
  if (parts_->sharded_classifier) return *parts_->sharded_classifier;
  return *classifier_;
}

TrainingRuntime::Memory TrainingRuntime::memory() const {
  const Parts& p = *parts_;
  const models::Model& model = model_ ? static_cast<const models::Model&>(*model_) : *classifier_;
  const int64_t elem = static_cast<int64_t>(dtype_size(model.config().dtype));
  if (p.offload) {
    const engine::offload::Offload::MemoryReport m = p.offload->memory();
    return {m.params, m.grads, m.optimizer,
            plan_.dp > 1 ? "offload: sharded by chunk over dp" : "offload " + plan_.offload};
  }
  const std::string how = "ZeRO stage " + std::to_string(plan_.zero);
  if (p.ep_dp) {
    const parallel::DataParallel::MemoryReport s = p.ep_dp->shared().memory();
    const parallel::DataParallel::MemoryReport e = p.ep_dp->experts().memory();
    return {s.params + e.params, s.grads + e.grads, s.optimizer + e.optimizer,
            how + ", ep " + std::to_string(plan_.ep) + ": this rank's experts only"};
  }
  if (p.dp) {
    const parallel::DataParallel::MemoryReport m = p.dp->memory();
    return {m.params, m.grads, m.optimizer, how};
  }
  int64_t n = 0;
  if (p.pipeline || trained_params_) {
    for (const auto& [name, t] :
         p.pipeline ? (p.stage_trained.empty() ? p.pipeline->parameters() : p.stage_trained)
                    : *trained_params_)
      n += t.numel();
  } else {
    n = trained_ ? trained_->num_parameters() : trained_classifier().num_parameters();
  }
  return {n * elem, n * elem, 2 * n * elem, how};
}

std::string TrainingRuntime::offload_report() const {
  return parts_->offload ? parts_->offload->report() : "";
}

}  // namespace mammoth::runtime
