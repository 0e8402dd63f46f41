#include "engine/data/tokenizer.h"

#include <algorithm>
#include <array>
#include <deque>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <map>
#include <unordered_map>
#include <utility>

#include "base/error.h"
#include "base/json.h"
#include "base/thread_pool.h"
#include "engine/data/bpe.h"
#include "engine/data/unicode_class.h"

namespace mammoth::data {
namespace {

namespace fs = std::filesystem;

// The Split patterns of the tokenizer.json files this reader knows, spelled as they are stored.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

enum class SplitKind { kNone, kGpt2, kLlama3, kQwen2 };
enum class Prepend { kAlways, kFirst, kNever };

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
};

// One normalizer step: Prepend(text), Replace(text -> with) or NFC.
struct NormStep {
  enum class Kind { kPrepend, kReplace, kNfc } kind;
  std::string text;
  std::string with;
};

struct DecodeStep {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  std::string a;  // Replace: pattern; Strip: content; Metaspace: replacement
  std::string b;  // Replace: content
  int64_t start = 0;
  int64_t stop = 0;
  Prepend prepend = Prepend::kAlways;
};

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  if (from.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0;;) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) {
      out.append(s.substr(pos));
      return out;
    }
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
}

// Bytes as text the way Rust's String::from_utf8_lossy makes them (what `tokenizers` returns):
// each maximal invalid subsequence becomes one U+FFFD.
std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* b = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    const size_t width = (c >= 0xC2 && c <= 0xDF)   ? 2
                         : (c >= 0xE0 && c <= 0xEF) ? 3
                         : (c >= 0xF0 && c <= 0xF4) ? 4
                                                    : 0;
    size_t good = 1;  // bytes of a valid prefix so far
    if (width > 0) {
      const unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
      const unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
      if (i + 1 < n && b[i + 1] >= lo && b[i + 1] <= hi) {
        good = 2;
        while (good < width && i + good < n && (b[i + good] & 0xC0) == 0x80) ++good;
      }
    }
    if (width > 0 && good == width) {
      out.append(s.substr(i, width));
    } else {
      out.append(kReplacementChar);
    }
    i += good;
  }
  return out;
}

bool is_valid_utf8(std::string_view s) { return utf8_lossy(s) == s; }

// Reads one tokenizer.json; every error names the file and the part of it.
class JsonReader {
 public:
  explicit JsonReader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void refuse(const std::string& what) const {
    MAMMOTH_THROW() << "[tokenizer] " << path_ << ": " << what;
  }
  void require(bool ok, const std::string& what) const {
    if (!ok) refuse(what);
  }
  // Refuses any key of `v` outside `known`: an option we do not read could change the ids.
  void known_keys(const json::Value& v, std::initializer_list<std::string_view> known,
                  const std::string& what) const {
    require(v.is_object(), what + " is not a JSON object");
    for (const json::Value& m : v) {
      const bool ok = std::find(known.begin(), known.end(), m.key()) != known.end();
      require(ok, what + " has the key \"" + m.key() + "\", which Mammoth does not support");
    }
  }
  bool get_bool(const json::Value& v, std::string_view key, bool fallback,
                const std::string& what) const {
    const json::Value* f = v.find(key);
    if (f == nullptr || f->is_null()) return fallback;
    require(f->is_bool(), what + "." + std::string(key) + " is not true/false");
    return f->as_bool();
  }
  std::string get_string(const json::Value& v, std::string_view key,
                         const std::string& what) const {
    const json::Value* f = v.find(key);
    require(f != nullptr && f->is_string(), what + "." + std::string(key) + " is not a string");
    return f->as_string();
  }
  std::string type_of(const json::Value& v, const std::string& what) const {
    require(v.is_object(), what + " is not a JSON object");
    return get_string(v, "type", what);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string short_text(const std::string& s) {
  return s.size() <= 120 ? s : s.substr(0, 117) + "...";
}

// A token given as a string or as an AddedToken object ({"content": ...}) in
// tokenizer_config.json; "" for null or absent.
std::string config_token(const json::Value& config, std::string_view key) {
  const json::Value* v = config.find(key);
  if (v == nullptr || v->is_null()) return "";
  if (v->is_string()) return v->as_string();
  if (v->is_object() && v->find("content") != nullptr && v->at("content").is_string()) {
    return v->at("content").as_string();
  }
  MAMMOTH_THROW() << "[tokenizer] tokenizer_config.json: " << key
                  << " is neither a string nor an object with \"content\"";
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  std::string kind;  // for describe()
  bool byte_level = true;
  SplitKind split = SplitKind::kGpt2;
  bool ignore_merges = false;
  BpeTokenizer bpe;
  std::vector<std::string> spelling;  // model id -> its key in the vocabulary
  std::unordered_map<std::string, int32_t> model_id;
  // SentencePiece-style BPE.
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool byte_fallback = false;
  std::array<int32_t, 256> byte_token{};
  std::vector<NormStep> normalizer;
  bool metaspace = false;
  std::string ms_replacement;
  Prepend ms_prepend = Prepend::kAlways;
  bool ms_split = true;
  // Added tokens; match_order[phase][first byte] lists indices into `added`, longest first
  // (phase 0: matched in the raw text, normalized: false; phase 1: in the normalized text).
  std::vector<AddedToken> added;
  std::unordered_map<int32_t, size_t> added_of_id;
  std::array<std::array<std::vector<int32_t>, 256>, 2> match_order;
  std::array<bool, 2> has_added{false, false};
  std::vector<int32_t> prefix, suffix;  // what the post-processor adds around one sequence
  bool has_decoder = false;
  std::vector<DecodeStep> decoder;
  int32_t vocab_size = 0;
  int32_t bos = -1;
  int32_t eos = -1;

  void finish_added() {
    for (size_t i = 0; i < added.size(); ++i) {
      const AddedToken& t = added[i];
      added_of_id[t.id] = i;
      vocab_size = std::max(vocab_size, t.id + 1);
      const int phase = t.normalized ? 1 : 0;
      match_order[phase][static_cast<unsigned char>(t.content[0])].push_back(
          static_cast<int32_t>(i));
      has_added[phase] = true;
    }
    for (auto& phase : match_order) {
      for (auto& list : phase) {
        std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
          return added[a].content.size() > added[b].content.size();
        });
      }
    }
  }

  int32_t token_to_id(std::string_view token) const {
    for (const AddedToken& t : added) {
      if (t.content == token) return t.id;
    }
    auto it = model_id.find(std::string(token));
    return it == model_id.end() ? -1 : it->second;
  }

  // Calls piece(text, offset, added_id) for the pieces of `text` in order: the added tokens of
  // `phase` (added_id >= 0), leftmost first and the longest among those starting together,
  // and the text between them (added_id -1). `offset` is where `text` starts in the input.
  template <typename F>
  void split_added(std::string_view text, size_t offset, int phase, F&& piece) const {
    if (!has_added[phase]) {
      if (!text.empty()) piece(text, offset, -1);
      return;
    }
    const size_t n = text.size();
    size_t done = 0;
    for (size_t i = 0; i < n;) {
      int32_t match = -1;
      for (int32_t k : match_order[phase][static_cast<unsigned char>(text[i])]) {
        if (text.compare(i, added[k].content.size(), added[k].content) == 0) {
          match = k;
          break;
        }
      }
      if (match < 0) {
        ++i;
        continue;
      }
      const AddedToken& t = added[match];
      size_t start = i, stop = i + t.content.size();
      if (t.lstrip) {  // back over the whitespace before it, not into the previous match
        size_t new_start = done;
        for (size_t p = done; p < start;) {
          size_t l = 0;
          if (char_class(decode_utf8(text, p, &l)) != CharClass::kSpace) new_start = p + l;
          p += l;
        }
        start = new_start;
      }
      if (t.rstrip) {
        while (stop < n) {
          size_t l = 0;
          if (char_class(decode_utf8(text, stop, &l)) != CharClass::kSpace) break;
          stop += l;
        }
      }
      if (done < start) piece(text.substr(done, start - done), offset + done, -1);
      piece(text.substr(start, stop - start), offset + start, t.id);
      done = i = stop;
    }
    if (done < n) piece(text.substr(done), offset + done, -1);
  }

  std::string normalize(std::string_view s) const {
    std::string out(s);
    for (const NormStep& step : normalizer) {
      switch (step.kind) {
        case NormStep::Kind::kPrepend:
          if (!out.empty()) out = step.text + out;
          break;
        case NormStep::Kind::kReplace:
          out = replace_all(out, step.text, step.with);
          break;
        case NormStep::Kind::kNfc:
          out = nfc(out);
          break;
      }
    }
    return out;
  }

  // SentencePiece-style BPE of one word: characters as symbols, then the merges.
  void encode_sp_word(std::string_view word, std::vector<int32_t>* out) const {
    if (ignore_merges) {
      if (const int32_t id = bpe.token_id(word); id >= 0) {
        out->push_back(id);
        return;
      }
    }
    std::vector<int32_t> symbols;
    symbols.reserve(word.size());
    // As `tokenizers` does: an unknown character becomes a pending unk (fused with the next
    // unknown ones under fuse_unk) that is written when a known character follows; byte
    // fallback tokens are written at once.
    int32_t pending_unk = -1;
    for (size_t pos = 0; pos < word.size();) {
      size_t len = 0;
      decode_utf8(word, pos, &len);
      const std::string_view ch = word.substr(pos, len);
      pos += len;
      if (const int32_t id = bpe.token_id(ch); id >= 0) {
        if (pending_unk >= 0) symbols.push_back(pending_unk);
        pending_unk = -1;
        symbols.push_back(id);
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (unsigned char b : ch) all = all && byte_token[b] >= 0;
        if (all) {
          for (unsigned char b : ch) symbols.push_back(byte_token[b]);
          continue;
        }
      }
      if (unk_id >= 0) {
        if (pending_unk >= 0 && !fuse_unk) symbols.push_back(pending_unk);
        pending_unk = unk_id;
      }
      // Neither: `tokenizers` drops the character; so do we, to give the same ids.
    }
    if (pending_unk >= 0) symbols.push_back(pending_unk);
    bpe.merge_symbols(&symbols);
    out->insert(out->end(), symbols.begin(), symbols.end());
  }

  // The model's ids for one normalized piece that starts at `offset` in the input.
  void encode_piece(std::string_view piece, size_t offset, std::vector<int32_t>* out,
                    std::unordered_map<std::string_view, std::vector<int32_t>>* cache) const {
    if (!byte_level) {
      if (!metaspace) {
        encode_sp_word(piece, out);
        return;
      }
      std::string s = replace_all(piece, " ", ms_replacement);
      const bool starts = s.compare(0, ms_replacement.size(), ms_replacement) == 0;
      if (!starts &&
          (ms_prepend == Prepend::kAlways || (ms_prepend == Prepend::kFirst && offset == 0))) {
        s = ms_replacement + s;
      }
      if (!ms_split) {
        encode_sp_word(s, out);
        return;
      }
      // Split before each replacement character (MergedWithNext).
      size_t begin = 0;
      for (size_t pos = s.find(ms_replacement, 1); pos != std::string::npos;
           pos = s.find(ms_replacement, pos + 1)) {
        encode_sp_word(std::string_view(s).substr(begin, pos - begin), out);
        begin = pos;
      }
      if (begin < s.size()) encode_sp_word(std::string_view(s).substr(begin), out);
      return;
    }
    for (size_t pos = 0; pos < piece.size();) {
      size_t end = piece.size();
      if (split == SplitKind::kGpt2) {
        end = next_pretoken(piece, pos);
      } else if (split == SplitKind::kLlama3 || split == SplitKind::kQwen2) {
        end = next_pretoken_llama3(piece, pos, split == SplitKind::kLlama3 ? 3 : 1);
      }
      const std::string_view word = piece.substr(pos, end - pos);
      pos = end;
      if (ignore_merges) {
        if (const int32_t id = bpe.token_id(word); id >= 0) {
          out->push_back(id);
          continue;
        }
      }
      auto it = cache->find(word);
      if (it == cache->end()) {
        std::vector<int32_t> ids;
        bpe.encode_word(word, &ids);
        it = cache->emplace(word, std::move(ids)).first;
      }
      out->insert(out->end(), it->second.begin(), it->second.end());
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special) const {
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 8);
    if (add_special) out.insert(out.end(), prefix.begin(), prefix.end());
    // The cache holds views of the normalized pieces, so they live (and stay put: a deque does
    // not move its elements) until the end.
    std::deque<std::string> normalized;
    std::unordered_map<std::string_view, std::vector<int32_t>> cache;
    split_added(text, 0, 0, [&](std::string_view piece, size_t offset, int32_t id) {
      if (id >= 0) {
        out.push_back(id);
        return;
      }
      std::string_view norm = piece;
      if (!normalizer.empty()) {
        normalized.push_back(normalize(piece));
        norm = normalized.back();
      }
      split_added(norm, offset, 1, [&](std::string_view p, size_t off, int32_t id2) {
        if (id2 >= 0) {
          out.push_back(id2);
        } else {
          encode_piece(p, off, &out, &cache);
        }
      });
    });
    if (add_special) out.insert(out.end(), suffix.begin(), suffix.end());
    return out;
  }

  std::vector<std::string> apply(const DecodeStep& step, std::vector<std::string> tokens) const {
    using K = DecodeStep::Kind;
    switch (step.kind) {
      case K::kByteLevel: {
        std::string bytes, one;
        for (const std::string& t : tokens) {
          if (unicode_to_bytes(t, &one)) {
            bytes += one;
          } else {
            bytes += t;  // a token outside the byte alphabet stands for its own UTF-8
          }
        }
        return {utf8_lossy(bytes)};
      }
      case K::kReplace:
        for (std::string& t : tokens) t = replace_all(t, step.a, step.b);
        return tokens;
      case K::kByteFallback: {
        std::vector<std::string> out;
        std::string pending;
        auto flush = [&] {
          if (pending.empty()) return;
          if (is_valid_utf8(pending)) {
            out.push_back(pending);
          } else {
            for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementChar);
          }
          pending.clear();
        };
        for (std::string& t : tokens) {
          int byte = -1;
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
            auto hex = [](char c) {
              if (c >= '0' && c <= '9') return c - '0';
              if (c >= 'a' && c <= 'f') return c - 'a' + 10;
              if (c >= 'A' && c <= 'F') return c - 'A' + 10;
              return -1;
            };
            const int hi = hex(t[3]), lo = hex(t[4]);
            if (hi >= 0 && lo >= 0) byte = hi * 16 + lo;
          }
          if (byte >= 0) {
            pending.push_back(static_cast<char>(byte));
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        return out;
      }
      case K::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        return {all};
      }
      case K::kStrip: {
        for (std::string& t : tokens) {
          const std::string& c = step.a;
          size_t begin = 0, end = t.size();
          for (int64_t i = 0; i < step.start && t.compare(begin, c.size(), c) == 0; ++i) {
            begin += c.size();
          }
          for (int64_t i = 0; i < step.stop && end >= begin + c.size() &&
                              t.compare(end - c.size(), c.size(), c) == 0;
               ++i) {
            end -= c.size();
          }
          t = t.substr(begin, end - begin);
        }
        return tokens;
      }
      case K::kMetaspace:
        // Every replacement character becomes a space, except in the first token, where
        // `tokenizers` drops them (it assumes they are the prepended prefix).
        for (size_t i = 0; i < tokens.size(); ++i) {
          const bool drop = i == 0 && step.prepend != Prepend::kNever;
          tokens[i] = replace_all(tokens[i], step.a, drop ? "" : " ");
        }
        return tokens;
    }
    return tokens;
  }

  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (const int32_t id : ids) {
      MAMMOTH_CHECK(id >= 0 && id < vocab_size)
          << "[tokenizer] token id " << id << " is outside the vocabulary [0, " << vocab_size
          << ") of " << source;
      if (auto it = added_of_id.find(id); it != added_of_id.end()) {
        if (skip_special && added[it->second].special) continue;
        tokens.push_back(added[it->second].content);
        continue;
      }
      MAMMOTH_CHECK(static_cast<size_t>(id) < spelling.size())
          << "[tokenizer] token id " << id << " has no token in " << source;
      tokens.push_back(spelling[id]);
    }
    if (!has_decoder) {
      std::string out;
      for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
      return out;
    }
    for (const DecodeStep& step : decoder) tokens = apply(step, std::move(tokens));
    std::string out;
    for (const std::string& t : tokens) out += t;
    return out;
  }
};

// ---------------------------------------------------------------------------------------------
// Reading tokenizer.json.

namespace {

void read_normalizer(const JsonReader& r, const json::Value& v, std::vector<NormStep>* steps) {
  if (v.is_null()) return;
  const std::string type = r.type_of(v, "normalizer");
  if (type == "Sequence") {
    r.known_keys(v, {"type", "normalizers"}, "normalizer Sequence");
    r.require(v.at("normalizers").is_array(), "normalizer Sequence.normalizers is not a list");
    for (const json::Value& n : v.at("normalizers")) read_normalizer(r, n, steps);
  } else if (type == "Prepend") {
    r.known_keys(v, {"type", "prepend"}, "normalizer Prepend");
    steps->push_back(
        {NormStep::Kind::kPrepend, r.get_string(v, "prepend", "normalizer Prepend"), ""});
  } else if (type == "Replace") {
    r.known_keys(v, {"type", "pattern", "content"}, "normalizer Replace");
    const json::Value& p = v.at("pattern");
    r.require(p.is_object() && p.find("String") != nullptr && p.at("String").is_string(),
              "normalizer Replace with a Regex pattern is not supported (only String)");
    steps->push_back({NormStep::Kind::kReplace, p.at("String").as_string(),
                      r.get_string(v, "content", "normalizer Replace")});
  } else if (type == "NFC") {
    r.known_keys(v, {"type"}, "normalizer NFC");
    steps->push_back({NormStep::Kind::kNfc, "", ""});
  } else {
    r.refuse("normalizer " + type + " is not supported (supported: NFC, Prepend, Replace with " +
             "a String pattern, and Sequences of them)");
  }
}

void read_split(const JsonReader& r, const json::Value& v, Tokenizer::Impl* t) {
  r.known_keys(v, {"type", "pattern", "behavior", "invert"}, "pre_tokenizer Split");
  const json::Value& p = v.at("pattern");
  r.require(p.is_object() && p.find("Regex") != nullptr && p.at("Regex").is_string(),
            "pre_tokenizer Split with a String pattern is not supported (only the Regex "
            "patterns of GPT-2, Llama 3 and Qwen2)");
  const std::string& re = p.at("Regex").as_string();
  if (re == kGpt2Pattern) {
    t->split = SplitKind::kGpt2;
  } else if (re == kLlama3Pattern) {
    t->split = SplitKind::kLlama3;
  } else if (re == kQwen2Pattern) {
    t->split = SplitKind::kQwen2;
  } else {
    r.refuse("pre_tokenizer Split pattern \"" + short_text(re) +
             "\" is not one Mammoth implements (GPT-2's, Llama 3's or Qwen2's)");
  }
  r.require(r.get_string(v, "behavior", "pre_tokenizer Split") == "Isolated",
            "pre_tokenizer Split behavior \"" + r.get_string(v, "behavior", "Split") +
                "\" is not supported (only Isolated)");
  r.require(!r.get_bool(v, "invert", false, "pre_tokenizer Split"),
            "pre_tokenizer Split with invert: true is not supported");
}

Prepend read_prepend_scheme(const JsonReader& r, const json::Value& v, const std::string& what) {
  if (const json::Value* s = v.find("prepend_scheme"); s != nullptr && !s->is_null()) {
    r.require(s->is_string(), what + ".prepend_scheme is not a string");
    const std::string& k = s->as_string();
    if (k == "always") return Prepend::kAlways;
    if (k == "first") return Prepend::kFirst;
    if (k == "never") return Prepend::kNever;
    r.refuse(what + ".prepend_scheme \"" + k + "\" is not always, first or never");
  }
  // Files written before prepend_scheme existed say add_prefix_space.
  return r.get_bool(v, "add_prefix_space", true, what) ? Prepend::kAlways : Prepend::kNever;
}

void read_pre_tokenizer(const JsonReader& r, const json::Value& v, Tokenizer::Impl* t) {
  if (v.is_null()) {
    t->byte_level = false;
    return;
  }
  const std::string type = r.type_of(v, "pre_tokenizer");
  if (type == "ByteLevel") {
    r.known_keys(v, {"type", "add_prefix_space", "trim_offsets", "use_regex"},
                 "pre_tokenizer ByteLevel");
    r.require(!r.get_bool(v, "add_prefix_space", false, "pre_tokenizer ByteLevel"),
              "pre_tokenizer ByteLevel with add_prefix_space: true is not supported");
    t->byte_level = true;
    t->split = r.get_bool(v, "use_regex", true, "pre_tokenizer ByteLevel") ? SplitKind::kGpt2
                                                                           : SplitKind::kNone;
  } else if (type == "Sequence") {
    r.known_keys(v, {"type", "pretokenizers"}, "pre_tokenizer Sequence");
    const json::Value& list = v.at("pretokenizers");
    r.require(list.is_array(), "pre_tokenizer Sequence.pretokenizers is not a list");
    if (list.size() == 1) {
      read_pre_tokenizer(r, list[0], t);
      return;
    }
    // Split by a known pattern, then ByteLevel without its own regex: Llama 3 and Qwen2.
    r.require(list.size() == 2 && list[0].is_object() && list[1].is_object() &&
                  list[0].find("type") && list[0].at("type").is_string() &&
                  list[0].at("type").as_string() == "Split" && list[1].find("type") &&
                  list[1].at("type").is_string() && list[1].at("type").as_string() == "ByteLevel",
              "pre_tokenizer Sequence is supported only as [Split, ByteLevel] (Llama 3, Qwen2)");
    read_split(r, list[0], t);
    const SplitKind split = t->split;
    read_pre_tokenizer(r, list[1], t);
    r.require(t->split == SplitKind::kNone,
              "pre_tokenizer ByteLevel after a Split must have use_regex: false");
    t->split = split;
  } else if (type == "Metaspace") {
    r.known_keys(v,
                 {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"},
                 "pre_tokenizer Metaspace");
    t->byte_level = false;
    t->metaspace = true;
    t->ms_replacement = r.get_string(v, "replacement", "pre_tokenizer Metaspace");
    r.require(!t->ms_replacement.empty(), "pre_tokenizer Metaspace.replacement is empty");
    t->ms_prepend = read_prepend_scheme(r, v, "pre_tokenizer Metaspace");
    t->ms_split = r.get_bool(v, "split", true, "pre_tokenizer Metaspace");
  } else {
    r.refuse("pre_tokenizer " + type +
             " is not supported (supported: ByteLevel, Sequence [Split, ByteLevel], Metaspace)");
  }
}

void read_post_processor(const JsonReader& r, const json::Value& v, const Tokenizer::Impl& t,
                         std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) {
  if (v.is_null()) return;
  const std::string type = r.type_of(v, "post_processor");
  if (type == "ByteLevel") {
    // Its options only move offsets, which Mammoth does not report.
    r.known_keys(v, {"type", "add_prefix_space", "trim_offsets", "use_regex"},
                 "post_processor ByteLevel");
  } else if (type == "Sequence") {
    r.known_keys(v, {"type", "processors"}, "post_processor Sequence");
    r.require(v.at("processors").is_array(), "post_processor Sequence.processors is not a list");
    for (const json::Value& p : v.at("processors")) read_post_processor(r, p, t, prefix, suffix);
  } else if (type == "TemplateProcessing") {
    // "pair" is for sequence pairs, which Mammoth never encodes.
    r.known_keys(v, {"type", "single", "pair", "special_tokens"},
                 "post_processor TemplateProcessing");
    const json::Value& single = v.at("single");
    r.require(single.is_array(), "post_processor TemplateProcessing.single is not a list");
    const json::Value& specials = v.at("special_tokens");
    bool seen_sequence = false;
    for (const json::Value& item : single) {
      if (const json::Value* s = item.find("Sequence")) {
        r.require(!seen_sequence && s->is_object() && r.get_string(*s, "id", "Sequence") == "A",
                  "post_processor TemplateProcessing.single must hold the sequence $A once");
        seen_sequence = true;
        continue;
      }
      const json::Value* sp = item.find("SpecialToken");
      r.require(sp != nullptr && sp->is_object(),
                "post_processor TemplateProcessing.single has an item that is neither "
                "SpecialToken nor Sequence");
      const std::string name = r.get_string(*sp, "id", "TemplateProcessing SpecialToken");
      const json::Value* entry = specials.find(name);
      r.require(entry != nullptr && entry->find("ids") && entry->at("ids").is_array(),
                "post_processor TemplateProcessing: special token \"" + name +
                    "\" has no ids in special_tokens");
      for (const json::Value& id : entry->at("ids")) {
        r.require(id.is_int() && id.as_int() >= 0 && id.as_int() < t.vocab_size,
                  "post_processor TemplateProcessing: special token \"" + name +
                      "\" has an id outside the vocabulary");
        (seen_sequence ? suffix : prefix)->push_back(static_cast<int32_t>(id.as_int()));
      }
    }
    r.require(seen_sequence, "post_processor TemplateProcessing.single has no sequence $A");
  } else {
    r.refuse("post_processor " + type +
             " is not supported (supported: ByteLevel, TemplateProcessing, Sequence)");
  }
}

void read_decoder(const JsonReader& r, const json::Value& v, std::vector<DecodeStep>* steps) {
  using K = DecodeStep::Kind;
  const std::string type = r.type_of(v, "decoder");
  DecodeStep step{K::kFuse, "", "", 0, 0, Prepend::kAlways};
  if (type == "Sequence") {
    r.known_keys(v, {"type", "decoders"}, "decoder Sequence");
    r.require(v.at("decoders").is_array(), "decoder Sequence.decoders is not a list");
    for (const json::Value& d : v.at("decoders")) read_decoder(r, d, steps);
    return;
  } else if (type == "ByteLevel") {
    // Its options only matter for offsets.
    r.known_keys(v, {"type", "add_prefix_space", "trim_offsets", "use_regex"}, "decoder ByteLevel");
    step.kind = K::kByteLevel;
  } else if (type == "Replace") {
    r.known_keys(v, {"type", "pattern", "content"}, "decoder Replace");
    const json::Value& p = v.at("pattern");
    r.require(p.is_object() && p.find("String") != nullptr && p.at("String").is_string(),
              "decoder Replace with a Regex pattern is not supported (only String)");
    step.kind = K::kReplace;
    step.a = p.at("String").as_string();
    step.b = r.get_string(v, "content", "decoder Replace");
  } else if (type == "ByteFallback") {
    r.known_keys(v, {"type"}, "decoder ByteFallback");
    step.kind = K::kByteFallback;
  } else if (type == "Fuse") {
    r.known_keys(v, {"type"}, "decoder Fuse");
    step.kind = K::kFuse;
  } else if (type == "Strip") {
    r.known_keys(v, {"type", "content", "start", "stop"}, "decoder Strip");
    step.kind = K::kStrip;
    step.a = r.get_string(v, "content", "decoder Strip");
    r.require(v.at("start").is_int() && v.at("stop").is_int() && v.at("start").as_int() >= 0 &&
                  v.at("stop").as_int() >= 0,
              "decoder Strip.start/stop are not counts");
    step.start = v.at("start").as_int();
    step.stop = v.at("stop").as_int();
  } else if (type == "Metaspace") {
    r.known_keys(v,
                 {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"},
                 "decoder Metaspace");
    step.kind = K::kMetaspace;
    step.a = r.get_string(v, "replacement", "decoder Metaspace");
    step.prepend = read_prepend_scheme(r, v, "decoder Metaspace");
  } else {
    r.refuse("decoder " + type +
             " is not supported (supported: ByteLevel, Replace, ByteFallback, Fuse, Strip, "
             "Metaspace, Sequence)");
  }
  steps->push_back(std::move(step));
}

void read_model(const JsonReader& r, const json::Value& m, Tokenizer::Impl* t) {
  const std::string type = r.type_of(m, "model");
  r.require(type == "BPE", "model " + type + " is not supported (only BPE)");
  r.known_keys(m,
               {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"},
               "model BPE");
  r.require(m.find("dropout") == nullptr || m.at("dropout").is_null(),
            "model BPE with dropout is not supported (it makes encoding random)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json::Value* f = m.find(key);
    r.require(f == nullptr || f->is_null() || (f->is_string() && f->as_string().empty()),
              std::string("model BPE.") + key + " is not supported (only null or \"\")");
  }
  t->fuse_unk = r.get_bool(m, "fuse_unk", false, "model BPE");
  t->byte_fallback = r.get_bool(m, "byte_fallback", false, "model BPE");
  t->ignore_merges = r.get_bool(m, "ignore_merges", false, "model BPE");

  const json::Value& vocab = m.at("vocab");
  r.require(vocab.is_object() && !vocab.empty(), "model BPE.vocab is not a non-empty object");
  const int64_t n = static_cast<int64_t>(vocab.size());
  t->spelling.assign(n, std::string());
  std::vector<bool> seen(n, false);
  for (const json::Value& e : vocab) {
    r.require(e.is_int() && e.as_int() >= 0 && e.as_int() < n && !seen[e.as_int()],
              "model BPE.vocab: token \"" + short_text(e.key()) + "\" has an id outside 0.." +
                  std::to_string(n - 1) + " or one used twice");
    seen[e.as_int()] = true;
    t->spelling[e.as_int()] = e.key();
    t->model_id.emplace(e.key(), static_cast<int32_t>(e.as_int()));
  }

  // Merges: "left right" strings (tokenizers <= 0.19) or [left, right] pairs (later versions).
  const json::Value& merges = m.at("merges");
  r.require(merges.is_array(), "model BPE.merges is not a list");
  std::vector<std::pair<int32_t, int32_t>> pairs;
  pairs.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json::Value& e = merges[i];
    std::string left, right;
    if (e.is_string()) {
      const std::string& s = e.as_string();
      const size_t sp = s.find(' ');
      r.require(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos,
                "model BPE.merges[" + std::to_string(i) + "] \"" + short_text(s) +
                    "\" is not two tokens separated by one space");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else {
      r.require(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
                "model BPE.merges[" + std::to_string(i) + "] is neither \"a b\" nor [a, b]");
      left = e[0].as_string();
      right = e[1].as_string();
    }
    auto l = t->model_id.find(left), rt = t->model_id.find(right);
    r.require(l != t->model_id.end() && rt != t->model_id.end(),
              "model BPE.merges[" + std::to_string(i) +
                  "] names a token that is not in the "
                  "vocabulary (\"" +
                  short_text(left) + "\", \"" + short_text(right) + "\")");
    pairs.emplace_back(l->second, rt->second);
  }
  // `tokenizers` keeps the last rank of a repeated merge; dropping the earlier copies keeps
  // every other merge's relative order, which is all the ranks decide.
  {
    std::map<std::pair<int32_t, int32_t>, size_t> last;
    for (size_t i = 0; i < pairs.size(); ++i) last[pairs[i]] = i;
    if (last.size() != pairs.size()) {
      std::vector<std::pair<int32_t, int32_t>> kept;
      for (size_t i = 0; i < pairs.size(); ++i) {
        if (last[pairs[i]] == i) kept.push_back(pairs[i]);
      }
      pairs.swap(kept);
    }
  }

  std::vector<std::string> bytes(n);
  for (int64_t id = 0; id < n; ++id) {
    // Byte-level tokens are spelled in GPT-2's byte alphabet; any other spelling is the text.
    if (!t->byte_level || !unicode_to_bytes(t->spelling[id], &bytes[id]))
      bytes[id] = t->spelling[id];
  }
  r.require(!(t->byte_level && t->byte_fallback),
            "model BPE with byte_fallback: true under a ByteLevel pre-tokenizer is not supported");
  t->bpe = BpeTokenizer::from_tokens(std::move(bytes), std::move(pairs), t->byte_level, r.path());

  if (const json::Value* unk = m.find("unk_token"); unk != nullptr && !unk->is_null()) {
    r.require(unk->is_string(), "model BPE.unk_token is not a string");
    auto it = t->model_id.find(unk->as_string());
    r.require(it != t->model_id.end(),
              "model BPE.unk_token \"" + unk->as_string() + "\" is not in the vocabulary");
    t->unk_id = it->second;
  }
  t->byte_token.fill(-1);
  if (t->byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      static const char* kHex = "0123456789ABCDEF";
      const std::string name = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
      if (auto it = t->model_id.find(name); it != t->model_id.end()) t->byte_token[b] = it->second;
    }
  }
  t->vocab_size = static_cast<int32_t>(n);
}

void read_added_tokens(const JsonReader& r, const json::Value& list, Tokenizer::Impl* t) {
  if (list.is_null()) return;
  r.require(list.is_array(), "added_tokens is not a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const json::Value& e = list[i];
    const std::string what = "added_tokens[" + std::to_string(i) + "]";
    r.known_keys(e, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"},
                 what);
    AddedToken a;
    r.require(e.find("id") && e.at("id").is_int() && e.at("id").as_int() >= 0 &&
                  e.at("id").as_int() < INT32_MAX,
              what + ".id is not a token id");
    a.id = static_cast<int32_t>(e.at("id").as_int());
    a.content = r.get_string(e, "content", what);
    r.require(!a.content.empty(), what + " has empty content");
    r.require(!r.get_bool(e, "single_word", false, what),
              what + " (\"" + a.content + "\") has single_word: true, which is not supported");
    a.lstrip = r.get_bool(e, "lstrip", false, what);
    a.rstrip = r.get_bool(e, "rstrip", false, what);
    a.normalized = r.get_bool(e, "normalized", false, what);
    a.special = r.get_bool(e, "special", false, what);
    r.require(!a.normalized || t->normalizer.empty(),
              what + " (\"" + a.content +
                  "\") has normalized: true under a normalizer, which "
                  "is not supported");
    t->added.push_back(std::move(a));
  }
}

void read_config(const std::string& path, Tokenizer::Impl* t) {
  const json::Value c = json::parse_file(path);
  MAMMOTH_CHECK(c.is_object()) << "[tokenizer] " << path << " is not a JSON object";
  auto id_of = [&](std::string_view key) {
    const std::string token = config_token(c, key);
    if (token.empty()) return -1;
    const int32_t id = t->token_to_id(token);
    MAMMOTH_CHECK(id >= 0) << "[tokenizer] " << path << ": " << key << " \"" << token
                           << "\" is not a token of " << t->source;
    return id;
  };
  // add_prefix_space: transformers' byte-level tokenizers rebuild their ByteLevel pre-tokenizer
  // with it (false is what Mammoth reads), its Llama fast tokenizer re-converts tokenizer.model
  // when it is set at all, so tokenizer.json is then not what transformers uses.
  if (const json::Value* aps = c.find("add_prefix_space"); aps != nullptr && !aps->is_null()) {
    MAMMOTH_CHECK(t->byte_level && aps->is_bool() && !aps->as_bool())
        << "[tokenizer] " << path << ": add_prefix_space " << json::dump(*aps)
        << " is not supported for " << t->kind
        << " (transformers would rebuild the tokenizer instead of reading tokenizer.json)";
  }
  t->bos = id_of("bos_token");
  t->eos = id_of("eos_token");
  // transformers rebuilds the post-processor from these flags for some tokenizer classes; we
  // use tokenizer.json's, so refuse a config that says otherwise.
  auto check_flag = [&](const char* key, int32_t id, const std::vector<int32_t>& ids,
                        const char* where) {
    const json::Value* f = c.find(key);
    if (f == nullptr || !f->is_bool()) return;
    const bool adds = id >= 0 && std::find(ids.begin(), ids.end(), id) != ids.end();
    MAMMOTH_CHECK(f->as_bool() == adds)
        << "[tokenizer] " << path << ": " << key << " is " << (f->as_bool() ? "true" : "false")
        << " but " << t->source << "'s post_processor " << (adds ? "adds" : "does not add")
        << " that token " << where << "; Mammoth follows tokenizer.json and refuses the mismatch";
  };
  check_flag("add_bos_token", t->bos, t->prefix, "in front");
  check_flag("add_eos_token", t->eos, t->suffix, "at the end");
}

}  // namespace

Tokenizer Tokenizer::from_json_file(const std::string& tokenizer_json,
                                    const std::string& config_json) {
  auto t = std::make_shared<Impl>();
  t->source = tokenizer_json;
  const JsonReader r(tokenizer_json);
  const json::Value j = json::parse_file(tokenizer_json);
  r.known_keys(j,
               {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
                "post_processor", "decoder", "model"},
               "the top level");
  for (const char* key : {"truncation", "padding"}) {
    r.require(j.find(key) == nullptr || j.at(key).is_null(),
              std::string(key) + " is set; Mammoth encodes without " + key + " (set it to null)");
  }
  r.require(j.find("model") != nullptr, "there is no model");
  const json::Value null_value;
  auto get = [&](const char* key) -> const json::Value& {
    const json::Value* v = j.find(key);
    return v == nullptr ? null_value : *v;
  };
  read_normalizer(r, get("normalizer"), &t->normalizer);
  read_pre_tokenizer(r, get("pre_tokenizer"), t.get());
  read_model(r, j.at("model"), t.get());
  read_added_tokens(r, get("added_tokens"), t.get());
  t->finish_added();
  read_post_processor(r, get("post_processor"), *t, &t->prefix, &t->suffix);
  if (!get("decoder").is_null()) {
    t->has_decoder = true;
    read_decoder(r, get("decoder"), &t->decoder);
  }
  if (t->byte_level) {
    static const char* kSplitName[] = {"no split", "GPT-2 split", "Llama 3 split", "Qwen2 split"};
    t->kind = std::string("byte-level BPE (") + kSplitName[static_cast<int>(t->split)] + ")";
  } else {
    t->kind =
        std::string("SentencePiece-style BPE") + (t->byte_fallback ? " with byte fallback" : "");
  }
  if (!config_json.empty()) {
    read_config(config_json, t.get());
  } else if (const int32_t eot = t->token_to_id(kEndOfText); eot >= 0) {
    t->bos = t->eos = eot;
  }
  Tokenizer tok;
  tok.impl_ = std::move(t);
  return tok;
}

Tokenizer Tokenizer::from_bpe_files(const std::string& vocab_json, const std::string& merges_txt) {
  auto t = std::make_shared<Impl>();
  t->source = vocab_json;
  t->kind = "byte-level BPE (GPT-2 split)";
  t->byte_level = true;
  t->split = SplitKind::kGpt2;
  t->bpe = BpeTokenizer::load(vocab_json, merges_txt);
  t->vocab_size = t->bpe.vocab_size();
  t->spelling.resize(t->vocab_size);
  for (int32_t id = 0; id < t->vocab_size; ++id) {
    t->spelling[id] = bytes_to_unicode(t->bpe.token_bytes(id));
    t->model_id.emplace(t->spelling[id], id);
  }
  if (const int32_t eot = t->bpe.eot_id(); eot >= 0) {
    // As transformers' GPT-2 tokenizer treats it.
    AddedToken a;
    a.content = std::string(kEndOfText);
    a.id = eot;
    a.special = true;
    t->added.push_back(a);
    t->bos = t->eos = eot;
  }
  t->finish_added();
  t->has_decoder = true;
  t->decoder.push_back({DecodeStep::Kind::kByteLevel, "", "", 0, 0, Prepend::kAlways});
  Tokenizer tok;
  tok.impl_ = std::move(t);
  return tok;
}

Tokenizer Tokenizer::from_directory(const std::string& dir) {
  const fs::path d(dir);
  const fs::path config = d / "tokenizer_config.json";
  const std::string config_path = fs::exists(config) ? config.string() : "";
  if (fs::exists(d / "tokenizer.json")) {
    return from_json_file((d / "tokenizer.json").string(), config_path);
  }
  MAMMOTH_CHECK(fs::exists(d / "vocab.json") && fs::exists(d / "merges.txt"))
      << "[tokenizer] '" << dir
      << "' has no tokenizer.json and no vocab.json + merges.txt (a tokenizer.model alone, "
         "SentencePiece's own format, is not read: convert it with transformers' "
         "LlamaTokenizerFast and save_pretrained)";
  return from_bpe_files((d / "vocab.json").string(), (d / "merges.txt").string());
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return impl_->encode(text, add_special_tokens);
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(
    const std::vector<std::string_view>& texts, bool add_special_tokens) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  parallel_for(0, static_cast<int64_t>(texts.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = impl_->encode(texts[i], add_special_tokens);
  });
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return impl_->decode(ids, skip_special_tokens);
}

int Tokenizer::vocab_size() const { return impl_->vocab_size; }
int32_t Tokenizer::bos_id() const { return impl_->bos; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::token_to_id(std::string_view token) const { return impl_->token_to_id(token); }

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_of_id.find(id);
  return it != impl_->added_of_id.end() && impl_->added[it->second].special;
}

bool Tokenizer::is_byte_fallback(int32_t id) const {
  if (!impl_->byte_fallback || id < 0) return false;
  const auto& b = impl_->byte_token;
  return std::find(b.begin(), b.end(), id) != b.end();
}

std::string Tokenizer::describe() const {
  return impl_->kind + ", " + std::to_string(impl_->vocab_size) + " tokens, from " + impl_->source;
}

}  // namespace mammoth::data
