// `mammoth analyze`: parameter count, FLOPs per token and training memory of a model, from its
// config alone (registered name or Hugging Face directory), so 70B shapes work on a laptop.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/json.h"
#include "models/analyze.h"
#include "models/registry.h"
#include "tools/command.h"

// Shared with `mammoth train` (defined in cmd_train.cc).
ABSL_DECLARE_FLAG(std::string, model);
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
  std::printf("%s\n", json::dump(models::analysis_to_json(a)).c_str());
  return 0;
}

}  // namespace

MAMMOTH_COMMAND(analyze, "parameters, FLOPs per token and training memory of a model", run_analyze);

}  // namespace mammoth::tools
