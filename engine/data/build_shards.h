// Text files -> token shards: the library behind `mammoth data`.
//
// Every input file is read as UTF-8 text; "<|endoftext|>" inside a file separates documents.
// Each document is encoded with a separator token in front of it (llm.c's convention, so a
// model learns where documents begin): <|endoftext|> for a GPT-2 BPE; with a model directory's
// tokenizer (tokenizer_dir), its bos token, else its eos token; the document itself is encoded
// as `tokenizers` encodes it without special tokens added (added tokens in the text are
// matched). The documents are concatenated in file order, and the last val_fraction of that
// token stream becomes the validation split. Output in out_dir:
//   vocab.json, merges.txt                 the GPT-2 tokenizer (trained here or copied), or
//   tokenizer.json [tokenizer_config.json] the directory's tokenizer files, copied
//   train_000000.bin, train_000001.bin ... llm.c token shards of at most shard_tokens each:
//   val_000000.bin ...                     uint16 ids, or uint32 when the vocabulary is larger
//                                          than 65536 (token_shard.h)
// Progress goes to stderr.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mammoth::data {

struct BuildShardsOptions {
  // Input text files; empty means the embedded default corpus (corpus.h).
  std::vector<std::string> text_files;
  std::string out_dir;
  // Vocabulary size when training a tokenizer.
  int vocab_size = 4096;
  // A Hugging Face model (or tokenizer) directory whose tokenizer encodes the text
  // (data/tokenizer.h); excludes vocab_json/merges_txt.
  std::string tokenizer_dir;
  // An existing GPT-2 style tokenizer; both empty means train one on the inputs.
  std::string vocab_json;
  std::string merges_txt;
  // Fraction of the token stream (its end) written as validation shards.
  double val_fraction = 0.01;
  // Tokens per shard file.
  int64_t shard_tokens = 100'000'000;
  // Training reads at most this many bytes of text (the first documents), to bound its cost.
  int64_t train_max_bytes = int64_t{256} << 20;
  // false silences the progress lines.
  bool verbose = true;
};

struct BuildShardsResult {
  int vocab_size = 0;
  int64_t num_documents = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  std::vector<std::string> train_shards;
  std::vector<std::string> val_shards;
  std::string vocab_json;
  std::string merges_txt;
  // With tokenizer_dir: the copied tokenizer.json (or vocab.json), and the id between documents.
  std::string tokenizer_file;
  int32_t separator = -1;
  // 2 or 4: the width of the shards' ids.
  int token_bytes = 2;
};

BuildShardsResult build_shards(const BuildShardsOptions& options);

// The positional form: empty vocab_json means train a tokenizer of vocab_size.
BuildShardsResult build_shards(const std::vector<std::string>& text_files,
                               const std::string& out_dir, int vocab_size,
                               const std::string& vocab_json, const std::string& merges_txt,
                               double val_fraction);

}  // namespace mammoth::data
