// `mammoth eval`: mean next-token cross-entropy of a causal LM over an llm.c token file.
//
// The tokens are cut into consecutive, non-overlapping sequences of --seq-len T (a trailing
// remainder is dropped); in each, tokens 2..T are predicted from those before them, and the
// loss is averaged over all n_seq * (T - 1) predictions. Prints one JSON line
// {"loss": L, "tokens": N} where N is that number of predictions.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/json.h"
#include "engine/autograd.h"
#include "engine/data/token_shard.h"
#include "engine/ops.h"
#include "models/registry.h"
#include "models/weights.h"
#include "tools/command.h"

// Shared with `mammoth train` (defined in cmd_train.cc), so --seq-len defaults to train's.
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(int64_t, seq_len);
ABSL_FLAG(std::string, weights, "",
          "eval/generate: safetensors file with Hugging Face names (default: the model "
          "directory's model.safetensors, or fresh weights for a registered name)");
ABSL_FLAG(std::string, tokens, "", "eval: llm.c token shard(s): file, directory or glob");
ABSL_FLAG(int64_t, batch, 8, "eval: sequences per forward pass");
ABSL_FLAG(int64_t, max_sequences, 0, "eval: evaluate at most this many sequences (0: all)");

namespace mammoth::tools {

// Shared by eval and generate: the model named by --model with --weights loaded.
std::shared_ptr<models::LanguageModel> load_language_model(const std::string& name,
                                                           const std::string& weights) {
  models::ModelOptions options;
  options.load_weights = weights.empty();
  auto m = models::create_language_model(name, options);
  if (!weights.empty()) models::load_weights(*m, weights);
  m->eval();
  return m;
}

namespace {

int run_eval(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.empty()) << "[eval] unexpected argument '" << args[0] << "'";
  const std::string tokens = absl::GetFlag(FLAGS_tokens);
  MAMMOTH_CHECK(!tokens.empty()) << "[eval] --tokens is required (llm.c token shard)";
  auto model = load_language_model(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_weights));
  const models::ModelConfig& c = model->config();
  MAMMOTH_CHECK(model->supports_kv_cache())
      << "[eval] --model must be a causal LM (gpt2, llama); " << models::family_name(c.family)
      << " task evaluation is not available here";
  const int64_t T = absl::GetFlag(FLAGS_seq_len);
  MAMMOTH_CHECK(T >= 2 && T <= c.max_seq)
      << "[eval] --seq-len must be in [2, max_seq = " << c.max_seq << "], got " << T;
  const int64_t B = absl::GetFlag(FLAGS_batch);
  MAMMOTH_CHECK(B > 0) << "[eval] --batch must be positive, got " << B;

  const data::TokenDataset data = data::TokenDataset::open(tokens);
  int64_t n_seq = data.size() / T;
  if (absl::GetFlag(FLAGS_max_sequences) > 0)
    n_seq = std::min(n_seq, absl::GetFlag(FLAGS_max_sequences));
  MAMMOTH_CHECK(n_seq > 0) << "[eval] " << tokens << " holds " << data.size()
                           << " tokens, fewer than one sequence of " << T;
  engine::NoGradGuard ng;
  double total = 0;
  std::vector<int32_t> buf;
  for (int64_t s = 0; s < n_seq; s += B) {
    const int64_t b = std::min(B, n_seq - s);
    buf.resize(static_cast<size_t>(b * T));
    data.read(s * T, b * T, buf.data());
    std::vector<int64_t> ids(buf.begin(), buf.end());
    for (size_t i = 0; i < ids.size(); ++i) {
      MAMMOTH_CHECK(ids[i] < c.vocab_size)
          << "[eval] token " << ids[i] << " at position " << s * T + int64_t(i)
          << " is outside the model's vocabulary of " << c.vocab_size;
    }
    const double loss = model->loss(engine::Tensor::from_ints(ids, {b, T})).item();
    total += loss * static_cast<double>(b * (T - 1));
  }
  const int64_t predictions = n_seq * (T - 1);
  json::Value out = json::Value::object();
  out.set("loss", total / static_cast<double>(predictions)).set("tokens", predictions);
  std::printf("%s\n", json::dump(out).c_str());
  return 0;
}

}  // namespace

MAMMOTH_COMMAND(eval, "mean next-token cross-entropy of a model on a token file", run_eval);

}  // namespace mammoth::tools
