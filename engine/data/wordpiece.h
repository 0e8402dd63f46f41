// BERT's WordPiece tokenizer from a Hugging Face directory's vocab.txt, encoding as
// transformers' BertTokenizer does: clean the text (control characters dropped, whitespace as
// spaces), split on whitespace and punctuation, lower-case when tokenizer_config.json's
// do_lower_case is true (its default), then greedy longest-match-first pieces with "##"
// continuations, a word without a full cover (or over 100 characters) becoming [UNK].
//
// Text is ASCII only: BertTokenizer's accent stripping and CJK splitting need Unicode tables
// this reader does not carry, so any byte >= 0x80 is refused (the error names where it is),
// never encoded differently. A tokenizer_config.json key that changes the encoding and is not
// honoured here (never_split, a tokenizer_class other than Bert*) is refused by name.
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
  void wordpiece(const std::string& word, std::vector<int32_t>* out) const;

  std::string dir_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
  bool lower_ = true;
  int32_t cls_ = -1, sep_ = -1, pad_ = -1, unk_ = -1;
};

}  // namespace mammoth::data
