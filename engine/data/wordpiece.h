// BERT's WordPiece tokenizer from a Hugging Face directory's vocab.txt, encoding as
// transformers' BertTokenizer does: special tokens written in the text ([CLS], [SEP], [PAD],
// [UNK], [MASK]) are their ids, and the rest is: clean the text (control characters dropped,
// whitespace as spaces), CJK ideographs as words of their own, NFC, split on whitespace, lower-case
// (each character's str.lower()) and strip accents (NFD without Mn marks) when
// tokenizer_config.json's do_lower_case is true (its default) or strip_accents says so, split
// off punctuation (ASCII symbols and Unicode's P*), then greedy longest-match-first pieces with
// "##" continuations, a word without a full cover (or over 100 characters) becoming [UNK].
// The Unicode tables come from the Python that transformers runs on (unicode_class.h), so the
// ids are equal for any text, not just ASCII.
//
// Text must be valid UTF-8 (a Python str always is); other bytes are refused, naming where. A
// tokenizer_config.json key that changes the encoding and is not honoured here (never_split,
// do_basic_tokenize or do_split_on_punc false, a tokenizer_class other than Bert*) is refused
// by name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace mammoth::data {

class WordPiece {
 public:
  // DIR/vocab.txt (id = line number), DIR/tokenizer_config.json when present.
  static WordPiece from_directory(const std::string& dir);

  // The pieces' ids, without [CLS] / [SEP]. `where` names the text in errors ("row 3").
  std::vector<int32_t> encode(std::string_view text, const std::string& where = "text") const;

  int32_t token_to_id(const std::string& token) const;  // -1 when absent
  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  int32_t cls_id() const { return cls_; }
  int32_t sep_id() const { return sep_; }
  int32_t pad_id() const { return pad_; }
  int32_t unk_id() const { return unk_; }
  bool lower_case() const { return lower_; }
  std::string describe() const;

 private:
  void wordpiece(const std::vector<uint32_t>& chars, std::vector<int32_t>* out) const;
  // BasicTokenizer + WordpieceTokenizer on text without special tokens, at byte `offset`.
  void basic(std::string_view text, size_t offset, const std::string& where,
             std::vector<int32_t>* out) const;

  std::string dir_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
  bool lower_ = true;
  int strip_accents_ = -1;  // strip_accents: -1 unset (follows lower_), 0 false, 1 true
  bool chinese_ = true;     // tokenize_chinese_chars
  int32_t cls_ = -1, sep_ = -1, pad_ = -1, unk_ = -1, mask_ = -1;  // mask_: -1 when absent
};

}  // namespace mammoth::data
