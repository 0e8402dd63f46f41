#include "engine/data/wordpiece.h"

#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "base/json.h"

namespace mammoth::data {
namespace {

// BertTokenizer's _is_punctuation for ASCII: every non-alphanumeric printable character.
bool is_punct(unsigned char c) {
  return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
         (c >= 123 && c <= 126);
}

bool is_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

constexpr size_t kMaxWordChars = 100;  // BertTokenizer's max_input_chars_per_word

}  // namespace

WordPiece WordPiece::from_directory(const std::string& dir) {
  WordPiece w;
  w.dir_ = dir;
  const std::string vocab = dir + "/vocab.txt";
  std::ifstream in(vocab);
  MAMMOTH_CHECK(in.good()) << "[wordpiece] " << dir
                           << " has no vocab.txt (BERT's WordPiece vocabulary, one token a line)";
  std::string line;
  while (std::getline(in, line)) {
    // transformers strips the line's trailing newline only ("\r" would stay part of the token).
    MAMMOTH_CHECK(w.ids_.emplace(line, static_cast<int32_t>(w.tokens_.size())).second ||
                  line.empty())
        << "[wordpiece] " << vocab << ": token '" << line << "' appears twice (line "
        << w.tokens_.size() + 1 << ")";
    w.tokens_.push_back(line);
  }
  MAMMOTH_CHECK(!w.tokens_.empty()) << "[wordpiece] " << vocab << " is empty";
  const std::string config = dir + "/tokenizer_config.json";
  if (std::filesystem::exists(config)) {
    const json::Value c = json::parse_file(config);
    if (const json::Value* v = c.find("do_lower_case"); v != nullptr && !v->is_null())
      w.lower_ = v->as_bool();
    if (const json::Value* v = c.find("never_split"); v != nullptr && !v->is_null()) {
      MAMMOTH_CHECK(v->is_array() && v->empty())
          << "[wordpiece] " << config << ": never_split is not supported";
    }
    if (const json::Value* v = c.find("tokenizer_class"); v != nullptr && v->is_string()) {
      MAMMOTH_CHECK(v->as_string().rfind("Bert", 0) == 0)
          << "[wordpiece] " << config << ": tokenizer_class " << v->as_string()
          << " is not a BERT WordPiece tokenizer";
    }
  }
  w.cls_ = w.token_to_id("[CLS]");
  w.sep_ = w.token_to_id("[SEP]");
  w.pad_ = w.token_to_id("[PAD]");
  w.unk_ = w.token_to_id("[UNK]");
  MAMMOTH_CHECK(w.cls_ >= 0 && w.sep_ >= 0 && w.pad_ >= 0 && w.unk_ >= 0)
      << "[wordpiece] " << vocab << " lacks one of [CLS], [SEP], [PAD], [UNK]";
  return w;
}

int32_t WordPiece::token_to_id(const std::string& token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

void WordPiece::wordpiece(const std::string& word, std::vector<int32_t>* out) const {
  if (word.size() > kMaxWordChars) {
    out->push_back(unk_);
    return;
  }
  std::vector<int32_t> pieces;
  size_t start = 0;
  while (start < word.size()) {
    size_t end = word.size();
    int32_t found = -1;
    while (start < end) {
      const std::string piece = (start > 0 ? "##" : "") + word.substr(start, end - start);
      found = token_to_id(piece);
      if (found >= 0) break;
      --end;
    }
    if (found < 0) {
      out->push_back(unk_);
      return;
    }
    pieces.push_back(found);
    start = end;
  }
  out->insert(out->end(), pieces.begin(), pieces.end());
}

std::vector<int32_t> WordPiece::encode(std::string_view text, const std::string& where) const {
  std::vector<int32_t> ids;
  std::string word;
  auto flush = [&] {
    if (!word.empty()) wordpiece(word, &ids);
    word.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    MAMMOTH_CHECK(c < 0x80) << "[wordpiece] " << where << ": a non-ASCII byte at offset " << i
                            << "; this WordPiece reader encodes ASCII text only (give the row's "
                               "ids instead)";
    if (is_space(c)) {
      flush();
    } else if (c < 32 || c == 127) {
      continue;  // control characters are dropped (BertTokenizer's _clean_text)
    } else if (is_punct(c)) {
      flush();
      word.push_back(static_cast<char>(c));
      flush();
    } else {
      word.push_back(static_cast<char>(lower_ ? std::tolower(c) : c));
    }
  }
  flush();
  return ids;
}

std::string WordPiece::describe() const {
  return "WordPiece, " + std::to_string(tokens_.size()) + " tokens" +
         (lower_ ? ", lower-cased" : "") + ", from " + dir_ + "/vocab.txt";
}

}  // namespace mammoth::data
