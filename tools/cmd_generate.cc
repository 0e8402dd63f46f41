// `mammoth generate`: continues a prompt of token ids with a KV-cached causal LM.
//   mammoth generate --model DIR --prompt-tokens 464,2068 --max-new-tokens 20 --top-k 40
// Prints the new token ids, comma-separated, and a JSON line with prompt and output.
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/json.h"
#include "models/generate.h"
#include "models/registry.h"
#include "tools/command.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, weights);
ABSL_DECLARE_FLAG(int64_t, seed);
ABSL_FLAG(std::string, prompt_tokens, "", "generate: prompt token ids, comma-separated");
ABSL_FLAG(int64_t, max_new_tokens, 32, "generate: tokens to produce");
ABSL_FLAG(double, temperature, 1.0, "generate: sampling temperature (0: greedy)");
ABSL_FLAG(int64_t, top_k, 0, "generate: sample among the k most likely tokens (0: all)");
ABSL_FLAG(double, top_p, 1.0, "generate: nucleus probability mass (1: off)");
ABSL_FLAG(int64_t, eos_token, -1, "generate: stop after this token (-1: never)");

namespace mammoth::tools {

std::shared_ptr<models::LanguageModel> load_language_model(const std::string& name,
                                                           const std::string& weights,
                                                           const char* command);

namespace {

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    MAMMOTH_CHECK(used == item.size() && v >= 0)
        << "[generate] --prompt-tokens: '" << item << "' is not a token id";
    ids.push_back(v);
  }
  return ids;
}

int run_generate(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.empty()) << "[generate] unexpected argument '" << args[0] << "'";
  const std::vector<int64_t> prompt = parse_ids(absl::GetFlag(FLAGS_prompt_tokens));
  MAMMOTH_CHECK(!prompt.empty()) << "[generate] --prompt-tokens is required, e.g. 464,2068";
  auto model =
      load_language_model(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_weights), "generate");
  models::GenerateOptions o;
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.temperature = absl::GetFlag(FLAGS_temperature);
  o.top_k = absl::GetFlag(FLAGS_top_k);
  o.top_p = absl::GetFlag(FLAGS_top_p);
  o.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  o.eos_token = absl::GetFlag(FLAGS_eos_token);
  const std::vector<int64_t> out = models::generate(*model, prompt, o);
  json::Value p = json::Value::array(), g = json::Value::array();
  for (int64_t t : prompt) p.push_back(t);
  for (int64_t t : out) g.push_back(t);
  std::printf("%s\n", json::dump(json::Value::object().set("prompt", p).set("tokens", g)).c_str());
  return 0;
}

}  // namespace

MAMMOTH_COMMAND(generate, "continue a prompt of token ids (KV cache; greedy/top-k/top-p)",
                run_generate);

}  // namespace mammoth::tools
