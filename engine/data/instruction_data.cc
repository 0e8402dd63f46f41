#include "engine/data/instruction_data.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "base/error.h"
#include "base/json.h"

namespace mammoth::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "mammoth-instructions-v1";

const std::string& string_field(const json::Value& v, const char* key, const std::string& where) {
  const json::Value* f = v.find(key);
  MAMMOTH_CHECK(f != nullptr && f->is_string()) << where << ": \"" << key << "\" must be a string";
  return f->as_string();
}

InstructionExample parse_example(const json::Value& v, const std::string& where) {
  MAMMOTH_CHECK(v.is_object()) << where << ": an example must be a JSON object";
  InstructionExample ex;
  if (v.find("messages") != nullptr) {
    for (const json::Value& m : v) {
      MAMMOTH_CHECK(m.key() == "messages")
          << where << ": key '" << m.key() << "' is not supported beside \"messages\"";
    }
    const json::Value& ms = v.at("messages");
    MAMMOTH_CHECK(ms.is_array() && !ms.empty())
        << where << ": \"messages\" must be a non-empty list";
    bool has_assistant = false;
    for (const json::Value& m : ms) {
      MAMMOTH_CHECK(m.is_object()) << where << ": each message must be an object";
      for (const json::Value& f : m) {
        MAMMOTH_CHECK(f.key() == "role" || f.key() == "content")
            << where << ": message key '" << f.key()
            << "' is not supported (role and content only; tool calls are not rendered)";
      }
      ChatMessage msg{string_field(m, "role", where), string_field(m, "content", where)};
      MAMMOTH_CHECK(msg.role == "system" || msg.role == "user" || msg.role == "assistant")
          << where << ": role '" << msg.role << "' is not supported (system, user, assistant)";
      has_assistant = has_assistant || msg.role == "assistant";
      ex.messages.push_back(std::move(msg));
    }
    MAMMOTH_CHECK(has_assistant) << where << ": no assistant message, so nothing to learn";
    return ex;
  }
  for (const json::Value& f : v) {
    MAMMOTH_CHECK(f.key() == "prompt" || f.key() == "response")
        << where << ": key '" << f.key()
        << "' is not supported (an example is {\"messages\": [...]} or {\"prompt\", \"response\"})";
  }
  ex.messages = {{"user", string_field(v, "prompt", where)},
                 {"assistant", string_field(v, "response", where)}};
  ex.prompt_response = true;
  return ex;
}

void append(TokenizedExample& out, const std::vector<int32_t>& ids, TokenPart part) {
  out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
  out.parts.insert(out.parts.end(), ids.size(), part);
}

}  // namespace

std::vector<InstructionExample> read_instruction_jsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MAMMOTH_CHECK(in) << "[instructions] cannot read " << path;
  std::vector<InstructionExample> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    const std::string where = "[instructions] " + path + ":" + std::to_string(n);
    out.push_back(parse_example(json::parse(line, where), where));
  }
  MAMMOTH_CHECK(!out.empty()) << "[instructions] " << path << " has no examples";
  return out;
}

TokenizedExample tokenize_example(const InstructionExample& ex, const Tokenizer& tok,
                                  const ChatTemplate* chat) {
  TokenizedExample out;
  if (chat == nullptr) {
    MAMMOTH_CHECK(ex.prompt_response)
        << "[instructions] {\"messages\": ...} examples need the model directory's chat template "
           "(tokenizer_config.json's chat_template), and it has none";
    MAMMOTH_CHECK(tok.eos_id() >= 0)
        << "[instructions] prompt/response without a chat template end the response with eos, "
           "and the tokenizer has none";
    append(out, tok.encode(ex.messages[0].content), TokenPart::kPrompt);
    std::vector<int32_t> response = tok.encode(ex.messages[1].content);
    response.push_back(tok.eos_id());
    append(out, response, TokenPart::kResponse);
    return out;
  }
  // The rendered text covered so far; each rendering must extend it.
  std::string covered;
  auto extend = [&](const std::string& text, TokenPart part, const char* what) {
    MAMMOTH_CHECK(text.compare(0, covered.size(), covered) == 0)
        << "[instructions] the chat template does not render this conversation incrementally ("
        << what << " does not start with the rendering before it), so its response tokens "
        << "cannot be told apart";
    append(out, tok.encode(std::string_view(text).substr(covered.size())), part);
    covered = text;
  };
  for (size_t i = 0; i < ex.messages.size(); ++i) {
    if (ex.messages[i].role != "assistant") continue;
    const std::vector<ChatMessage> before(ex.messages.begin(), ex.messages.begin() + i);
    const std::vector<ChatMessage> with(ex.messages.begin(), ex.messages.begin() + i + 1);
    extend(chat->render(before, true), TokenPart::kPrompt, "the generation prompt");
    extend(chat->render(with, false), TokenPart::kResponse, "the assistant turn");
  }
  extend(chat->render(ex.messages, false), TokenPart::kPrompt, "the whole conversation");
  return out;
}

InstructionDataResult build_instruction_data(const InstructionDataOptions& o, const Tokenizer& tok,
                                             const ChatTemplate* chat) {
  MAMMOTH_CHECK(o.seq_len >= 2) << "[instructions] seq_len must be at least 2, got " << o.seq_len;
  MAMMOTH_CHECK(!o.jsonl_files.empty()) << "[instructions] no JSONL files";
  const int32_t pad = tok.eos_id() >= 0 ? tok.eos_id() : 0;
  const size_t T = static_cast<size_t>(o.seq_len);
  InstructionDataResult r;
  std::vector<int32_t> tokens, parts;
  auto pad_to_bin = [&] {
    while (tokens.size() % T != 0) {
      tokens.push_back(pad);
      parts.push_back(static_cast<int32_t>(TokenPart::kPadding));
    }
  };
  for (const std::string& file : o.jsonl_files) {
    for (const InstructionExample& ex : read_instruction_jsonl(file)) {
      ++r.examples;
      TokenizedExample t = tokenize_example(ex, tok, chat);
      if (t.tokens.size() > T) {
        ++r.truncated;
        t.tokens.resize(T);
        t.parts.resize(T);
      }
      // A response token at position 0 has nothing before it to be predicted from.
      bool learnable = false;
      for (size_t k = 1; k < t.parts.size(); ++k) learnable |= t.parts[k] == TokenPart::kResponse;
      if (!learnable) {
        ++r.dropped;
        continue;
      }
      if (tokens.size() % T + t.tokens.size() > T) pad_to_bin();
      tokens.insert(tokens.end(), t.tokens.begin(), t.tokens.end());
      for (TokenPart p : t.parts) {
        parts.push_back(static_cast<int32_t>(p));
        r.response_tokens += p == TokenPart::kResponse;
      }
    }
  }
  MAMMOTH_CHECK(r.examples > r.dropped)
      << "[instructions] all " << r.examples << " examples were dropped: no response token fits "
      << "in seq_len " << o.seq_len;
  pad_to_bin();
  r.bins = static_cast<int64_t>(tokens.size() / T);
  r.tokens = static_cast<int64_t>(tokens.size());
  // The last bin's last target.
  tokens.push_back(pad);
  parts.push_back(static_cast<int32_t>(TokenPart::kPadding));

  fs::create_directories(o.out_dir);
  r.tokens_path = (fs::path(o.out_dir) / "train_000000.bin").string();
  r.loss_mask_path = (fs::path(o.out_dir) / "train_000000.loss_mask").string();
  write_token_shard(r.tokens_path, tokens, tok.vocab_size() > 65536);
  write_token_shard(r.loss_mask_path, parts);
  json::Value meta = json::Value::object();
  meta.set("format", kFormat)
      .set("seq_len", o.seq_len)
      .set("tokens", "train_000000.bin")
      .set("loss_mask", "train_000000.loss_mask")
      .set("loss_mask_values", "0 padding, 1 prompt, 2 response")
      .set("examples", r.examples)
      .set("dropped", r.dropped)
      .set("truncated", r.truncated)
      .set("bins", r.bins)
      .set("response_tokens", r.response_tokens)
      .set("tokenizer", tok.describe())
      .set("vocab_size", tok.vocab_size())
      .set("chat_template", chat != nullptr);
  const std::string meta_path = (fs::path(o.out_dir) / "instructions.json").string();
  std::ofstream(meta_path) << json::dump(meta, 2) << "\n";
  if (o.verbose) {
    std::fprintf(stderr,
                 "[instructions] %lld examples -> %lld bins of %lld tokens (%lld response tokens); "
                 "%lld truncated to seq_len, %lld dropped (no response token left)\n",
                 static_cast<long long>(r.examples), static_cast<long long>(r.bins),
                 static_cast<long long>(o.seq_len), static_cast<long long>(r.response_tokens),
                 static_cast<long long>(r.truncated), static_cast<long long>(r.dropped));
  }
  return r;
}

InstructionDataResult build_instruction_data(const InstructionDataOptions& o,
                                             const std::string& model_dir) {
  const Tokenizer tok = Tokenizer::from_directory(model_dir);
  std::optional<ChatTemplate> chat;
  if (ChatTemplate::in_model_dir(model_dir)) chat.emplace(ChatTemplate::from_model_dir(model_dir));
  if (o.verbose) {
    std::fprintf(
        stderr, "[instructions] tokenizer: %s; %s\n", tok.describe().c_str(),
        chat ? "the directory's chat template" : "no chat template (prompt, then response + eos)");
  }
  return build_instruction_data(o, tok, chat ? &*chat : nullptr);
}

bool is_instruction_dir(const std::string& dir) {
  std::error_code ec;
  return fs::is_directory(dir, ec) && fs::exists(fs::path(dir) / "instructions.json", ec);
}

InstructionData open_instruction_data(const std::string& dir) {
  const std::string meta_path = (fs::path(dir) / "instructions.json").string();
  const json::Value meta = json::parse_file(meta_path);
  MAMMOTH_CHECK(meta.find("format") && meta.at("format").is_string() &&
                meta.at("format").as_string() == kFormat)
      << "[instructions] " << meta_path << " is not " << kFormat;
  InstructionData d;
  d.seq_len = meta.at("seq_len").as_int();
  d.vocab_size = meta.at("vocab_size").as_int();
  d.tokens = TokenDataset::open((fs::path(dir) / meta.at("tokens").as_string()).string());
  d.loss_mask = TokenDataset::open((fs::path(dir) / meta.at("loss_mask").as_string()).string());
  MAMMOTH_CHECK(d.tokens.size() == d.loss_mask.size())
      << "[instructions] " << dir << ": " << d.tokens.size() << " tokens but " << d.loss_mask.size()
      << " loss-mask entries";
  return d;
}

}  // namespace mammoth::data
