// GPT-2 byte-level BPE: pre-tokenizer, encoder/decoder, trainer and the vocab.json/merges.txt
// files that Hugging Face `tokenizers`, tiktoken-converted and llm.c tooling read.
//
// Encoding works in three stages, exactly as GPT-2:
//   1. the text is split into pre-tokens by GPT-2's pattern
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (implemented by hand over UTF-8 in next_pretoken());
//   2. each pre-token starts as its UTF-8 bytes, one symbol per byte;
//   3. adjacent symbols are merged lowest merge rank first (leftmost first among equal ranks)
//      until no adjacent pair has a merge.
// vocab.json keys are token bytes written in GPT-2's byte-to-unicode alphabet (printable bytes
// stand for themselves, the rest are shifted to U+0100.., so a space is "Ġ"); merges.txt is a
// "#version" line followed by one "left right" pair per line in rank order.
//
// Usage:
//   auto tok = BpeTokenizer::train(texts, 1024);        // or BpeTokenizer::load(vocab, merges)
//   std::vector<int32_t> ids = tok.encode("Hello world");
//   std::string back = tok.decode(ids);                 // == "Hello world"
//   tok.save("vocab.json", "merges.txt");
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mammoth::data {

// The special token GPT-2 puts between documents; train() appends it as the last id.
inline constexpr std::string_view kEndOfText = "<|endoftext|>";

// Returns the end (exclusive byte offset) of the GPT-2 pre-token that starts at `pos`
// (pos < text.size()). Calling it repeatedly from 0 splits the whole text.
size_t next_pretoken(std::string_view text, size_t pos);

// Splits `text` into GPT-2 pre-tokens (views into `text`).
std::vector<std::string_view> pretokenize(std::string_view text);

// The pre-token at `pos` under the pattern of Llama 3's tokenizer.json Split pre-tokenizer
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// (max_digits 3), or Qwen2's, the same with \p{N} alone (max_digits 1).
size_t next_pretoken_llama3(std::string_view text, size_t pos, int max_digits);

// GPT-2's byte-to-unicode alphabet: the UTF-8 spelling of one byte, and of a byte string.
std::string byte_to_unicode(uint8_t b);
std::string bytes_to_unicode(std::string_view bytes);
// The inverse; returns false when `s` has a character outside the 256-character alphabet.
bool unicode_to_bytes(std::string_view s, std::string* bytes);

class BpeTokenizer {
 public:
  BpeTokenizer();
  ~BpeTokenizer();
  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  // Reads GPT-2's two files. Throws mammoth::Error naming the file (and line for merges.txt)
  // when a file is missing or malformed, a byte token is absent, or a merge names an unknown
  // token.
  static BpeTokenizer load(const std::string& vocab_json_path, const std::string& merges_txt_path);

  // Learns a byte-level BPE from `texts`: the 256 byte tokens (id = byte value), then merges of
  // the most frequent adjacent pair within pre-tokens (ties: smallest (left id, right id)), then
  // <|endoftext|>, for `vocab_size` ids in all. Stops early when no pair is left to merge.
  static BpeTokenizer train(const std::vector<std::string>& texts, int vocab_size);

  // Builds a tokenizer from token strings (token_bytes[id]) and merges given as id pairs in rank
  // order, as Hugging Face tokenizer.json holds them. byte_level: the 256 single bytes must be
  // tokens (encode() and encode_word() start from them); otherwise only merge_symbols() encodes.
  // Throws naming `where` when a merge makes a string that is not a token.
  static BpeTokenizer from_tokens(std::vector<std::string> token_bytes,
                                  std::vector<std::pair<int32_t, int32_t>> merges, bool byte_level,
                                  const std::string& where);

  // Writes vocab.json and merges.txt (each to a temporary name, then renamed).
  void save(const std::string& vocab_json_path, const std::string& merges_txt_path) const;

  // Encodes text as ordinary text: "<|endoftext|>" inside it is not treated as special.
  // Thread-safe; repeated pre-tokens are merged once per call.
  std::vector<int32_t> encode(std::string_view text) const;
  // Encodes many documents in parallel on the thread pool.
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string_view>& texts) const;

  // Byte-level BPE of one pre-token: its bytes merged; the ids are appended to `out`.
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;
  // Merges a word given as its initial symbol ids (any ids, e.g. characters and byte-fallback
  // tokens), lowest rank first and leftmost among equal ranks, in place.
  void merge_symbols(std::vector<int32_t>* symbols) const;

  // Concatenates the tokens' bytes. Throws on an id outside [0, vocab_size).
  std::string decode(const std::vector<int32_t>& ids) const;

  int vocab_size() const { return static_cast<int>(token_bytes_.size()); }
  int num_merges() const { return static_cast<int>(merges_.size()); }
  // Id of <|endoftext|>, or -1 when the vocabulary has none.
  int32_t eot_id() const { return eot_id_; }
  // The bytes of token `id`.
  const std::string& token_bytes(int32_t id) const;
  // The id of the token with exactly these bytes, or -1.
  int32_t token_id(std::string_view bytes) const;
  // The merges in rank order, as (left id, right id).
  const std::vector<std::pair<int32_t, int32_t>>& merges() const { return merges_; }

 private:
  struct MergeTable;
  friend class WordEncoder;

  // Builds the lookup structures from token_bytes_ and merges_.
  void finish(const std::string& where, bool byte_level = true);

  std::vector<std::string> token_bytes_;
  std::vector<std::pair<int32_t, int32_t>> merges_;
  int32_t byte_id_[256];
  int32_t eot_id_ = -1;
  std::unique_ptr<MergeTable> merge_table_;
};

}  // namespace mammoth::data
