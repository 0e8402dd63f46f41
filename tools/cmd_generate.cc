// `mammoth generate`: continues a prompt with a KV-cached causal LM.
//   mammoth generate --model DIR --prompt "Once upon a time" --max-new-tokens 20 --top-k 40
//   mammoth generate --model DIR --prompt-tokens 464,2068 --max-new-tokens 20
// --prompt: the text is encoded by the model directory's tokenizer (or --tokenizer's) with its
// special tokens (a Llama's bos), the continuation is decoded and written to stdout as each
// token arrives (special tokens skipped; generation stops at the tokenizer's eos unless
// --eos-token says otherwise), then a newline; a JSON line {"prompt", "tokens", "text"} goes to
// stderr. --prompt-tokens: stdout gets that JSON line (ids only).
#include <cstdio>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/json.h"
#include "engine/data/tokenizer.h"
#include "memory/allocator.h"
#include "models/generate.h"
#include "models/layers.h"
#include "models/registry.h"
#include "tools/command.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, weights);
ABSL_DECLARE_FLAG(int64_t, seed);
ABSL_FLAG(std::string, prompt_tokens, "", "generate: prompt token ids, comma-separated");
ABSL_FLAG(std::string, prompt, "",
          "generate: prompt text, encoded by the model directory's tokenizer (or --tokenizer); "
          "the continuation is streamed to stdout as text");
ABSL_FLAG(int64_t, max_new_tokens, 32, "generate: tokens to produce");
ABSL_FLAG(double, temperature, 1.0, "generate: sampling temperature (0: greedy)");
ABSL_FLAG(int64_t, top_k, 0, "generate: sample among the k most likely tokens (0: all)");
ABSL_FLAG(double, top_p, 1.0, "generate: nucleus probability mass (1: off)");
ABSL_FLAG(int64_t, eos_token, -1,
          "generate: stop after this token (-1: the tokenizer's eos with --prompt, else never)");

namespace mammoth::tools {

std::shared_ptr<models::LanguageModel> load_language_model(const std::string& name,
                                                           const std::string& weights,
                                                           const char* command);
data::Tokenizer text_tokenizer(int64_t model_vocab, const char* command);

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

// Writes the decoded continuation as tokens arrive. Each step decodes prompt + continuation
// (decoders such as SentencePiece's strip or join across tokens, so a token's text depends on
// its neighbours) and writes what extends the text already written. Text that a later token may
// still change is held back: a trailing run of byte-fallback tokens (decoded as one unit, all
// U+FFFD if the run is not valid UTF-8) and a trailing U+FFFD (the start of a character whose
// remaining bytes may come in the next token).
class TextStream {
 public:
  TextStream(const data::Tokenizer& tok, const std::vector<int64_t>& prompt)
      : tok_(tok), ids_(prompt.begin(), prompt.end()), base_(tok.decode(ids_, true)) {}

  void add(int64_t id) {
    // A model's vocabulary may be padded past the tokenizer's (Qwen2's is): such ids have no
    // text.
    if (id >= tok_.vocab_size()) return;
    ids_.push_back(static_cast<int32_t>(id));
    emit(false);
  }
  // Writes the rest and returns the whole continuation.
  std::string finish() {
    emit(true);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    return text_;
  }

 private:
  void emit(bool last) {
    size_t stable = ids_.size();
    while (!last && stable > 0 && tok_.is_byte_fallback(ids_[stable - 1])) --stable;
    const std::string full =
        tok_.decode(std::vector<int32_t>(ids_.begin(), ids_.begin() + stable), true);
    if (full.compare(0, base_.size(), base_) != 0) return;  // the prompt's text changed
    const std::string text = full.substr(base_.size());
    if (last) text_ = text;
    size_t ready = text.size();
    static constexpr std::string_view kFffd = "\xEF\xBF\xBD";
    while (!last && ready >= kFffd.size() &&
           text.compare(ready - kFffd.size(), kFffd.size(), kFffd) == 0) {
      ready -= kFffd.size();
    }
    if (ready <= written_ || text.compare(0, written_, written_text_) != 0) return;
    std::fwrite(text.data() + written_, 1, ready - written_, stdout);
    std::fflush(stdout);
    written_ = ready;
    written_text_ = text.substr(0, ready);
  }

  const data::Tokenizer& tok_;
  std::vector<int32_t> ids_;
  const std::string base_;
  std::string text_, written_text_;
  size_t written_ = 0;
};

int run_generate(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.empty()) << "[generate] unexpected argument '" << args[0] << "'";
  const std::string text = absl::GetFlag(FLAGS_prompt);
  std::vector<int64_t> prompt = parse_ids(absl::GetFlag(FLAGS_prompt_tokens));
  MAMMOTH_CHECK(text.empty() || prompt.empty())
      << "[generate] give --prompt (text) or --prompt-tokens (ids), not both";
  MAMMOTH_CHECK(!text.empty() || !prompt.empty())
      << "[generate] --prompt \"text\" or --prompt-tokens 464,2068 is required";
  auto model =
      load_language_model(absl::GetFlag(FLAGS_model), absl::GetFlag(FLAGS_weights), "generate");
  std::optional<data::Tokenizer> tok;
  if (!text.empty()) {
    tok = text_tokenizer(model->config().vocab_size, "generate");
    for (int32_t id : tok->encode(text, /*add_special_tokens=*/true)) prompt.push_back(id);
    MAMMOTH_CHECK(!prompt.empty()) << "[generate] --prompt encodes to no tokens";
  }
  models::GenerateOptions o;
  o.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  o.temperature = absl::GetFlag(FLAGS_temperature);
  o.top_k = absl::GetFlag(FLAGS_top_k);
  o.top_p = absl::GetFlag(FLAGS_top_p);
  o.seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  o.eos_token = absl::GetFlag(FLAGS_eos_token);
  if (tok && o.eos_token < 0) o.eos_token = tok->eos_id();
  std::optional<TextStream> stream;
  if (tok) {
    stream.emplace(*tok, prompt);
    o.on_token = [&](int64_t id) { stream->add(id); };
  }
  const std::vector<int64_t> out = models::generate(*model, prompt, o);
  // Measured, not computed: what --dtype saves shows here.
  std::fprintf(
      stderr, "[generate] peak memory: %.2f MB (allocator)\n",
      static_cast<double>(memory::allocator_for(models::module_device(*model)).stats().peak_bytes) /
          1e6);
  json::Value p = json::Value::array(), g = json::Value::array();
  for (int64_t t : prompt) p.push_back(t);
  for (int64_t t : out) g.push_back(t);
  json::Value result = json::Value::object().set("prompt", p).set("tokens", g);
  if (stream) {
    result.set("text", stream->finish());
    std::fprintf(stderr, "%s\n", json::dump(result).c_str());
  } else {
    std::printf("%s\n", json::dump(result).c_str());
  }
  return 0;
}

}  // namespace

MAMMOTH_COMMAND(generate,
                "continue a prompt, text or token ids (KV cache; greedy/top-k/top-p; streamed)",
                run_generate);

}  // namespace mammoth::tools
