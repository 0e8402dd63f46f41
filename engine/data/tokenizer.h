// The tokenizer of a Hugging Face model directory: `tokenizer.json` (as the `tokenizers` library
// writes it) or GPT-2's `vocab.json` + `merges.txt`, with bos/eos from `tokenizer_config.json`.
//
// Two families are read, each exactly as `tokenizers` 0.19 encodes and decodes them:
//   - byte-level BPE (GPT-2, Llama 3, Qwen2): the ByteLevel pre-tokenizer with GPT-2's pattern,
//     or a Split pre-tokenizer with Llama 3's pattern (digits in runs of up to three) or
//     Qwen2's (single digits) followed by ByteLevel without its regex; optional ignore_merges
//     and an NFC normalizer (Qwen2);
//   - SentencePiece-style BPE (Llama 2, Mistral): characters as symbols, `<0xNN>` byte tokens
//     for characters outside the vocabulary (byte_fallback), an unk token (fuse_unk), spaces
//     as "▁" through a Prepend/Replace normalizer or the Metaspace pre-tokenizer.
// added_tokens are matched in the text before the model (leftmost, longest first; lstrip and
// rstrip honoured); encode(..., true) adds what the TemplateProcessing post-processor adds;
// decode(..., true) drops tokens marked special. Everything else a tokenizer.json may hold (a
// model type, normalizer, pre-tokenizer, post-processor or decoder, a regex, a flag value,
// truncation, padding) is refused with an error naming it, so a file is never encoded
// differently from how `tokenizers` would.
//
//   Tokenizer tok = Tokenizer::from_directory("models/llama");
//   std::vector<int32_t> ids = tok.encode("Hello world", /*add_special_tokens=*/true);
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/true);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace mammoth::data {

class Tokenizer {
 public:
  // DIR/tokenizer.json, else DIR/vocab.json + DIR/merges.txt; DIR/tokenizer_config.json when
  // present. Throws naming the directory when it has neither.
  static Tokenizer from_directory(const std::string& dir);
  // One tokenizer.json; config_json ("" for none) is a tokenizer_config.json.
  static Tokenizer from_json_file(const std::string& tokenizer_json,
                                  const std::string& config_json = "");
  // GPT-2's two files; "<|endoftext|>" (when in the vocabulary) is the special bos/eos token.
  static Tokenizer from_bpe_files(const std::string& vocab_json, const std::string& merges_txt);

  // Token ids of `text`, as `tokenizers`' Tokenizer.encode(text, add_special_tokens).ids.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Many texts, in parallel on the thread pool.
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string_view>& texts,
                                                 bool add_special_tokens = false) const;
  // As Tokenizer.decode(ids, skip_special_tokens). Throws on an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // One more than the largest id (model vocabulary and added tokens).
  int vocab_size() const;
  // From tokenizer_config.json (bos_token, eos_token), else "<|endoftext|>" for both where the
  // vocabulary has it; -1 when unknown.
  int32_t bos_id() const;
  int32_t eos_id() const;
  // The id of a token by its spelling in tokenizer.json (added tokens first), or -1.
  int32_t token_to_id(std::string_view token) const;
  bool is_special(int32_t id) const;
  // Whether `id` is one of the <0xNN> tokens of a byte_fallback model (the decoder joins a run
  // of them into one piece of text, so a run's text is known only when it ends).
  bool is_byte_fallback(int32_t id) const;
  // e.g. "byte-level BPE (Llama 3 split), 128256 tokens, from DIR/tokenizer.json".
  std::string describe() const;

  struct Impl;  // defined in tokenizer.cc

 private:
  std::shared_ptr<const Impl> impl_;
};

}  // namespace mammoth::data
