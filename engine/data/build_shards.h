// Text files -> GPT-2 BPE token shards: the library behind `mammoth data`.
//
// Every input file is read as UTF-8 text; "<|endoftext|>" inside a file separates documents.
// Each document is encoded with <|endoftext|> in front of it (llm.c's convention, so a model
// learns where documents begin), the documents are concatenated in file order, and the last
// val_fraction of that token stream becomes the validation split. Output in out_dir:
//   vocab.json, merges.txt                 the tokenizer (trained here or copied from the inputs)
//   train_000000.bin, train_000001.bin ... llm.c token shards of at most shard_tokens each
//   val_000000.bin ...
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
  // Vocabulary size when training a tokenizer (at most 65536: shards hold uint16 ids).
  int vocab_size = 4096;
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
};

BuildShardsResult build_shards(const BuildShardsOptions& options);

// The positional form: empty vocab_json means train a tokenizer of vocab_size.
BuildShardsResult build_shards(const std::vector<std::string>& text_files,
                               const std::string& out_dir, int vocab_size,
                               const std::string& vocab_json, const std::string& merges_txt,
                               double val_fraction);

}  // namespace mammoth::data
