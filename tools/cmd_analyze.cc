// `mammoth analyze`: parameter count, FLOPs per token and training memory of a model, from its
// config alone (registered name or Hugging Face directory), so 70B shapes work on a laptop.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/json.h"
#include "memory/chunks/chunk_manager.h"
#include "models/analyze.h"
#include "models/registry.h"
#include "tools/command.h"

// Shared with `mammoth train` (defined in cmd_train.cc).
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, device_mem);
ABSL_DECLARE_FLAG(std::string, host_mem);
ABSL_DECLARE_FLAG(double, chunk_mb);
ABSL_DECLARE_FLAG(int, dp);
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

int run_analyze(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.empty()) << "[analyze] unexpected argument '" << args[0] << "'";
  const std::string name = absl::GetFlag(FLAGS_model);
  const int64_t context = absl::GetFlag(FLAGS_context);
  MAMMOTH_CHECK(context >= 0) << "[analyze] --context must be >= 0, got " << context;
  const models::ModelAnalysis a = models::analyze(models::resolve_config(name), context);
  if (!absl::GetFlag(FLAGS_json)) {
    const models::ModelConfig& c = a.config;
    std::printf(
        "model        %s (%s): %lld layers, d_model %lld, %lld heads (%lld kv), d_ff %lld, "
        "vocab %lld\n",
        name.c_str(), models::family_name(c.family), (long long)c.n_layer, (long long)c.d_model,
        (long long)c.n_head, (long long)c.n_kv_head, (long long)c.d_ff, (long long)c.vocab_size);
    std::printf("parameters   %lld (%s; embeddings %s)\n", (long long)a.params,
                human(double(a.params), "").c_str(), human(double(a.embedding_params), "").c_str());
    std::printf("FLOPs/token  forward %s, forward+backward %s (context %lld)\n",
                human(a.flops_per_token_forward, "FLOP").c_str(),
                human(a.flops_per_token_train, "FLOP").c_str(), (long long)a.seq_len);
    std::printf("memory (AdamW; 16-bit dtypes keep fp32 master weights with the optimizer):\n");
    std::printf("  %-6s %14s %14s %14s %14s\n", "dtype", "weights", "grads", "optimizer", "total");
    for (const models::MemoryEstimate& m : a.memory) {
      std::printf("  %-6s %14s %14s %14s %14s\n", dtype_name(m.dtype), gib(m.weights_bytes).c_str(),
                  gib(m.grads_bytes).c_str(), gib(m.optimizer_bytes).c_str(),
                  gib(m.total_bytes()).c_str());
    }
  }
  // With a budget: what fits under each --offload setting, and the deepest model of this
  // width that would.
  // `auto:SIZE` (as `mammoth train` takes it): the device's SIZE; what the first step's
  // activations take off it is only known when training runs, and is not counted here.
  const memory::chunks::DeviceMemSpec device_spec =
      memory::chunks::parse_device_mem(absl::GetFlag(FLAGS_device_mem));
  const bool device_auto = device_spec.auto_budget;
  const int64_t device_mem = device_spec.bytes;
  const int64_t host_mem = memory::chunks::parse_bytes(absl::GetFlag(FLAGS_host_mem), "--host-mem");
  // --dp 0 means "every rank mpirun started" to `mammoth train`; here, one process.
  const int dp = std::max(1, absl::GetFlag(FLAGS_dp));
  json::Value out = models::analysis_to_json(a);
  if (device_mem > 0 || host_mem > 0) {
    const auto chunk = static_cast<int64_t>(absl::GetFlag(FLAGS_chunk_mb) * 1048576.0);
    const std::vector<models::OffloadFit> fits =
        models::offload_fits(a.config, device_mem, host_mem, chunk, dp);
    if (!absl::GetFlag(FLAGS_json)) {
      auto budget = [](int64_t b) { return b > 0 ? gib(b) : std::string("unlimited"); };
      std::printf(
          "fit per rank (%s dtype; --device-mem %s%s, --host-mem %s, --dp %d; activations "
          "not counted):\n",
          dtype_name(a.config.dtype), device_auto ? "auto:" : "", budget(device_mem).c_str(),
          budget(host_mem).c_str(), dp);
      std::printf("  %-11s %14s %14s %14s %5s   %s\n", "--offload", "device", "host", "nvme",
                  "fits", "largest of this width");
      for (const models::OffloadFit& f : fits) {
        const std::string largest = f.max_layers == 0 ? std::string("none (one layer does not fit)")
                                                      : std::to_string(f.max_layers) + " layers, " +
                                                            human(double(f.max_params), "params");
        std::printf("  %-11s %14s %14s %14s %5s   %s\n", f.setting.c_str(),
                    gib(f.device_bytes).c_str(), gib(f.host_bytes).c_str(),
                    gib(f.nvme_bytes).c_str(), f.fits ? "yes" : "no", largest.c_str());
      }
      std::printf(
          "  (host, nvme: AdamW states off the device; -paged: parameters and gradients "
          "paged through --device-mem too%s)\n",
          dp > 1 ? "; dp: each rank holds the AdamW states of its own chunks" : "");
    }
    json::Value fit = models::offload_fits_to_json(fits, device_mem, host_mem);
    fit.set("dp", json::Value(static_cast<int64_t>(dp)));
    fit.set("device_auto", json::Value(device_auto));
    out.set("offload_fit", std::move(fit));
  }
  std::printf("%s\n", json::dump(out).c_str());
  return 0;
}

}  // namespace

MAMMOTH_COMMAND(analyze, "parameters, FLOPs per token and training memory of a model", run_analyze);

}  // namespace mammoth::tools
