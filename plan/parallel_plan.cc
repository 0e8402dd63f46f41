#include "plan/parallel_plan.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>

#include "base/error.h"
#include "memory/chunks/chunk_manager.h"
#include "models/family.h"

namespace mammoth::plan {
namespace {

bool one_of(const std::string& v, const std::vector<std::string_view>& options) {
  return std::find(options.begin(), options.end(), v) != options.end();
}

// "a, b or c".
std::string join(const std::vector<std::string_view>& options) {
  std::string s;
  size_t i = 0;
  for (std::string_view o : options) {
    if (i > 0) s += i + 1 == options.size() ? " or " : ", ";
    s += o;
    ++i;
  }
  return s;
}

// Rules are written as `if (broken) return message;`, first broken rule wins; the messages name
// train's flags (the plan file's keys are the same words with '_').
class Checker {
 public:
  Checker(const ParallelPlan& p, const PlanContext& c) : p_(p), c_(c) {}

  std::string run() {
    if (const std::string e = fields(); !e.empty()) return e;
    if (const std::string e = mesh(); !e.empty()) return e;
    if (const std::string e = pipeline(); !e.empty()) return e;
    if (const std::string e = memory(); !e.empty()) return e;
    if (const std::string e = device(); !e.empty()) return e;
    if (const std::string e = experts(); !e.empty()) return e;
    if (const std::string e = adapters(); !e.empty()) return e;
    if (c_.model != nullptr) {
      if (const std::string e = model(*c_.model); !e.empty()) return e;
      if (const std::string e = experts(*c_.model); !e.empty()) return e;
      if (const std::string e = attention(*c_.model); !e.empty()) return e;
    }
    return "";
  }

 private:
  template <typename... T>
  static std::string say(const T&... parts) {
    std::ostringstream s;
    (s << ... << parts);
    return s.str();
  }

  // Each field on its own.
  std::string fields() const {
    if (p_.dp < 1 || p_.pp < 1 || p_.tp < 1 || p_.sp < 1) {
      return say("--dp, --pp, --tp and --sp must be >= 1, got ", p_.dp, ", ", p_.pp, ", ", p_.tp,
                 " and ", p_.sp);
    }
    static const std::vector<std::string_view> kSp = {"none", "split_gather", "ulysses", "ring"};
    if (!one_of(p_.sp_mode, kSp))
      return say("--sp-mode must be ", join(kSp), ", got '", p_.sp_mode, "'");
    static const std::vector<std::string_view> kSchedules = {"gpipe", "1f1b", "interleaved", "zb"};
    if (!one_of(p_.pp_schedule, kSchedules))
      return say("--pp-schedule must be ", join(kSchedules), ", got '", p_.pp_schedule, "'");
    if (!one_of(p_.pp_partition, {"balanced", "count"}))
      return say("--pp-partition must be balanced or count, got '", p_.pp_partition, "'");
    if (p_.virtual_stages < 1) return say("--virtual-stages must be >= 1, got ", p_.virtual_stages);
    if (p_.micro_batch < 1) return say("--micro-batch must be > 0, got ", p_.micro_batch);
    if (p_.grad_accum < 1) return say("--grad-accum must be > 0, got ", p_.grad_accum);
    if (p_.seq_len < 1) return say("--seq-len must be > 0, got ", p_.seq_len);
    if (p_.zero < 0 || p_.zero > 3) return say("--zero must be 0, 1, 2 or 3, got ", p_.zero);
    if (!(p_.bucket_mb > 0)) return say("--bucket-mb must be > 0, got ", p_.bucket_mb);
    static const std::vector<std::string_view> kOffload = {"none", "host", "nvme"};
    if (!one_of(p_.offload, kOffload))
      return say("--offload-optimizer (--offload) must be ", join(kOffload), ", got '", p_.offload,
                 "'");
    if (!one_of(p_.offload_params, kOffload))
      return say("--offload-params must be ", join(kOffload), ", got '", p_.offload_params, "'");
    if (p_.device_mem < 0 || p_.auto_device_mem < 0 || p_.host_mem < 0)
      return say("--device-mem and --host-mem must be >= 0");
    if (p_.device_mem > 0 && p_.auto_device_mem > 0)
      return say("--device-mem is either a size or auto:SIZE, not both");
    if (!(p_.chunk_mb > 0 && p_.chunk_mb <= 65536))
      return say("--chunk-mb must be in (0, 65536], got ", p_.chunk_mb);
    if (p_.recompute_blocks < -1)
      return say("recompute_blocks must be -1 (every block), 0 (none) or a block count, got ",
                 p_.recompute_blocks);
    static const std::vector<std::string_view> kAmp = {"fp32", "bf16", "fp16"};
    if (!one_of(p_.amp, kAmp)) return say("--amp must be ", join(kAmp), ", got '", p_.amp, "'");
    if (!one_of(p_.device, {"cpu", "cuda"}))
      return say("device must be cpu or cuda, got '", p_.device, "'");
    return "";
  }

  std::string mesh() const {
    // The order names each axis at most once; an axis it leaves out must have size 1
    // (parallel/mesh.h appends those, slowest).
    std::set<std::string> seen;
    std::string_view rest = p_.order;
    while (!rest.empty()) {
      const size_t dash = rest.find('-');
      const std::string axis(rest.substr(0, dash));
      if (!one_of(axis, {"dp", "pp", "tp", "sp"}))
        return say("mesh order '", p_.order, "': unknown axis '", axis, "' (dp, pp, tp, sp)");
      if (!seen.insert(axis).second)
        return say("mesh order '", p_.order, "' names ", axis, " twice");
      rest = dash == std::string_view::npos ? std::string_view() : rest.substr(dash + 1);
    }
    for (const auto& [axis, size] : {std::pair{"dp", p_.dp}, std::pair{"pp", p_.pp},
                                     std::pair{"tp", p_.tp}, std::pair{"sp", p_.sp}}) {
      if (size > 1 && seen.count(axis) == 0)
        return say("mesh order '", p_.order, "' leaves out ", axis, " of size ", size);
    }
    if (p_.sp > 1 && p_.sp_mode != "ulysses" && p_.sp_mode != "ring")
      return say("--sp ", p_.sp, " needs --sp-mode ulysses or ring (split_gather runs on tp)");
    if (c_.world > 0 && p_.world() != c_.world) {
      return say("--dp ", p_.dp, " x --pp ", p_.pp, " x --tp ", p_.tp, " x --sp ", p_.sp, " = ",
                 p_.world(), " but ", c_.world, " process(es) were started",
                 c_.world == 1 ? " (launch with: mpirun -np " + std::to_string(p_.world()) +
                                     " mammoth train ...)"
                               : "");
    }
    if (p_.sp_mode != "none" && p_.world() == 1)
      return say("--sp-mode ", p_.sp_mode, " splits the sequence over several ranks: it needs ",
                 p_.sp_mode == "split_gather" ? "--tp > 1" : "--sp > 1", " (mpirun -np N)");
    if (p_.zero > 0 && p_.dp == 1)
      return say("--zero ", p_.zero,
                 " shards over data-parallel ranks: it needs --dp > 1 (launch with mpirun -np N)");
    return "";
  }

  std::string pipeline() const {
    if (p_.virtual_stages > 1 && p_.pp_schedule != "interleaved")
      return say("--virtual-stages ", p_.virtual_stages, " needs --pp-schedule interleaved, not ",
                 p_.pp_schedule);
    if (p_.pp == 1 && p_.virtual_stages > 1)
      return say("--virtual-stages ", p_.virtual_stages, " needs --pp > 1");
    if (!p_.stage_cut.empty()) {
      const size_t stages = static_cast<size_t>(p_.pp) * static_cast<size_t>(p_.virtual_stages);
      if (p_.stage_cut.size() != stages + 1)
        return say("stage_cut has ", p_.stage_cut.size(), " boundaries; pp ", p_.pp,
                   " x virtual stages ", p_.virtual_stages, " needs ", stages + 1);
      if (p_.stage_cut.front() != 0) return say("stage_cut must start at layer 0");
      for (size_t i = 1; i < p_.stage_cut.size(); ++i) {
        if (p_.stage_cut[i] <= p_.stage_cut[i - 1])
          return say("stage_cut must increase strictly (stage ", i - 1, " is empty)");
      }
    }
    return "";
  }

  std::string memory() const {
    if (p_.offload == "nvme" && c_.run && p_.nvme_dir.empty())
      return say("--offload-optimizer nvme needs --nvme-dir");
    if (p_.offload_params == "nvme" && c_.run && p_.nvme_dir.empty())
      return say("--offload-params nvme needs --nvme-dir");
    if (p_.zero3_shards_on_nvme()) {
      // Each dp rank pages its own ZeRO-3 parameter shards; nothing else is chunked.
      if (p_.tp > 1 || p_.pp > 1 || p_.sp > 1 || p_.sp_mode != "none")
        return say("--zero 3 --offload-params nvme runs with --dp only so far, not with --tp ",
                   p_.tp, " / --pp ", p_.pp, " / --sp ", p_.sp);
      if (p_.offload != "none")
        return say("--zero 3 --offload-params nvme with --offload-optimizer ", p_.offload,
                   " is not built yet: ZeRO-3 keeps its AdamW states beside the shards");
      if (p_.auto_device_mem > 0)
        return say(
            "--zero 3 --offload-params nvme takes --device-mem SIZE (the shards' device "
            "cache), not auto:SIZE");
      return "";
    }
    if (p_.offloaded() && p_.world() > 1) {
      // What runs with offload across ranks (the layouts train_offload_tiers_test and
      // train_offload_dp_test prove bitwise); everything else is refused by name.
      const bool model_parallel = p_.tp > 1 || p_.pp > 1;
      if (p_.sp > 1 || p_.sp_mode != "none")
        return say(
            "--offload-optimizer/--offload-params/--device-mem/--host-mem do not combine "
            "with sequence parallelism yet, not with --sp ",
            p_.sp, " / --sp-mode ", p_.sp_mode);
      if (model_parallel && p_.dp > 1)
        return say("offload with --tp ", p_.tp, " / --pp ", p_.pp,
                   " runs without --dp so far (--dp ", p_.dp,
                   "); --dp alone with offload is ZeRO-Offload");
      if (model_parallel && (p_.device_mem > 0 || p_.auto_device_mem > 0))
        return say(
            "--device-mem with --tp / --pp: their collectives read gradient and parameter chunks "
            "in place, so the chunks must stay resident; leave --device-mem at 0 (states and "
            "parameters still go to --offload-optimizer / --offload-params)");
      if (p_.tp > 1 && p_.offload_params != "none")
        return say("--offload-params ", p_.offload_params,
                   " with --tp is not built yet; --offload-optimizer host|nvme runs with --tp");
      if (p_.pp > 1 && p_.offload_params == "nvme")
        return say(
            "--offload-params nvme with --pp is not built yet (the tied embedding's gradient is "
            "summed in place across stages); use --offload-params host");
      // Each dp rank would page every parameter chunk, not its ZeRO-3 shard: not built.
      if (p_.dp > 1 && p_.offload_params != "none")
        return say("--offload-params ", p_.offload_params,
                   " with --dp runs as --zero 3 --offload-params nvme only (each rank pages its "
                   "shards); --offload-optimizer combines with --dp");
      if (p_.zero != 0)
        return say(
            "--offload shards the AdamW states over dp by chunk itself (ZeRO-Offload); "
            "--zero ",
            p_.zero, " does not apply: leave it at 0");
    }
    return "";
  }

  std::string device() const {
    if (p_.device != "cuda") return "";
    if (p_.tp > 1 || p_.sp > 1 || p_.pp > 1 || p_.sp_mode != "none")
      return say("--device cuda: tensor/sequence/pipeline parallelism (--tp ", p_.tp, " --sp ",
                 p_.sp, " --pp ", p_.pp,
                 ") is not wired to NCCL yet; only data parallelism (--dp, ZeRO 0-1) runs on CUDA "
                 "(--device cpu runs them over MPI)");
    if (p_.dp > 1 && p_.zero > 1)
      return say("--device cuda with --dp: ZeRO ", p_.zero,
                 " is not enabled on CUDA yet (--zero 0 or 1)");
    if (p_.auto_device_mem > 0)
      return say("--device-mem auto is not implemented on CUDA yet: give a size (--device-mem 8G)");
    if (p_.offload_params == "nvme")
      return say(
          "--offload-params nvme with --device cuda: CUDA parameters page through pinned host "
          "memory only; use --offload-params host");
    if (p_.offloaded() && p_.dp > 1)
      return say(
          "--device cuda: --offload/--device-mem/--host-mem with --dp (chunks reduced "
          "over dp) is not implemented on CUDA yet; one process offloads on CUDA");
    return "";
  }

  // Expert parallelism (--ep): groups of dp ranks; the layouts it has been checked under.
  // Ulysses and ring attention compute no attention dropout (models::Layers::attention).
  std::string attention(const models::ModelConfig& m) const {
    if ((p_.sp_mode == "ulysses" || p_.sp_mode == "ring") && m.attn_dropout > 0)
      return say("--sp-mode ", p_.sp_mode, " has no attention dropout, but ", m.name,
                 " has attention dropout ", m.attn_dropout,
                 " (--dropout sets it); use --dropout 0 or --sp-mode split_gather");
    return "";
  }

  std::string experts() const {
    if (p_.ep < 1) return say("--ep must be >= 1, got ", p_.ep);
    if (p_.ep == 1) return "";
    if (p_.dp % p_.ep != 0)
      return say("--ep ", p_.ep, " must divide --dp ", p_.dp,
                 " (expert parallelism splits the data-parallel ranks into groups of ep)");
    // Under --tp every tp coordinate has its own expert groups of dp ranks (the experts are
    // replicated over tp), and under --pp each stage's; the sequence split is refused for
    // mixtral.
    if (p_.sp > 1 || p_.sp_mode != "none")
      return say("--ep ", p_.ep, " does not combine with --sp or --sp-mode (got --sp ", p_.sp,
                 " --sp-mode ", p_.sp_mode, "); use --dp with --ep, and --tp or --pp if needed");
    if (p_.offloaded())
      return say("--ep ", p_.ep, " does not combine with --offload/--device-mem/--host-mem");
    if (p_.device != "cpu")
      return say("--ep ", p_.ep, " runs on the CPU (MPI) only so far, not --device ", p_.device);
    return "";
  }

  // LoRA: its optimizer states are small, and the expert exchange moves whole experts.
  std::string adapters() const {
    if (!c_.adapters) return "";
    if (p_.offloaded())
      return say(
          "LoRA with --offload/--device-mem/--host-mem is not supported (its optimizer "
          "states are small)");
    if (p_.ep > 1) return say("--ep ", p_.ep, " does not combine with LoRA adapters");
    return "";
  }

  std::string experts(const models::ModelConfig& m) const {
    if (p_.ep == 1) return "";
    if (!models::family_spec(m.family).experts)
      return say("--ep ", p_.ep, " needs a mixture-of-experts model (family mixtral); ", m.name,
                 " is ", models::family_name(m.family));
    if (m.moe_experts % p_.ep != 0)
      return say("--ep ", p_.ep, " must divide ", m.name, "'s ", m.moe_experts,
                 " experts (num_local_experts)");
    return "";
  }

  // A classifier's forms (FamilySpec::classifier_*): the policies' tp/sp form (every sp mode);
  // pipeline stages only of the one-device classifier; no chunked memory.
  std::string classifier(const models::FamilySpec& spec) const {
    const std::string family = spec.name;
    if (!spec.classifier) return say("model family ", family, " has no classification head");
    const bool sharded = p_.tp * p_.sp > 1 || p_.sp_mode != "none";
    if (sharded && !spec.classifier_sharded)
      return say("classification (", family,
                 ") with tensor or sequence parallelism (--tp, --sp, --sp-mode) is not "
                 "supported; use --dp");
    if (p_.pp > 1 && !spec.classifier_pipeline)
      return say("classification (", family, ") with --pp is not supported; use --dp");
    if (p_.pp > 1 && sharded)
      return say(spec.title,
                 " classification with --pp and --tp / --sp: its sharded form has no pipeline "
                 "stages yet; use --pp with --dp");
    if (p_.offloaded())
      return say("classification (", family,
                 ") with --offload / --device-mem / --host-mem is not supported");
    if (p_.recompute_blocks != 0 && !spec.classifier_recompute)
      return say("--recompute-blocks / --activation-checkpointing: ", family,
                 " does not recompute its blocks");
    return "";
  }

  std::string model(const models::ModelConfig& m) const {
    const models::FamilySpec& spec = models::family_spec(m.family);
    const std::string family = spec.name;
    if (c_.task == Task::kClassifier) {
      if (const std::string e = classifier(spec); !e.empty()) return e;
    } else if (spec.objective == models::Objective::kImageClassifier) {
      return say("model family ", family, " has no language-model objective for `mammoth train`");
    }
    if (spec.router_losses) {
      // Tensor parallelism splits the attention and keeps the experts whole (models/mixtral);
      // the experts have no sequence-split, staged, chunked or recomputed form.
      if (p_.sp > 1 || p_.sp_mode != "none")
        return say("model family ", family,
                   " (mixture of experts) does not run under sequence parallelism (--sp ", p_.sp,
                   ", --sp-mode ", p_.sp_mode,
                   "): the router losses average over every token of a sequence; use --tp "
                   "without --sp-mode");
      // Its stages (one-device and tensor-parallel) carry the router sums with the hidden
      // states, in their f32 / f64.
      if (p_.pp > 1 && p_.amp != "fp32")
        return say("--pp with --amp ", p_.amp, ": ", spec.title,
                   "'s stages carry the router sums with the hidden states, in f32 or f64 only");
      if (p_.offloaded())
        return say("model family ", family,
                   " does not run under offload yet; use --zero 0-3 without "
                   "--offload/--device-mem/--host-mem/--offload-params");
      if (p_.recompute_blocks != 0)
        return say("model family ", family,
                   " does not support activation checkpointing (--recompute-blocks) yet: the "
                   "recomputed router would lose the router losses' graph");
    }
    const bool next_token = spec.pipeline == models::PipelineForm::kNextToken;
    if (p_.pp > 1) {
      // A classifier's stages are FamilySpec::classifier_pipeline's (classifier() above).
      if (spec.pipeline == models::PipelineForm::kNone && c_.task != Task::kClassifier)
        return say("--pp: model family ", family, " has no pipeline stages; use --pp 1");
      if (spec.pipeline == models::PipelineForm::kOneDeviceOnly &&
          (p_.tp > 1 || p_.sp > 1 || p_.sp_mode != "none"))
        return say("--pp with --tp / --sp: ", spec.title,
                   "'s tensor-parallel form has no pipeline stages yet (its one-device blocks "
                   "have); use --pp with --dp");
      const int64_t stages = static_cast<int64_t>(p_.pp) * p_.virtual_stages;
      if (m.n_layer < stages)
        return say("--pp ", p_.pp, " x --virtual-stages ", p_.virtual_stages, " = ", stages,
                   " stages but ", m.name, " has ", m.n_layer, " layers");
      if (!p_.stage_cut.empty() && p_.stage_cut.back() != m.n_layer)
        return say("stage_cut must end at the model's ", m.n_layer, " layers, not ",
                   p_.stage_cut.back());
    }
    if (p_.recompute_blocks > m.n_layer)
      return say("recompute_blocks ", p_.recompute_blocks, " exceeds the model's ", m.n_layer,
                 " blocks");
    // A decoder's pipeline stage carries each window as one row of seq_len + 1 tokens; a split
    // sequence is padded to a multiple of its parts (twice as many chunks for ring's zigzag).
    int64_t positions = p_.seq_len + (p_.pp > 1 && next_token ? 1 : 0);
    const int parts = p_.sp_mode == "split_gather"                        ? p_.tp
                      : (p_.sp_mode == "ulysses" || p_.sp_mode == "ring") ? p_.sp
                                                                          : 1;
    const int64_t chunks = p_.sp_mode == "ring" ? 2 * parts : parts;
    positions = (positions + chunks - 1) / chunks * chunks;
    if (spec.token_vocabulary && positions > m.max_seq)
      return say("--seq-len ", p_.seq_len, (p_.pp > 1 ? " (+1 with --pp)" : ""),
                 (chunks > 1 ? " padded to a multiple of " + std::to_string(chunks) : ""), " = ",
                 positions, " exceeds the model's ", m.max_seq, " positions");
    if (p_.tp > 1) {
      if (m.n_head % p_.tp != 0)
        return say("--tp ", p_.tp, " does not divide ", m.name, "'s ", m.n_head,
                   " attention heads");
      // Experts are whole on every tp rank (models/mixtral): their width is not split.
      if (m.d_ff % p_.tp != 0 && !spec.experts)
        return say("--tp ", p_.tp, " does not divide ", m.name, "'s MLP width ", m.d_ff);
      if (m.n_kv_head % p_.tp != 0 && p_.tp % m.n_kv_head != 0)
        return say("--tp ", p_.tp, ": ", m.name, "'s ", m.n_kv_head,
                   " key/value heads neither divide by it nor divide it (replicated heads)");
      if (spec.tp_needs_tied_head && !m.tie_embeddings)
        return say("--tp ", p_.tp, ": ", spec.title,
                   " with an untied LM head has no tensor-parallel form yet (its policy shards "
                   "the tied embedding as the head)");
    }
    if (p_.sp_mode == "ulysses" && (m.n_head / p_.tp) % p_.sp != 0)
      return say("--sp-mode ulysses: ", m.n_head / p_.tp,
                 " attention heads per tp rank do not "
                 "divide by --sp ",
                 p_.sp);
    return "";
  }

  const ParallelPlan& p_;
  const PlanContext& c_;
};

}  // namespace

std::string check(const ParallelPlan& plan, const PlanContext& context) {
  return Checker(plan, context).run();
}

void validate(const ParallelPlan& plan, const PlanContext& context) {
  const std::string e = check(plan, context);
  MAMMOTH_CHECK(e.empty()) << "[plan] " << e;
}

json::Value plan_to_json(const ParallelPlan& p) {
  json::Value v = json::Value::object();
  v.set("dp", p.dp).set("pp", p.pp).set("tp", p.tp).set("sp", p.sp);
  v.set("order", p.order).set("sp_mode", p.sp_mode);
  v.set("pp_schedule", p.pp_schedule).set("virtual_stages", p.virtual_stages);
  v.set("pp_partition", p.pp_partition);
  json::Value cut = json::Value::array();
  for (int64_t c : p.stage_cut) cut.push_back(c);
  v.set("stage_cut", std::move(cut));
  v.set("micro_batch", p.micro_batch).set("grad_accum", p.grad_accum).set("seq_len", p.seq_len);
  v.set("zero", p.zero).set("bucket_mb", p.bucket_mb);
  v.set("ep", p.ep);
  v.set("offload_optimizer", p.offload).set("offload_params", p.offload_params);
  v.set("device_mem", p.device_mem);
  v.set("auto_device_mem", p.auto_device_mem).set("host_mem", p.host_mem);
  v.set("chunk_mb", p.chunk_mb).set("nvme_dir", p.nvme_dir);
  v.set("recompute_blocks", p.recompute_blocks);
  v.set("amp", p.amp).set("device", p.device);
  return v;
}

ParallelPlan plan_from_json(const json::Value& v) {
  MAMMOTH_CHECK(v.is_object()) << "[plan] a plan is a JSON object, got "
                               << json::type_name(v.type());
  ParallelPlan p;
  for (const json::Value& m : v) {
    const std::string& k = m.key();
    // Plan fields of type int: a value outside int's range is refused, not wrapped.
    auto as_i = [&] {
      const int64_t v = m.as_int();
      MAMMOTH_CHECK(v >= INT32_MIN && v <= INT32_MAX)
          << "[plan] " << k << " = " << v << " is out of range";
      return static_cast<int>(v);
    };
    if (k == "dp")
      p.dp = as_i();
    else if (k == "pp")
      p.pp = as_i();
    else if (k == "tp")
      p.tp = as_i();
    else if (k == "sp")
      p.sp = as_i();
    else if (k == "order")
      p.order = m.as_string();
    else if (k == "sp_mode")
      p.sp_mode = m.as_string();
    else if (k == "pp_schedule")
      p.pp_schedule = m.as_string();
    else if (k == "virtual_stages")
      p.virtual_stages = as_i();
    else if (k == "pp_partition")
      p.pp_partition = m.as_string();
    else if (k == "stage_cut") {
      MAMMOTH_CHECK(m.is_array()) << "[plan] stage_cut must be an array of layer indices";
      p.stage_cut.clear();
      for (const json::Value& c : m) p.stage_cut.push_back(c.as_int());
    } else if (k == "micro_batch")
      p.micro_batch = m.as_int();
    else if (k == "grad_accum")
      p.grad_accum = m.as_int();
    else if (k == "seq_len")
      p.seq_len = m.as_int();
    else if (k == "zero")
      p.zero = as_i();
    else if (k == "bucket_mb")
      p.bucket_mb = m.as_double();
    else if (k == "ep")
      p.ep = as_i();
    else if (k == "offload_optimizer" || k == "offload") {
      // "offload" is the older name of offload_optimizer (plan files written before it).
      MAMMOTH_CHECK(!(v.contains("offload") && v.contains("offload_optimizer")))
          << "[plan] give offload_optimizer or its older name offload, not both";
      p.offload = m.as_string();
    } else if (k == "offload_params")
      p.offload_params = m.as_string();
    else if (k == "device_mem")
      p.device_mem = m.as_int();
    else if (k == "auto_device_mem")
      p.auto_device_mem = m.as_int();
    else if (k == "host_mem")
      p.host_mem = m.as_int();
    else if (k == "chunk_mb")
      p.chunk_mb = m.as_double();
    else if (k == "nvme_dir")
      p.nvme_dir = m.as_string();
    else if (k == "recompute_blocks")
      p.recompute_blocks = m.as_int();
    else if (k == "amp")
      p.amp = m.as_string();
    else if (k == "device")
      p.device = m.as_string();
    else
      MAMMOTH_THROW()
          << "[plan] unknown key '" << k << "' (the keys are those of plan_to_json: "
          << "dp, pp, tp, sp, order, sp_mode, pp_schedule, virtual_stages, "
             "pp_partition, stage_cut, micro_batch, grad_accum, seq_len, zero, "
             "bucket_mb, ep, offload_optimizer (or offload), offload_params, device_mem, "
             "auto_device_mem, host_mem, chunk_mb, "
             "nvme_dir, recompute_blocks, amp, device)";
  }
  return p;
}

ParallelPlan load_plan(const std::string& path) {
  const json::Value v = json::parse_file(path);
  // "plan" may wrap it (the files `mammoth plan --json` writes carry predictions beside it).
  if (v.is_object() && v.contains("plan")) return plan_from_json(v.at("plan"));
  return plan_from_json(v);
}

void save_plan(const ParallelPlan& plan, const std::string& path) {
  std::ofstream out(path);
  out << json::dump(plan_to_json(plan), 2) << "\n";
  out.close();
  MAMMOTH_CHECK(out.good()) << "[plan] cannot write " << path;
}

int64_t expert_exchange_bytes_per_step(const ParallelPlan& p, const models::ModelConfig& m) {
  if (p.ep <= 1 || m.moe_experts == 0) return 0;
  const int64_t rows = p.micro_batch * p.seq_len * m.moe_top_k;
  const int64_t bytes =
      rows * (p.ep - 1) / p.ep * m.d_model * static_cast<int64_t>(dtype_size(m.dtype));
  return 4 * bytes * m.n_layer * p.grad_accum;
}

int64_t local_experts(const ParallelPlan& p, const models::ModelConfig& m) {
  return p.ep > 1 ? m.moe_experts / p.ep : m.moe_experts;
}

int zero3_resident_buckets(const ParallelPlan& p, const models::ModelConfig& m) {
  return static_cast<int>(std::max<int64_t>(kZero3ResidentBuckets, local_experts(p, m)));
}

std::string plan_summary(const ParallelPlan& p) {
  std::ostringstream s;
  s << "dp" << p.dp << " pp" << p.pp << " tp" << p.tp << " sp" << p.sp << " (" << p.order << ")";
  if (p.ep > 1) s << " ep" << p.ep;
  if (p.sp_mode != "none") s << " sp-mode " << p.sp_mode;
  if (p.pp > 1) {
    s << " " << p.pp_schedule;
    if (p.virtual_stages > 1) s << " v" << p.virtual_stages;
  }
  s << " mb" << p.micro_batch << "x" << p.grad_accum << " seq " << p.seq_len << " zero" << p.zero
    << " offload " << p.offload;
  if (p.offload_params != "none") s << " params-on " << p.offload_params;
  if (p.device_mem > 0 || p.auto_device_mem > 0) {
    s << " device-mem " << (p.auto_device_mem > 0 ? "auto:" : "")
      << memory::chunks::short_bytes(p.device_mem > 0 ? p.device_mem : p.auto_device_mem)
      << " chunk " << memory::chunks::short_bytes(static_cast<int64_t>(p.chunk_mb * 1048576.0));
  }
  if (p.recompute_blocks != 0)
    s << " recompute "
      << (p.recompute_blocks < 0 ? std::string("all") : std::to_string(p.recompute_blocks));
  s << " " << p.amp;
  if (p.device != "cpu") s << " " << p.device;
  return s.str();
}

}  // namespace mammoth::plan
