#include "engine/data/build_shards.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string_view>

#include "base/error.h"
#include "engine/data/bpe.h"
#include "engine/data/corpus.h"
#include "engine/data/token_shard.h"
#include "engine/data/tokenizer.h"

namespace mammoth::data {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MAMMOTH_CHECK(in.good()) << "[build_shards] cannot open text file '" << path << "'";
  std::ostringstream ss;
  ss << in.rdbuf();
  MAMMOTH_CHECK(!in.bad()) << "[build_shards] error reading '" << path << "'";
  return ss.str();
}

// Splits on <|endoftext|>, dropping empty pieces.
void split_documents(std::string_view text, std::vector<std::string_view>* docs) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(kEndOfText, pos);
    if (end == std::string_view::npos) end = text.size();
    if (end > pos) docs->push_back(text.substr(pos, end - pos));
    pos = end + kEndOfText.size();
  }
}

std::string shard_name(const std::string& dir, const char* split, int index) {
  char name[32];
  std::snprintf(name, sizeof(name), "%s_%06d.bin", split, index);
  return (std::filesystem::path(dir) / name).string();
}

std::vector<std::string> write_split(const std::string& dir, const char* split,
                                     const std::vector<int32_t>& tokens, int64_t begin, int64_t end,
                                     int64_t shard_tokens, bool wide, bool verbose) {
  std::vector<std::string> paths;
  for (int64_t pos = begin, k = 0; pos < end; pos += shard_tokens, ++k) {
    const int64_t n = std::min(shard_tokens, end - pos);
    paths.push_back(shard_name(dir, split, static_cast<int>(k)));
    write_token_shard(paths.back(),
                      std::vector<int32_t>(tokens.begin() + pos, tokens.begin() + pos + n), wide);
    if (verbose) std::cerr << "[data] wrote " << paths.back() << " (" << n << " tokens)\n";
  }
  return paths;
}

}  // namespace

BuildShardsResult build_shards(const BuildShardsOptions& o) {
  MAMMOTH_CHECK(!o.out_dir.empty()) << "[build_shards] no output directory given";
  MAMMOTH_CHECK(o.val_fraction >= 0.0 && o.val_fraction < 1.0)
      << "[build_shards] validation fraction " << o.val_fraction << " must be in [0, 1)";
  MAMMOTH_CHECK(o.shard_tokens >= 1 && o.shard_tokens <= INT32_MAX)
      << "[build_shards] shard size " << o.shard_tokens << " tokens must be in [1, 2^31)";
  MAMMOTH_CHECK(o.vocab_json.empty() == o.merges_txt.empty())
      << "[build_shards] give both vocab.json and merges.txt, or neither to train a tokenizer"
      << " (got vocab '" << o.vocab_json << "', merges '" << o.merges_txt << "')";
  MAMMOTH_CHECK(o.tokenizer_dir.empty() || o.vocab_json.empty())
      << "[build_shards] give a tokenizer directory ('" << o.tokenizer_dir
      << "') or vocab.json/merges.txt, not both";
  std::error_code ec;
  std::filesystem::create_directories(o.out_dir, ec);
  MAMMOTH_CHECK(!ec) << "[build_shards] cannot create output directory '" << o.out_dir
                     << "': " << ec.message();

  // Read everything first so a missing file fails before any work.
  const auto t_read = Clock::now();
  std::vector<std::string> texts;
  std::vector<std::string_view> docs;
  if (o.text_files.empty()) {
    texts = default_corpus_documents();
    for (const std::string& t : texts) docs.push_back(t);
  } else {
    texts.reserve(o.text_files.size());
    for (const std::string& f : o.text_files) texts.push_back(read_text(f));
    for (const std::string& t : texts) split_documents(t, &docs);
  }
  int64_t total_bytes = 0;
  for (std::string_view d : docs) total_bytes += static_cast<int64_t>(d.size());
  MAMMOTH_CHECK(!docs.empty()) << "[build_shards] the inputs contain no text";
  if (o.verbose) {
    std::cerr << "[data] read "
              << (o.text_files.empty() ? std::string("the default corpus")
                                       : std::to_string(o.text_files.size()) + " file(s)")
              << ": " << docs.size() << " documents, " << total_bytes / 1e6 << " MB in "
              << seconds_since(t_read) << " s\n";
  }

  BuildShardsResult r;
  r.num_documents = static_cast<int64_t>(docs.size());
  std::vector<int32_t> tokens;
  tokens.reserve(static_cast<size_t>(total_bytes / 3));
  // Encodes in batches of documents so progress shows.
  auto encode_all = [&](auto&& encode_batch) {
    const auto t_encode = Clock::now();
    const size_t batch_docs = 4096;
    int64_t done_bytes = 0;
    for (size_t b = 0; b < docs.size(); b += batch_docs) {
      const std::vector<std::string_view> batch(
          docs.begin() + b, docs.begin() + std::min(docs.size(), b + batch_docs));
      for (const std::vector<int32_t>& ids : encode_batch(batch)) {
        tokens.push_back(r.separator);
        tokens.insert(tokens.end(), ids.begin(), ids.end());
      }
      for (std::string_view d : batch) done_bytes += static_cast<int64_t>(d.size());
      if (o.verbose) {
        const double s = seconds_since(t_encode);
        std::cerr << "[data] tokenized " << done_bytes / 1e6 << " / " << total_bytes / 1e6
                  << " MB, " << tokens.size() << " tokens, " << (s > 0 ? done_bytes / 1e6 / s : 0)
                  << " MB/s\n";
      }
    }
  };

  if (!o.tokenizer_dir.empty()) {
    const Tokenizer tok = Tokenizer::from_directory(o.tokenizer_dir);
    if (o.verbose) std::cerr << "[data] tokenizer: " << tok.describe() << "\n";
    r.vocab_size = tok.vocab_size();
    r.separator = tok.bos_id() >= 0 ? tok.bos_id() : tok.eos_id();
    MAMMOTH_CHECK(r.separator >= 0)
        << "[build_shards] tokenizer " << o.tokenizer_dir
        << " has neither a bos nor an eos token (tokenizer_config.json bos_token / eos_token) "
           "to put between documents";
    namespace fs = std::filesystem;
    for (const char* name :
         {"tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"}) {
      const fs::path from = fs::path(o.tokenizer_dir) / name, to = fs::path(o.out_dir) / name;
      if (!fs::exists(from)) continue;
      if (r.tokenizer_file.empty()) r.tokenizer_file = to.string();
      std::error_code ec;
      if (fs::exists(to) && fs::equivalent(from, to)) continue;
      fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
      MAMMOTH_CHECK(!ec) << "[build_shards] cannot copy " << from << " to " << to << ": "
                         << ec.message();
    }
    encode_all([&](const std::vector<std::string_view>& batch) { return tok.encode_batch(batch); });
  } else {
    BpeTokenizer tok;
    if (o.vocab_json.empty()) {
      MAMMOTH_CHECK(o.vocab_size >= 257 && o.vocab_size <= (1 << 24))
          << "[build_shards] vocab size " << o.vocab_size << " must be in [257, 2^24]";
      const auto t_train = Clock::now();
      std::vector<std::string> sample;
      int64_t sample_bytes = 0;
      for (std::string_view d : docs) {
        if (sample_bytes >= o.train_max_bytes) break;
        sample.emplace_back(d);
        sample_bytes += static_cast<int64_t>(d.size());
      }
      if (o.verbose) {
        std::cerr << "[data] training a byte-level BPE of " << o.vocab_size << " tokens on "
                  << sample_bytes / 1e6 << " MB\n";
      }
      tok = BpeTokenizer::train(sample, o.vocab_size);
      if (o.verbose) {
        std::cerr << "[data] trained " << tok.vocab_size() << " tokens (" << tok.num_merges()
                  << " merges) in " << seconds_since(t_train) << " s\n";
      }
    } else {
      tok = BpeTokenizer::load(o.vocab_json, o.merges_txt);
      if (o.verbose) {
        std::cerr << "[data] loaded tokenizer " << o.vocab_json << " (" << tok.vocab_size()
                  << " tokens)\n";
      }
    }
    MAMMOTH_CHECK(tok.eot_id() >= 0)
        << "[build_shards] the tokenizer has no " << kEndOfText << " token to separate documents";
    r.vocab_size = tok.vocab_size();
    r.separator = tok.eot_id();
    r.vocab_json = (std::filesystem::path(o.out_dir) / "vocab.json").string();
    r.merges_txt = (std::filesystem::path(o.out_dir) / "merges.txt").string();
    r.tokenizer_file = r.vocab_json;
    tok.save(r.vocab_json, r.merges_txt);
    encode_all([&](const std::vector<std::string_view>& batch) { return tok.encode_batch(batch); });
  }
  const bool wide = r.vocab_size > 65536;
  r.token_bytes = wide ? 4 : 2;

  const int64_t total = static_cast<int64_t>(tokens.size());
  const int64_t num_val = static_cast<int64_t>(static_cast<double>(total) * o.val_fraction);
  r.train_tokens = total - num_val;
  r.val_tokens = num_val;
  r.train_shards =
      write_split(o.out_dir, "train", tokens, 0, r.train_tokens, o.shard_tokens, wide, o.verbose);
  r.val_shards =
      write_split(o.out_dir, "val", tokens, r.train_tokens, total, o.shard_tokens, wide, o.verbose);
  if (o.verbose) {
    std::cerr << "[data] done: " << r.train_tokens << " train and " << r.val_tokens
              << " validation tokens (" << (wide ? "uint32" : "uint16") << " ids), "
              << static_cast<double>(total_bytes) / std::max<int64_t>(1, total)
              << " bytes per token\n";
  }
  return r;
}

BuildShardsResult build_shards(const std::vector<std::string>& text_files,
                               const std::string& out_dir, int vocab_size,
                               const std::string& vocab_json, const std::string& merges_txt,
                               double val_fraction) {
  BuildShardsOptions o;
  o.text_files = text_files;
  o.out_dir = out_dir;
  o.vocab_size = vocab_size;
  o.vocab_json = vocab_json;
  o.merges_txt = merges_txt;
  o.val_fraction = val_fraction;
  return build_shards(o);
}

}  // namespace mammoth::data
