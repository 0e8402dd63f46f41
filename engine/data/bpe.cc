#include "engine/data/bpe.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "base/error.h"
#include "base/json.h"
#include "base/thread_pool.h"
#include "engine/data/mapped_file.h"
#include "engine/data/unicode_class.h"

namespace mammoth::data {

// ---------------------------------------------------------------------------------------------
// Byte <-> unicode alphabet.

namespace {

// GPT-2 keeps the printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') as themselves and maps
// the other 68 bytes, in increasing order, to U+0100, U+0101, ... so that every token is a
// printable string without spaces (merges.txt separates its two columns by a space).
struct ByteAlphabet {
  std::array<uint32_t, 256> code_point{};
  std::array<std::string, 256> utf8;
  std::array<int16_t, 324> byte_of{};  // code point -> byte, -1 when not in the alphabet

  ByteAlphabet() {
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int shifted = 0;
    for (int b = 0; b < 256; ++b) code_point[b] = printable(b) ? b : 256 + shifted++;
    byte_of.fill(-1);
    for (int b = 0; b < 256; ++b) {
      const uint32_t c = code_point[b];
      byte_of[c] = static_cast<int16_t>(b);
      // Every code point here is below 0x800: one or two UTF-8 bytes.
      if (c < 0x80) {
        utf8[b] = std::string(1, static_cast<char>(c));
      } else {
        utf8[b] = {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
      }
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

}  // namespace

std::string byte_to_unicode(uint8_t b) { return alphabet().utf8[b]; }

std::string bytes_to_unicode(std::string_view bytes) {
  const ByteAlphabet& a = alphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) out += a.utf8[b];
  return out;
}

bool unicode_to_bytes(std::string_view s, std::string* bytes) {
  const ByteAlphabet& a = alphabet();
  bytes->clear();
  for (size_t pos = 0; pos < s.size();) {
    size_t len = 0;
    const uint32_t c = decode_utf8(s, pos, &len);
    if (c >= a.byte_of.size() || a.byte_of[c] < 0) return false;
    bytes->push_back(static_cast<char>(a.byte_of[c]));
    pos += len;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer.

size_t next_pretoken(std::string_view text, size_t pos) {
  const size_t n = text.size();
  // 's|'t|'re|'ve|'m|'ll|'d (lowercase ASCII only, as in the pattern).
  if (text[pos] == '\'' && pos + 1 < n) {
    const char a = text[pos + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
    if (pos + 2 < n) {
      const char b = text[pos + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        return pos + 3;
      }
    }
  }
  size_t len = 0;
  const CharClass k0 = char_class(decode_utf8(text, pos, &len));
  //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ : an optional single ' ' joins the run after it.
  if (text[pos] == ' ' && pos + 1 < n) {
    size_t len1 = 0;
    const CharClass k1 = char_class(decode_utf8(text, pos + 1, &len1));
    if (k1 != CharClass::kSpace) return class_run_end(text, pos + 1 + len1, k1);
  } else if (k0 != CharClass::kSpace) {
    return class_run_end(text, pos + len, k0);
  }
  // \s+(?!\S) | \s+ : a whitespace run, minus its last character when a non-space follows and
  // the run is longer than one (that character then leads the next pre-token, e.g. " word").
  size_t last = pos;
  size_t end = pos + len;
  while (end < n) {
    size_t l = 0;
    if (char_class(decode_utf8(text, end, &l)) != CharClass::kSpace) break;
    last = end;
    end += l;
  }
  if (end == n || last == pos) return end;
  return last;
}

std::vector<std::string_view> pretokenize(std::string_view text) {
  std::vector<std::string_view> out;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = next_pretoken(text, pos);
    out.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return out;
}

namespace {

// The case-insensitive letters of (?i:'s|'t|...): ASCII upper case, and U+017F (long s), whose
// simple case folding is 's' (Oniguruma matches it).
uint32_t fold_contraction_letter(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + ('a' - 'A');
  return c == 0x17F ? 's' : c;
}

bool is_cr_lf(uint32_t c) { return c == '\r' || c == '\n'; }

}  // namespace

size_t next_pretoken_llama3(std::string_view text, size_t pos, int max_digits) {
  const size_t n = text.size();
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (text[pos] == '\'' && pos + 1 < n) {
    size_t l1 = 0;
    const uint32_t a = fold_contraction_letter(decode_utf8(text, pos + 1, &l1));
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 1 + l1;
    if (pos + 1 + l1 < n) {
      size_t l2 = 0;
      const uint32_t b = fold_contraction_letter(decode_utf8(text, pos + 1 + l1, &l2));
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        return pos + 1 + l1 + l2;
      }
    }
  }
  size_t len = 0;
  const uint32_t c0 = decode_utf8(text, pos, &len);
  const CharClass k0 = char_class(c0);
  // [^\r\n\p{L}\p{N}]?\p{L}+ : a letter run, with one leading character of any other kind.
  if (k0 == CharClass::kLetter) return class_run_end(text, pos + len, CharClass::kLetter);
  if (k0 != CharClass::kNumber && !is_cr_lf(c0) && pos + len < n) {
    size_t l1 = 0;
    if (char_class(decode_utf8(text, pos + len, &l1)) == CharClass::kLetter) {
      return class_run_end(text, pos + len + l1, CharClass::kLetter);
    }
  }
  // \p{N}{1,max_digits}
  if (k0 == CharClass::kNumber) {
    size_t end = pos + len;
    for (int d = 1; d < max_digits && end < n; ++d) {
      size_t l = 0;
      if (char_class(decode_utf8(text, end, &l)) != CharClass::kNumber) break;
      end += l;
    }
    return end;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t start = pos;
  if (c0 == ' ' && pos + 1 < n) {
    size_t l1 = 0;
    if (char_class(decode_utf8(text, pos + 1, &l1)) == CharClass::kOther) start = pos + 1;
  }
  {
    size_t l = 0;
    if (char_class(decode_utf8(text, start, &l)) == CharClass::kOther) {
      size_t end = class_run_end(text, start, CharClass::kOther);
      while (end < n && (text[end] == '\r' || text[end] == '\n')) ++end;
      return end;
    }
  }
  // Here text[pos] starts a whitespace run W = [pos, end).
  size_t end = pos;
  size_t last = pos;      // start of W's last character
  size_t after_crlf = 0;  // end of W's last CR or LF, 0 when none
  while (end < n) {
    size_t l = 0;
    const uint32_t c = decode_utf8(text, end, &l);
    if (char_class(c) != CharClass::kSpace) break;
    last = end;
    end += l;
    if (is_cr_lf(c)) after_crlf = end;
  }
  // \s*[\r\n]+ : up to W's last line break.
  if (after_crlf > 0) return after_crlf;
  // \s+(?!\S) | \s+ : all of W at the end of the text or when it is one character, else W
  // but its last character (which then leads the next pre-token).
  if (end == n || last == pos) return end;
  return last;
}

// ---------------------------------------------------------------------------------------------
// Lookup structures.

namespace {

inline uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

// (left id, right id) -> (rank, merged id) in an open-addressing table: the encoder's inner loop
// is one lookup per adjacent pair, where std::unordered_map's node chasing would dominate.
struct BpeTokenizer::MergeTable {
  static constexpr uint64_t kEmpty = ~0ull;
  std::vector<uint64_t> keys;
  std::vector<int32_t> ranks;
  std::vector<int32_t> merged;
  uint64_t mask = 0;
  int shift = 64;
  std::unordered_map<std::string, int32_t> id_of;  // token bytes -> id

  void build(const std::vector<std::pair<int32_t, int32_t>>& merges,
             const std::vector<int32_t>& merged_ids) {
    uint64_t cap = 16;
    int bits = 4;
    while (cap < merges.size() * 2 + 16) {
      cap *= 2;
      ++bits;
    }
    keys.assign(cap, kEmpty);
    ranks.assign(cap, 0);
    merged.assign(cap, 0);
    mask = cap - 1;
    shift = 64 - bits;
    for (size_t r = 0; r < merges.size(); ++r) {
      const uint64_t key = pair_key(merges[r].first, merges[r].second);
      uint64_t slot = hash(key);
      while (keys[slot] != kEmpty && keys[slot] != key) slot = (slot + 1) & mask;
      if (keys[slot] == key) continue;  // a repeated merge keeps its first (lowest) rank
      keys[slot] = key;
      ranks[slot] = static_cast<int32_t>(r);
      merged[slot] = merged_ids[r];
    }
  }
  uint64_t hash(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> shift; }
  bool find(int32_t left, int32_t right, int32_t* rank, int32_t* id) const {
    const uint64_t key = pair_key(left, right);
    for (uint64_t slot = hash(key);; slot = (slot + 1) & mask) {
      if (keys[slot] == key) {
        *rank = ranks[slot];
        *id = merged[slot];
        return true;
      }
      if (keys[slot] == kEmpty) return false;
    }
  }
};

BpeTokenizer::BpeTokenizer() : merge_table_(std::make_unique<MergeTable>()) {
  std::fill(std::begin(byte_id_), std::end(byte_id_), -1);
}
BpeTokenizer::~BpeTokenizer() = default;
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;

void BpeTokenizer::finish(const std::string& where, bool byte_level) {
  MergeTable& t = *merge_table_;
  t.id_of.clear();
  t.id_of.reserve(token_bytes_.size() * 2);
  for (size_t i = 0; i < token_bytes_.size(); ++i) {
    t.id_of.emplace(token_bytes_[i], static_cast<int32_t>(i));  // first id wins on duplicates
  }
  for (int b = 0; b < 256 && byte_level; ++b) {
    auto it = t.id_of.find(std::string(1, static_cast<char>(b)));
    MAMMOTH_CHECK(it != t.id_of.end())
        << "[bpe] " << where << ": the vocabulary has no token for byte " << b << " ('"
        << byte_to_unicode(static_cast<uint8_t>(b))
        << "'), so byte-level BPE cannot encode every text";
    byte_id_[b] = it->second;
  }
  std::vector<int32_t> merged_ids(merges_.size());
  for (size_t r = 0; r < merges_.size(); ++r) {
    const auto [l, rt] = merges_[r];
    auto it = t.id_of.find(token_bytes_[l] + token_bytes_[rt]);
    MAMMOTH_CHECK(it != t.id_of.end())
        << "[bpe] " << where << ": merge " << r << " ('" << bytes_to_unicode(token_bytes_[l])
        << "' '" << bytes_to_unicode(token_bytes_[rt]) << "') makes '"
        << bytes_to_unicode(token_bytes_[l] + token_bytes_[rt])
        << "', which is not in the vocabulary";
    merged_ids[r] = it->second;
  }
  t.build(merges_, merged_ids);
  auto eot = t.id_of.find(std::string(kEndOfText));
  eot_id_ = eot == t.id_of.end() ? -1 : eot->second;
}

const std::string& BpeTokenizer::token_bytes(int32_t id) const {
  MAMMOTH_CHECK(id >= 0 && id < vocab_size())
      << "[bpe] token id " << id << " is outside the vocabulary [0, " << vocab_size() << ")";
  return token_bytes_[id];
}

int32_t BpeTokenizer::token_id(std::string_view bytes) const {
  auto it = merge_table_->id_of.find(std::string(bytes));
  return it == merge_table_->id_of.end() ? -1 : it->second;
}

// ---------------------------------------------------------------------------------------------
// Encoding.

// Merges pre-tokens for one thread, remembering each distinct pre-token's result: natural text
// repeats a small set of words, so most pre-tokens cost one hash lookup.
class WordEncoder {
 public:
  explicit WordEncoder(const BpeTokenizer& tok) : tok_(tok), table_(*tok.merge_table_) {}

  void encode(std::string_view text, std::vector<int32_t>* out) {
    for (size_t pos = 0; pos < text.size();) {
      const size_t end = next_pretoken(text, pos);
      encode_word(text.substr(pos, end - pos), out);
      pos = end;
    }
  }

  // `word` must outlive this encoder (the cache keeps a view of it).
  void encode_word(std::string_view word, std::vector<int32_t>* out) {
    if (word.size() == 1) {
      out->push_back(tok_.byte_id_[static_cast<unsigned char>(word[0])]);
      return;
    }
    auto it = cache_.find(word);
    if (it == cache_.end()) {
      const uint32_t start = static_cast<uint32_t>(cached_ids_.size());
      merge_word(word);
      it = cache_
               .emplace(word,
                        std::make_pair(start, static_cast<uint32_t>(cached_ids_.size() - start)))
               .first;
    }
    const auto [start, count] = it->second;
    out->insert(out->end(), cached_ids_.begin() + start, cached_ids_.begin() + start + count);
  }

  // Merges the symbols in *ids in place.
  void merge(std::vector<int32_t>* ids) {
    if (ids->size() < 2) return;
    ids_.swap(*ids);
    merge_ids();
    ids->clear();
    for (int32_t i = 0; i >= 0; i = next_[i]) ids->push_back(ids_[i]);
  }

 private:
  struct Candidate {
    int32_t rank;
    int32_t pos;  // left symbol
    int32_t left;
    int32_t right;
    int32_t merged;
    // std heap functions keep the largest on top: invert so the lowest rank, then the leftmost
    // position, comes first (the order GPT-2 and Hugging Face apply merges in).
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };

  void push_candidate(int32_t pos) {
    const int32_t nx = next_[pos];
    if (nx < 0) return;
    Candidate c{0, pos, ids_[pos], ids_[nx], 0};
    if (!table_.find(c.left, c.right, &c.rank, &c.merged)) return;
    heap_.push_back(c);
    std::push_heap(heap_.begin(), heap_.end());
  }

  // Appends the merged ids of `word` to cached_ids_.
  void merge_word(std::string_view word) {
    const int32_t n = static_cast<int32_t>(word.size());
    ids_.resize(n);
    for (int32_t i = 0; i < n; ++i) ids_[i] = tok_.byte_id_[static_cast<unsigned char>(word[i])];
    merge_ids();
    for (int32_t i = 0; i >= 0; i = next_[i]) cached_ids_.push_back(ids_[i]);
  }

  // Merges ids_ (at least one symbol); the result is the list from 0 along next_.
  void merge_ids() {
    const int32_t n = static_cast<int32_t>(ids_.size());
    prev_.resize(n);
    next_.resize(n);
    for (int32_t i = 0; i < n; ++i) {
      prev_[i] = i - 1;
      next_[i] = i + 1 < n ? i + 1 : -1;
    }
    heap_.clear();
    for (int32_t i = 0; i + 1 < n; ++i) push_candidate(i);
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end());
      const Candidate c = heap_.back();
      heap_.pop_back();
      // Stale when either side has merged since: a merge changes the left id or kills the
      // right symbol (its id becomes -1), and ids never repeat at one position.
      const int32_t r = next_[c.pos];
      if (ids_[c.pos] != c.left || r < 0 || ids_[r] != c.right) continue;
      ids_[c.pos] = c.merged;
      ids_[r] = -1;
      next_[c.pos] = next_[r];
      if (next_[r] >= 0) prev_[next_[r]] = c.pos;
      if (prev_[c.pos] >= 0) push_candidate(prev_[c.pos]);
      push_candidate(c.pos);
    }
  }

  const BpeTokenizer& tok_;
  const BpeTokenizer::MergeTable& table_;
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache_;
  std::vector<int32_t> cached_ids_;
  std::vector<int32_t> ids_, prev_, next_;
  std::vector<Candidate> heap_;
};

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  WordEncoder(*this).encode(text, &out);
  return out;
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  MAMMOTH_CHECK(byte_id_[0] >= 0) << "[bpe] encode_word needs a byte-level vocabulary";
  if (!word.empty()) WordEncoder(*this).encode_word(word, out);
}

void BpeTokenizer::merge_symbols(std::vector<int32_t>* symbols) const {
  WordEncoder(*this).merge(symbols);
}

BpeTokenizer BpeTokenizer::from_tokens(std::vector<std::string> token_bytes,
                                       std::vector<std::pair<int32_t, int32_t>> merges,
                                       bool byte_level, const std::string& where) {
  BpeTokenizer tok;
  const int32_t n = static_cast<int32_t>(token_bytes.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto [l, rt] = merges[r];
    MAMMOTH_CHECK(l >= 0 && l < n && rt >= 0 && rt < n)
        << "[bpe] " << where << ": merge " << r << " names ids (" << l << ", " << rt
        << ") outside the vocabulary of " << n;
  }
  tok.token_bytes_ = std::move(token_bytes);
  tok.merges_ = std::move(merges);
  tok.finish(where, byte_level);
  return tok;
}

std::vector<std::vector<int32_t>> BpeTokenizer::encode_batch(
    const std::vector<std::string_view>& texts) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  parallel_for(0, static_cast<int64_t>(texts.size()), 1, [&](int64_t begin, int64_t end) {
    WordEncoder enc(*this);
    for (int64_t i = begin; i < end; ++i) enc.encode(texts[i], &out[i]);
  });
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_bytes(id);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Files.

namespace {

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  MAMMOTH_CHECK(in.good()) << "[bpe] cannot open " << what << " file '" << path << "'";
  std::ostringstream ss;
  ss << in.rdbuf();
  MAMMOTH_CHECK(!in.bad()) << "[bpe] error reading " << what << " file '" << path << "'";
  return ss.str();
}

}  // namespace

BpeTokenizer BpeTokenizer::load(const std::string& vocab_json_path,
                                const std::string& merges_txt_path) {
  BpeTokenizer tok;
  const json::Value vocab = json::parse(read_file(vocab_json_path, "vocab"), vocab_json_path);
  MAMMOTH_CHECK(vocab.is_object())
      << "[bpe] " << vocab_json_path << ": expected a JSON object mapping tokens to ids, got "
      << json::type_name(vocab.type());
  MAMMOTH_CHECK(!vocab.empty()) << "[bpe] " << vocab_json_path << ": the vocabulary is empty";
  const int64_t n = static_cast<int64_t>(vocab.size());
  tok.token_bytes_.assign(n, std::string());
  std::vector<bool> seen(n, false);
  for (const json::Value& member : vocab) {
    MAMMOTH_CHECK(member.is_int())
        << "[bpe] " << vocab_json_path << ": token '" << member.key() << "' has a non-integer id";
    const int64_t id = member.as_int();
    MAMMOTH_CHECK(id >= 0 && id < n && !seen[id])
        << "[bpe] " << vocab_json_path << ": token '" << member.key() << "' has id " << id
        << "; ids must be 0.." << n - 1 << ", each used once";
    seen[id] = true;
    // Tokens outside the byte alphabet (added special tokens with spaces, say) keep their text.
    if (!unicode_to_bytes(member.key(), &tok.token_bytes_[id])) tok.token_bytes_[id] = member.key();
  }

  const std::string merges = read_file(merges_txt_path, "merges");
  std::unordered_map<std::string, int32_t> id_of;
  for (int64_t i = 0; i < n; ++i) id_of.emplace(tok.token_bytes_[i], static_cast<int32_t>(i));
  std::istringstream lines(merges);
  std::string line, bytes;
  for (int line_no = 1; std::getline(lines, line); ++line_no) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    MAMMOTH_CHECK(space != std::string::npos && space > 0 && space + 1 < line.size() &&
                  line.find(' ', space + 1) == std::string::npos)
        << "[bpe] " << merges_txt_path << ":" << line_no
        << ": expected two tokens separated by one space, got '" << line << "'";
    int32_t side[2];
    for (int s = 0; s < 2; ++s) {
      const std::string part = s == 0 ? line.substr(0, space) : line.substr(space + 1);
      if (!unicode_to_bytes(part, &bytes)) bytes = part;
      auto it = id_of.find(bytes);
      MAMMOTH_CHECK(it != id_of.end()) << "[bpe] " << merges_txt_path << ":" << line_no
                                       << ": token '" << part << "' is not in " << vocab_json_path;
      side[s] = it->second;
    }
    tok.merges_.emplace_back(side[0], side[1]);
  }
  tok.finish(merges_txt_path);
  return tok;
}

void BpeTokenizer::save(const std::string& vocab_json_path,
                        const std::string& merges_txt_path) const {
  json::Value vocab = json::Value::object();
  for (int32_t id = 0; id < vocab_size(); ++id) vocab.set(bytes_to_unicode(token_bytes_[id]), id);
  const std::string vocab_text = json::dump(vocab) + "\n";
  write_file_atomic(vocab_json_path, vocab_text.data(), vocab_text.size(), "bpe");
  std::string merges = "#version: 0.2\n";
  for (const auto& [l, r] : merges_) {
    merges += bytes_to_unicode(token_bytes_[l]);
    merges += ' ';
    merges += bytes_to_unicode(token_bytes_[r]);
    merges += '\n';
  }
  write_file_atomic(merges_txt_path, merges.data(), merges.size(), "bpe");
}

// ---------------------------------------------------------------------------------------------
// Training.

namespace {

// Incremental pair statistics: for every adjacent symbol pair, its frequency-weighted count and
// the words it may occur in (stale entries are tolerated and skipped), plus a lazy max-heap.
struct PairStats {
  struct Info {
    int64_t count = 0;
    std::vector<int32_t> words;
  };
  struct Entry {
    int64_t count;
    uint64_t key;
    // Highest count first; among equal counts the smallest (left, right) ids, for determinism.
    bool operator<(const Entry& o) const {
      return count != o.count ? count < o.count : key > o.key;
    }
  };
  std::unordered_map<uint64_t, Info> info;
  std::priority_queue<Entry> heap;
};

}  // namespace

BpeTokenizer BpeTokenizer::train(const std::vector<std::string>& texts, int vocab_size) {
  MAMMOTH_CHECK(vocab_size >= 257)
      << "[bpe::train] vocab_size " << vocab_size
      << " is too small: byte-level BPE needs 256 byte tokens plus " << kEndOfText;
  // Distinct pre-tokens with their counts; parallel over texts, then reduced in text order.
  const int64_t num_texts = static_cast<int64_t>(texts.size());
  const int64_t num_chunks = std::max<int64_t>(1, std::min<int64_t>(num_threads() * 4, num_texts));
  std::vector<std::unordered_map<std::string_view, int64_t>> partial(num_chunks);
  parallel_for(0, num_chunks, 1, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      for (int64_t t = c * num_texts / num_chunks; t < (c + 1) * num_texts / num_chunks; ++t) {
        const std::string_view text = texts[t];
        for (size_t pos = 0; pos < text.size();) {
          const size_t end = next_pretoken(text, pos);
          if (end - pos > 1) ++partial[c][text.substr(pos, end - pos)];  // 1 byte: nothing to merge
          pos = end;
        }
      }
    }
  });
  std::unordered_map<std::string_view, int64_t> counts = std::move(partial[0]);
  for (int64_t c = 1; c < num_chunks; ++c) {
    for (const auto& [w, k] : partial[c]) counts[w] += k;
    partial[c].clear();
  }

  std::vector<std::vector<int32_t>> words;
  std::vector<int64_t> freq;
  words.reserve(counts.size());
  freq.reserve(counts.size());
  for (const auto& [w, k] : counts) {
    std::vector<int32_t> symbols(w.size());
    for (size_t i = 0; i < w.size(); ++i) symbols[i] = static_cast<unsigned char>(w[i]);
    words.push_back(std::move(symbols));
    freq.push_back(k);
  }
  counts.clear();

  BpeTokenizer tok;
  std::unordered_map<std::string, int32_t> id_of;
  for (int b = 0; b < 256; ++b) {
    tok.token_bytes_.emplace_back(1, static_cast<char>(b));
    id_of.emplace(tok.token_bytes_.back(), b);
  }

  PairStats stats;
  for (int32_t w = 0; w < static_cast<int32_t>(words.size()); ++w) {
    const auto& s = words[w];
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      PairStats::Info& info = stats.info[pair_key(s[i], s[i + 1])];
      info.count += freq[w];
      if (info.words.empty() || info.words.back() != w) info.words.push_back(w);
    }
  }
  for (const auto& [key, info] : stats.info) stats.heap.push({info.count, key});

  std::vector<int32_t> merged_word;
  std::vector<uint64_t> grown;  // pairs that gained count in this merge
  while (static_cast<int>(tok.token_bytes_.size()) < vocab_size - 1 && !stats.heap.empty()) {
    const PairStats::Entry top = stats.heap.top();
    stats.heap.pop();
    auto found = stats.info.find(top.key);
    const int64_t current = found == stats.info.end() ? 0 : found->second.count;
    if (current != top.count) {  // stale: re-queue with the true count
      if (current > 0) stats.heap.push({current, top.key});
      continue;
    }
    if (current <= 0) break;
    const int32_t left = static_cast<int32_t>(top.key >> 32);
    const int32_t right = static_cast<int32_t>(top.key & 0xFFFFFFFFu);
    std::string merged_bytes = tok.token_bytes_[left] + tok.token_bytes_[right];
    int32_t merged;
    if (auto it = id_of.find(merged_bytes); it != id_of.end()) {
      merged = it->second;  // the same string reached by another split: reuse its id
    } else {
      merged = static_cast<int32_t>(tok.token_bytes_.size());
      id_of.emplace(merged_bytes, merged);
      tok.token_bytes_.push_back(std::move(merged_bytes));
    }
    tok.merges_.emplace_back(left, right);

    std::vector<int32_t> affected = std::move(found->second.words);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    grown.clear();
    for (int32_t w : affected) {
      std::vector<int32_t>& s = words[w];
      merged_word.clear();
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == left && s[i + 1] == right) {
          merged_word.push_back(merged);
          ++i;
        } else {
          merged_word.push_back(s[i]);
        }
      }
      if (merged_word.size() == s.size()) continue;  // stale entry: the pair left this word
      const int64_t f = freq[w];
      for (size_t i = 0; i + 1 < s.size(); ++i) stats.info[pair_key(s[i], s[i + 1])].count -= f;
      for (size_t i = 0; i + 1 < merged_word.size(); ++i) {
        const uint64_t key = pair_key(merged_word[i], merged_word[i + 1]);
        PairStats::Info& info = stats.info[key];
        info.count += f;
        if (merged_word[i] == merged || merged_word[i + 1] == merged) {
          if (info.words.empty() || info.words.back() != w) info.words.push_back(w);
          grown.push_back(key);
        }
      }
      s.swap(merged_word);
    }
    stats.info.erase(top.key);
    std::sort(grown.begin(), grown.end());
    grown.erase(std::unique(grown.begin(), grown.end()), grown.end());
    for (uint64_t key : grown) {
      auto it = stats.info.find(key);
      if (it != stats.info.end() && it->second.count > 0) stats.heap.push({it->second.count, key});
    }
  }
  tok.token_bytes_.emplace_back(kEndOfText);
  tok.finish("bpe::train");
  return tok;
}

}  // namespace mammoth::data
