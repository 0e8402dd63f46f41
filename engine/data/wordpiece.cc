#include "engine/data/wordpiece.h"

#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "base/json.h"
#include "engine/data/unicode_class.h"

namespace mammoth::data {
namespace {

// BertTokenizer's _is_punctuation: ASCII's non-alphanumeric printable characters, and
// Unicode's P* categories.
bool is_punct(uint32_t c) {
  return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
         (c >= 123 && c <= 126) || is_punctuation_category(c);
}

// _is_whitespace (mapped to a space by _clean_text) and _is_control (dropped).
bool is_bert_space(uint32_t c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || is_space_separator(c);
}
bool is_bert_control(uint32_t c) {
  return c != '\t' && c != '\n' && c != '\r' && is_control_category(c);
}

// _is_chinese_char: the CJK Unified Ideographs blocks and their compatibility forms (not
// Japanese kana or Korean Hangul), each of which becomes a word of its own.
bool is_cjk(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

std::vector<uint32_t> from_utf8(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    size_t len = 0;
    out.push_back(decode_utf8(text, pos, &len));
    pos += len;
  }
  return out;
}

std::string to_utf8(const std::vector<uint32_t>& points) {
  std::string out;
  for (const uint32_t c : points) append_utf8(c, &out);
  return out;
}

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
    if (const json::Value* v = c.find("strip_accents"); v != nullptr && !v->is_null())
      w.strip_accents_ = v->as_bool() ? 1 : 0;
    if (const json::Value* v = c.find("tokenize_chinese_chars"); v != nullptr && !v->is_null())
      w.chinese_ = v->as_bool();
    for (const char* key : {"do_basic_tokenize", "do_split_on_punc"}) {
      if (const json::Value* v = c.find(key); v != nullptr && !v->is_null()) {
        MAMMOTH_CHECK(v->as_bool()) << "[wordpiece] " << config << ": " << key
                                    << " false is not supported (only BERT's basic tokenizer)";
      }
    }
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
  w.mask_ = w.token_to_id("[MASK]");
  MAMMOTH_CHECK(w.cls_ >= 0 && w.sep_ >= 0 && w.pad_ >= 0 && w.unk_ >= 0)
      << "[wordpiece] " << vocab << " lacks one of [CLS], [SEP], [PAD], [UNK]";
  return w;
}

int32_t WordPiece::token_to_id(const std::string& token) const {
  auto it = ids_.find(token);
  return it == ids_.end() ? -1 : it->second;
}

void WordPiece::wordpiece(const std::vector<uint32_t>& chars, std::vector<int32_t>* out) const {
  if (chars.size() > kMaxWordChars) {
    out->push_back(unk_);
    return;
  }
  // Greedy longest match over whole characters: pieces start and end on code points.
  std::vector<int32_t> pieces;
  size_t start = 0;
  while (start < chars.size()) {
    size_t end = chars.size();
    int32_t found = -1;
    while (start < end) {
      std::string piece = start > 0 ? "##" : "";
      for (size_t k = start; k < end; ++k) append_utf8(chars[k], &piece);
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
  // BertTokenizer.tokenize: the special tokens written in the text ("[SEP]", exactly) are
  // their ids; the text between them goes through BasicTokenizer on its own.
  std::vector<int32_t> ids;
  size_t done = 0;
  while (done < text.size()) {
    size_t at = std::string_view::npos, len = 0;
    int32_t id = -1;
    for (const int32_t s : {unk_, sep_, pad_, cls_, mask_}) {
      if (s < 0) continue;
      const std::string& token = tokens_[static_cast<size_t>(s)];
      const size_t p = text.find(token, done);
      if (p != std::string_view::npos && (p < at || (p == at && token.size() > len))) {
        at = p;
        len = token.size();
        id = s;
      }
    }
    const size_t end = at == std::string_view::npos ? text.size() : at;
    basic(text.substr(done, end - done), done, where, &ids);
    if (id >= 0) ids.push_back(id);
    done = end + len;
  }
  return ids;
}

void WordPiece::basic(std::string_view text, size_t offset, const std::string& where,
                      std::vector<int32_t>* out) const {
  // BasicTokenizer.tokenize, step by step: clean, space out CJK ideographs, NFC, split on
  // str.split()'s whitespace, lower-case (BertTokenizer.tokenize has lowered every character
  // before) and strip accents per word, split off punctuation.
  std::vector<uint32_t> cleaned;
  cleaned.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    size_t len = 0;
    const uint32_t c = decode_utf8(text, pos, &len);
    MAMMOTH_CHECK(c < 0x110000) << "[wordpiece] " << where << ": byte " << offset + pos
                                << " is not valid UTF-8 (BertTokenizer reads Unicode text)";
    pos += len;
    if (c == 0 || c == 0xFFFD || is_bert_control(c)) continue;
    if (is_bert_space(c)) {
      cleaned.push_back(' ');
    } else if (chinese_ && is_cjk(c)) {
      cleaned.insert(cleaned.end(), {' ', c, ' '});
    } else {
      cleaned.push_back(c);
    }
  }
  const std::vector<uint32_t> normal = from_utf8(nfc(to_utf8(cleaned)));
  const bool strip = strip_accents_ == 1 || (lower_ && strip_accents_ != 0);
  std::vector<uint32_t> word;
  auto flush = [&] {
    if (!word.empty()) wordpiece(word, out);
    word.clear();
  };
  for (size_t i = 0; i < normal.size();) {
    if (is_python_space(normal[i])) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < normal.size() && !is_python_space(normal[j])) ++j;
    std::vector<uint32_t> token(normal.begin() + static_cast<std::ptrdiff_t>(i),
                                normal.begin() + static_cast<std::ptrdiff_t>(j));
    i = j;
    if (lower_) token = data::lower_case(token);
    if (strip) {
      std::vector<uint32_t> kept;
      for (const uint32_t c : nfd(token)) {
        if (!is_nonspacing_mark(c)) kept.push_back(c);
      }
      token = std::move(kept);
    }
    for (const uint32_t c : token) {
      if (is_punct(c)) {
        flush();
        word.push_back(c);
        flush();
      } else if (is_python_space(c)) {
        flush();  // " ".join and split again: a space the steps above produced splits too
      } else {
        word.push_back(c);
      }
    }
    flush();
  }
}

std::string WordPiece::describe() const {
  return "WordPiece, " + std::to_string(tokens_.size()) + " tokens" +
         (lower_ ? ", lower-cased" : "") +
         (strip_accents_ == 1 || (lower_ && strip_accents_ != 0) ? ", accents stripped" : "") +
         ", from " + dir_ + "/vocab.txt";
}

}  // namespace mammoth::data
