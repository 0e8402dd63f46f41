#include "tools/default_corpus.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "engine/data/bpe.h"
#include "models/family.h"

namespace mammoth::tools {
namespace {

std::string cache_dir() {
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : "/tmp") + "/.cache/mammoth";
}

}  // namespace

data::BuildShardsResult default_corpus(int vocab_size) {
  const std::string dir = cache_dir() + "/default-corpus-v1-bpe" + std::to_string(vocab_size);
  const std::string train = dir + "/train_000000.bin", val = dir + "/val_000000.bin";
  data::BuildShardsResult r;
  if (std::filesystem::exists(train) && std::filesystem::exists(val)) {
    r.train_shards = {train};
    r.val_shards = {val};
    r.vocab_size = data::BpeTokenizer::load(dir + "/vocab.json", dir + "/merges.txt").vocab_size();
    return r;
  }
  std::fprintf(stderr, "[train] tokenizing the embedded corpus into %s (once)\n", dir.c_str());
  data::BuildShardsOptions o;
  o.out_dir = dir;
  o.vocab_size = vocab_size;
  o.val_fraction = 0.05;
  return data::build_shards(o);
}

models::ModelConfig on_default_corpus(models::ModelConfig config, int vocab_size) {
  config.vocab_size = corpus_model_vocab(
      models::family_spec(config.family).objective == models::Objective::kMaskedLm,
      default_corpus(vocab_size).vocab_size);
  return config;
}

}  // namespace mammoth::tools
