// `mammoth analyze`: parameter count and FLOPs per token of a model, from its config alone
// (registered name or Hugging Face directory), so 70B shapes work on a laptop; and what the
// planner's models say about training it with the layout `mammoth train`'s flags (or --plan
// FILE) describe: memory per rank, stage and tier (plan/memory_model), what fits a device and
// host of the given sizes under each offload setting (plan/fit), and with --cluster the step
// time and where it goes (plan/time_model). analyze has no formulas of its own.
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/json.h"
#include "memory/chunks/chunk_manager.h"
#include "models/analyze.h"
#include "models/registry.h"
#include "plan/cluster.h"
#include "plan/fit.h"
#include "plan/memory_model.h"
#include "plan/offload_traffic.h"
#include "plan/parallel_plan.h"
#include "plan/time_model.h"
#include "tools/command.h"
#include "tools/plan_flags.h"

// Shared with `mammoth train` (defined in cmd_train.cc) and `mammoth plan` (cmd_plan.cc); the
// layout flags are read through tools/plan_flags.h.
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, plan);
ABSL_DECLARE_FLAG(std::string, cluster);
ABSL_FLAG(int64_t, context, 0, "analyze: context length for attention FLOPs (0: the model's max)");
ABSL_FLAG(bool, json, false, "analyze: print only the JSON line");

namespace mammoth::tools {
namespace {

std::string human(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P", "E"};
  int i = 0;
  while (v >= 1000 && i < 6) {
    v /= 1000;
    ++i;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3g %s%s", v, prefixes[i], unit);
  return buf;
}

std::string gib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buf;
}

// The plan analyze describes: --plan FILE, or train's layout flags for one process per rank of
// its own world (--dp 0: 1).
plan::ParallelPlan plan_from_flags() {
  MAMMOTH_CHECK(absl::GetFlag(FLAGS_plan) != "auto")
      << "[analyze] --plan auto searches for a world and a cluster: use `mammoth plan`, then "
         "`mammoth analyze --plan FILE`";
  return plan_from_layout_flags("analyze", 1);
}

void print_lines(const std::string& text, const char* indent) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) std::printf("%s%s\n", indent, line.c_str());
}

void print_fits(const std::vector<plan::OffloadFit>& fits, int64_t device_mem, bool device_auto,
                int64_t host_mem, const plan::ParallelPlan& base) {
  auto budget = [](int64_t b) { return b > 0 ? gib(b) : std::string("unlimited"); };
  std::printf("fit per rank (plan/memory_model; a device of %s%s, host %s, dp %d):\n",
              device_auto ? "auto:" : "", budget(device_mem).c_str(), budget(host_mem).c_str(),
              base.dp);
  std::printf("  %-11s %14s %14s %14s %5s   %s\n", "--offload", "device", "host", "nvme", "fits",
              "largest of this width");
  for (const plan::OffloadFit& f : fits) {
    if (!f.invalid.empty()) {
      std::printf("  %-11s not valid here: %s\n", f.setting.c_str(), f.invalid.c_str());
      continue;
    }
    const std::string largest = f.max_layers == 0 ? std::string("none (too few layers fit)")
                                                  : std::to_string(f.max_layers) + " layers, " +
                                                        human(double(f.max_params), "params");
    std::printf("  %-11s %14s %14s %14s %5s   %s\n", f.setting.c_str(), gib(f.device_bytes).c_str(),
                gib(f.host_bytes).c_str(), gib(f.nvme_bytes).c_str(), f.fits ? "yes" : "no",
                largest.c_str());
  }
  std::printf(
      "  (device: the allocator's peak, activations included, plus the chunks held there; "
      "host, nvme: AdamW states off the device; -paged: --device-mem auto:SIZE, every chunk "
      "homed off the device and cached in what the peak leaves)\n");
}

int run_analyze(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.empty()) << "[analyze] unexpected argument '" << args[0] << "'";
  const std::string name = absl::GetFlag(FLAGS_model);
  const int64_t context = absl::GetFlag(FLAGS_context);
  MAMMOTH_CHECK(context >= 0) << "[analyze] --context must be >= 0, got " << context;
  const models::ModelConfig config = models::resolve_config(name);
  const models::ModelAnalysis a = models::analyze(config, context);
  const bool text = !absl::GetFlag(FLAGS_json);
  if (text) {
    const models::ModelConfig& c = a.config;
    std::printf(
        "model        %s (%s): %lld layers, d_model %lld, %lld heads (%lld kv), d_ff %lld, "
        "vocab %lld\n",
        name.c_str(), models::family_name(c.family), (long long)c.n_layer, (long long)c.d_model,
        (long long)c.n_head, (long long)c.n_kv_head, (long long)c.d_ff, (long long)c.vocab_size);
    std::printf("parameters   %lld (%s; embeddings %s)\n", (long long)a.params,
                human(double(a.params), "").c_str(), human(double(a.embedding_params), "").c_str());
    if (c.moe_experts > 0)
      std::printf("experts      %lld per layer, top %lld: %lld active parameters per token (%s)\n",
                  (long long)c.moe_experts, (long long)c.moe_top_k, (long long)a.active_params,
                  human(double(a.active_params), "").c_str());
    std::printf("FLOPs/token  forward %s, forward+backward %s (context %lld)\n",
                human(a.flops_per_token_forward, "FLOP").c_str(),
                human(a.flops_per_token_train, "FLOP").c_str(), (long long)a.seq_len);
  }
  json::Value out = models::analysis_to_json(a);

  const plan::ParallelPlan p = plan_from_flags();
  out.set("plan", plan::plan_to_json(p));
  if (text)
    std::printf("plan         %s, %s dtype\n", plan::plan_summary(p).c_str(),
                dtype_name(config.dtype));
  const std::string invalid = plan::check(p, {.model = &config});
  if (!invalid.empty()) {
    // The rules train would refuse the plan with; the memory and time models assume they hold.
    out.set("plan_invalid", invalid);
    if (text) std::printf("  not valid, so not predicted: %s\n", invalid.c_str());
  } else {
    if (const int64_t ex = plan::expert_exchange_bytes_per_step(p, config); ex > 0) {
      out.set("expert_exchange_bytes_per_step", ex);
      if (text)
        std::printf(
            "experts      --ep %d: %s sent per rank per step in the token exchanges "
            "(all_to_all_v; even routing assumed)\n",
            p.ep, gib(ex).c_str());
    }
    const plan::MemoryPrediction m = plan::predict_memory(config, p);
    out.set("memory", m.to_json());
    if (text) {
      std::printf(
          "memory       per rank (plan/memory_model): device peak %s (%s without the "
          "runtime's model copy)\n",
          gib(m.device_peak()).c_str(), gib(m.planned_peak()).c_str());
      print_lines(m.explain(), "  ");
      // The table `mammoth train` prints at start-up, from the same function.
      for (size_t st = 0; st < m.stages.size(); ++st) {
        std::printf("placement    stage %zu, per rank:\n", st);
        print_lines(plan::placement_table(m.stages[st], p), "");
      }
    }
    // What the chunk manager will move per step, from its dry run (plan/offload_traffic.h):
    // what `train` prints at start-up and the time model charges.
    if (p.offloaded() && !p.zero3_shards_on_nvme()) {
      json::Value moves = json::Value::array();
      for (size_t st = 0; st < m.stages.size(); ++st) {
        if (m.stages[st].offload_tensors.empty()) continue;
        const plan::OffloadTraffic t = plan::simulate_offload(plan::offload_setup(m.stages[st], p));
        json::Value v = json::Value::object().set("stage", static_cast<int64_t>(st));
        if (!t.error.empty()) {
          v.set("error", t.error);
          if (text) std::printf("chunk moves  stage %zu: none (%s)\n", st, t.error.c_str());
        } else {
          const plan::OffloadPhase all = plan::add(t.compute, t.optimizer);
          v.set("chunks", t.chunks).set("chunk_bytes", t.chunk_bytes).set("spans", t.spans);
          v.set("device_in", all.device_in).set("device_out", all.device_out);
          v.set("nvme_read", all.nvme_read).set("nvme_write", all.nvme_write);
          if (text) {
            std::printf(
                "chunk moves  stage %zu, per rank per step (dry run of the chunk manager, %lld "
                "chunks of %s%s):\n  forward/backward %s\n  optimizer        %s\n",
                st, static_cast<long long>(t.chunks),
                memory::chunks::short_bytes(t.chunk_bytes).c_str(),
                t.spans ? ", larger parameters spanning chunks" : "",
                plan::describe(t.compute).c_str(), plan::describe(t.optimizer).c_str());
          }
        }
        moves.push_back(std::move(v));
      }
      out.set("chunk_moves", std::move(moves));
    }
    const std::string cluster_name = absl::GetFlag(FLAGS_cluster);
    if (!cluster_name.empty()) {
      const plan::Cluster cluster = plan::load_cluster(cluster_name);
      const plan::TimePrediction t = plan::predict_time(config, p, cluster);
      out.set("time", t.to_json().set("cluster", cluster.name));
      if (text) {
        std::printf("time         on %s (plan/time_model): ", cluster.name.c_str());
        const std::string e = t.explain();
        const size_t nl = e.find('\n');
        std::printf("%s\n", e.substr(0, nl).c_str());
        if (nl != std::string::npos) print_lines(e.substr(nl + 1), "");
      }
    }
  }

  // With a budget: what each offload setting needs of a device and host of these sizes, and
  // the deepest model of this width that fits. --device-mem SIZE and auto:SIZE both mean a
  // device of SIZE here.
  const bool device_auto = p.auto_device_mem > 0;
  const int64_t device_mem = device_auto ? p.auto_device_mem : p.device_mem;
  if (device_mem > 0 || p.host_mem > 0) {
    const std::vector<plan::OffloadFit> fits =
        plan::offload_fits(config, p, device_mem, p.host_mem);
    if (text) print_fits(fits, device_mem, device_auto, p.host_mem, p);
    json::Value fit = plan::offload_fits_to_json(fits, device_mem, p.host_mem);
    fit.set("dp", json::Value(static_cast<int64_t>(p.dp)));
    fit.set("device_auto", json::Value(device_auto));
    out.set("offload_fit", std::move(fit));
  }
  std::printf("%s\n", json::dump(out).c_str());
  return 0;
}

}  // namespace

MAMMOTH_COMMAND(analyze, "parameters, FLOPs per token, and the planner's memory and time of a plan",
                run_analyze);

}  // namespace mammoth::tools
