// Tests for engine/data/build_shards: text files -> tokenizer + train/val llm.c shards.
#include "engine/data/build_shards.h"

#include <catch2/catch.hpp>
#include <filesystem>

#include "base/error.h"
#include "engine/data/bpe.h"
#include "engine/data/corpus.h"
#include "engine/data/token_shard.h"
#include "test/testing/test_dir.h"

namespace mammoth::data {
namespace {

using mammoth::testing::TestDir;

std::vector<int32_t> all_tokens(const std::vector<std::string>& shards) {
  std::vector<int32_t> out;
  for (const std::string& p : shards) {
    const TokenShard s = TokenShard::open(p);
    out.insert(out.end(), s.data(), s.data() + s.size());
  }
  return out;
}

TEST_CASE("build_shards trains a tokenizer and writes train/val shards") {
  TestDir in, out;
  const auto docs = default_corpus_documents(60000);
  std::string file_a, file_b;
  for (size_t i = 0; i < docs.size(); ++i) {
    std::string& f = i < docs.size() / 2 ? file_a : file_b;
    if (!f.empty()) f += std::string(kEndOfText);
    f += docs[i];
  }
  BuildShardsOptions o;
  o.text_files = {in.write("a.txt", file_a), in.write("b.txt", file_b)};
  o.out_dir = out.file("shards");
  o.vocab_size = 400;
  o.val_fraction = 0.1;
  o.shard_tokens = 4000;
  o.verbose = false;
  const BuildShardsResult r = build_shards(o);
  CHECK(r.vocab_size == 400);
  CHECK(r.num_documents == static_cast<int64_t>(docs.size()));
  CHECK(r.train_shards.size() > 1);  // split by shard_tokens
  CHECK(r.val_shards.size() >= 1);
  CHECK(std::filesystem::exists(o.out_dir + "/train_000000.bin"));
  CHECK(std::filesystem::exists(o.out_dir + "/val_000000.bin"));

  const std::vector<int32_t> train = all_tokens(r.train_shards), val = all_tokens(r.val_shards);
  CHECK(static_cast<int64_t>(train.size()) == r.train_tokens);
  CHECK(static_cast<int64_t>(val.size()) == r.val_tokens);
  const int64_t total = r.train_tokens + r.val_tokens;
  CHECK(r.val_tokens == static_cast<int64_t>(static_cast<double>(total) * 0.1));
  for (const std::string& p : r.train_shards) CHECK(TokenShard::open(p).size() <= 4000);

  // The stream is <|endoftext|> + document, for every document in order.
  const BpeTokenizer tok = BpeTokenizer::load(r.vocab_json, r.merges_txt);
  std::vector<int32_t> stream = train;
  stream.insert(stream.end(), val.begin(), val.end());
  std::string expect;
  for (const std::string& d : docs) expect += std::string(kEndOfText) + d;
  CHECK(tok.decode(stream) == expect);
  CHECK(stream[0] == tok.eot_id());
  CHECK(TokenDataset::open(o.out_dir + "/train_*.bin").size() == r.train_tokens);

  // Reusing the written tokenizer gives the same tokens.
  BuildShardsOptions again = o;
  again.out_dir = out.file("again");
  again.vocab_json = r.vocab_json;
  again.merges_txt = r.merges_txt;
  again.val_fraction = 0;
  const BuildShardsResult r2 = build_shards(again);
  CHECK(r2.val_tokens == 0);
  CHECK(r2.val_shards.empty());
  CHECK(all_tokens(r2.train_shards) == stream);
}

TEST_CASE("build_shards with no inputs uses the default corpus") {
  TestDir out;
  const BuildShardsResult r = build_shards({}, out.path(), 300, "", "", 0.05);
  CHECK(r.num_documents == static_cast<int64_t>(default_corpus_documents().size()));
  CHECK(r.train_tokens > 100000);
  CHECK(r.val_tokens > 0);
}

TEST_CASE("build_shards errors") {
  TestDir out;
  CHECK_THROWS_WITH(build_shards({out.file("missing.txt")}, out.path(), 300, "", "", 0.1),
                    Catch::Contains("missing.txt"));
  const std::string f = out.write("t.txt", "hello");
  CHECK_THROWS_WITH(build_shards({f}, out.path(), 300, out.file("v.json"), "", 0.1),
                    Catch::Contains("merges"));
  CHECK_THROWS_WITH(build_shards({f}, out.path(), 100, "", "", 0.1), Catch::Contains("257"));
  CHECK_THROWS_AS(build_shards({f}, out.path(), 300, "", "", 1.0), Error);
  const std::string empty = out.write("e.txt", "");
  CHECK_THROWS_WITH(build_shards({empty}, out.path(), 300, "", "", 0.1),
                    Catch::Contains("no text"));
}

}  // namespace
}  // namespace mammoth::data
