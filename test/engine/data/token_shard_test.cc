// Tests for engine/data/token_shard: llm.c shards, multi-shard datasets, and their errors.
#include "engine/data/token_shard.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>

#include "base/error.h"
#include "test/testing/test_dir.h"

namespace mammoth::data {
namespace {

using mammoth::testing::TestDir;

std::vector<int32_t> iota_tokens(int n, int start) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = (start + i * 37) % 65536;
  return v;
}

TEST_CASE("a shard round-trips with llm.c's header") {
  TestDir dir;
  const std::vector<int32_t> tokens = {0, 1, 50256, 65535, 7};
  write_token_shard(dir.file("a.bin"), tokens);
  const std::string raw = testing::read_bytes(dir.file("a.bin"));
  REQUIRE(raw.size() == 1024 + 2 * tokens.size());
  int32_t header[256];
  std::memcpy(header, raw.data(), sizeof(header));
  CHECK(header[0] == 20240520);
  CHECK(header[1] == 1);
  CHECK(header[2] == 5);
  CHECK(std::all_of(header + 3, header + 256, [](int32_t x) { return x == 0; }));
  const TokenShard s = TokenShard::open(dir.file("a.bin"));
  REQUIRE(s.size() == 5);
  for (size_t i = 0; i < tokens.size(); ++i) CHECK(s.data()[i] == tokens[i]);
  CHECK(s.path() == dir.file("a.bin"));

  write_token_shard(dir.file("empty.bin"), std::vector<int32_t>{});
  CHECK(TokenShard::open(dir.file("empty.bin")).size() == 0);
}

TEST_CASE("uint32 shards: llm.c's Llama 3 header, ids above 65535 read back exactly") {
  TestDir dir;
  const std::vector<int32_t> tokens = {0, 65535, 65536, 128000, 128255, 7, INT32_MAX};
  write_token_shard(dir.file("wide.bin"), tokens);
  const std::string raw = testing::read_bytes(dir.file("wide.bin"));
  REQUIRE(raw.size() == 1024 + 4 * tokens.size());
  int32_t header[3];
  std::memcpy(header, raw.data(), sizeof(header));
  CHECK(header[0] == 20240801);
  CHECK(header[1] == 7);
  CHECK(header[2] == static_cast<int32_t>(tokens.size()));
  const TokenShard s = TokenShard::open(dir.file("wide.bin"));
  CHECK(s.token_bytes() == 4);
  CHECK_THROWS_WITH(s.data(), Catch::Contains("uint32"));
  // A uint16 shard and a uint32 shard read as one stream.
  write_token_shard(dir.file("narrow.bin"), std::vector<int32_t>{1, 2, 3});
  CHECK(TokenShard::open(dir.file("narrow.bin")).token_bytes() == 2);
  const TokenDataset d = TokenDataset::open({dir.file("narrow.bin"), dir.file("wide.bin")});
  std::vector<int32_t> all(static_cast<size_t>(d.size()));
  d.read(0, d.size(), all.data());
  std::vector<int32_t> expect = {1, 2, 3};
  expect.insert(expect.end(), tokens.begin(), tokens.end());
  CHECK(all == expect);
  CHECK(d.at(6) == 128000u);
  // wide = true writes uint32 ids even when they would fit 16 bits.
  write_token_shard(dir.file("forced.bin"), std::vector<int32_t>{1, 2}, /*wide=*/true);
  CHECK(TokenShard::open(dir.file("forced.bin")).token_bytes() == 4);
  CHECK_THROWS_WITH(write_token_shard(dir.file("neg.bin"), std::vector<int32_t>{1, -2}),
                    Catch::Contains("position 1"));

  // Magic 20240520 with version 2 is read as uint32 ids too.
  std::string v2 = raw;
  const int32_t old_header[2] = {20240520, 2};
  std::memcpy(v2.data(), old_header, sizeof(old_header));
  dir.write("v2.bin", v2);
  CHECK(TokenShard::open(dir.file("v2.bin")).at(3) == 128000u);
  // A uint32 id above INT32_MAX is refused on read; other versions and truncation by name.
  std::string big = raw;
  const uint32_t huge = 0x80000000u;
  std::memcpy(big.data() + 1024, &huge, 4);
  dir.write("big.bin", big);
  std::vector<int32_t> one(1);
  CHECK_THROWS_WITH(TokenDataset::open(dir.file("big.bin")).read(0, 1, one.data()),
                    Catch::Contains("too large"));
  std::string bad_version = raw;
  const int32_t v8 = 8;
  std::memcpy(bad_version.data() + 4, &v8, 4);
  dir.write("v8.bin", bad_version);
  CHECK_THROWS_WITH(TokenShard::open(dir.file("v8.bin")), Catch::Contains("version 8"));
  dir.write("short.bin", raw.substr(0, raw.size() - 2));
  CHECK_THROWS_WITH(TokenShard::open(dir.file("short.bin")), Catch::Contains("truncated"));
}

TEST_CASE("Megatron .bin/.idx pairs read through TokenDataset, beside llm.c shards") {
  TestDir dir;
  // int32 elements, ids above 65535, documents of several sequences and an empty sequence.
  IndexedDatasetWriter w(dir.file("mega"), IndexedDType::kI32);
  const std::vector<std::vector<int32_t>> seqs = {
      {5, 6, 7}, {}, {70000, 1}, {128255}, {2, 3, 4, 9}};
  std::vector<int32_t> all;
  for (size_t i = 0; i < seqs.size(); ++i) {
    w.add_sequence(seqs[i]);
    if (i % 2 == 1) w.end_document();
    all.insert(all.end(), seqs[i].begin(), seqs[i].end());
  }
  w.finalize();
  for (const std::string& spec : {dir.file("mega"), dir.file("mega.bin"), dir.file("mega.idx")}) {
    CHECK(megatron_prefix(spec) == dir.file("mega"));
    const TokenDataset d = TokenDataset::open(spec);
    REQUIRE(d.size() == static_cast<int64_t>(all.size()));
    std::vector<int32_t> got(all.size());
    d.read(0, d.size(), got.data());
    CHECK(got == all);
    for (int64_t start = 0; start < d.size(); ++start) {  // windows crossing sequences
      const int64_t n = std::min<int64_t>(3, d.size() - start);
      std::vector<int32_t> part(n);
      d.read(start, n, part.data());
      CHECK(std::equal(part.begin(), part.end(), all.begin() + start));
      CHECK(d.at(start) == static_cast<uint32_t>(all[start]));
    }
  }
  CHECK(megatron_prefix(dir.file("nothing")).empty());
  // A directory with a Megatron pair and an llm.c shard: both, in name order ("a.bin" first).
  write_token_shard(dir.file("a.bin"), std::vector<int32_t>{11, 12});
  const TokenDataset both = TokenDataset::open(dir.path());
  REQUIRE(both.num_shards() == 2);
  std::vector<int32_t> got(static_cast<size_t>(both.size()));
  both.read(0, both.size(), got.data());
  std::vector<int32_t> expect = {11, 12};
  expect.insert(expect.end(), all.begin(), all.end());
  CHECK(got == expect);
  // Negative elements are not token ids.
  IndexedDatasetWriter neg(dir.file("neg"), IndexedDType::kI32);
  neg.add_document({1, -5});
  neg.finalize();
  std::vector<int32_t> two(2);
  CHECK_THROWS_WITH(TokenDataset::open(dir.file("neg")).read(0, 2, two.data()),
                    Catch::Contains("-5"));
}

TEST_CASE("a dataset reads several shards as one stream") {
  TestDir dir;
  std::vector<int32_t> all;
  const int sizes[] = {10, 0, 25, 3};
  for (int k = 0; k < 4; ++k) {
    const auto t = iota_tokens(sizes[k], 1000 * k);
    all.insert(all.end(), t.begin(), t.end());
    write_token_shard(dir.file("train_00000" + std::to_string(k) + ".bin"), t);
  }
  dir.write("notes.txt", "not a shard");
  for (const std::string& spec : {dir.path(), dir.file("train_*.bin")}) {
    const TokenDataset d = TokenDataset::open(spec);
    REQUIRE(d.num_shards() == 4);
    REQUIRE(d.size() == static_cast<int64_t>(all.size()));
    for (int64_t i = 0; i < d.size(); ++i) CHECK(static_cast<int32_t>(d.at(i)) == all[i]);
    // Windows that cross the empty shard and several boundaries.
    for (int64_t start : {0, 5, 9, 10, 30}) {
      const int64_t n = std::min<int64_t>(8, d.size() - start);
      std::vector<int32_t> out(n);
      d.read(start, n, out.data());
      CHECK(std::equal(out.begin(), out.end(), all.begin() + start));
    }
    std::vector<int32_t> whole(all.size());
    d.read(0, d.size(), whole.data());
    CHECK(whole == all);
    std::vector<int32_t> one(1);
    CHECK_THROWS_AS(d.read(d.size() - 2, 3, one.data()), Error);
    CHECK_THROWS_AS(d.at(-1), Error);
  }
  CHECK(TokenDataset::open(dir.file("train_000002.bin")).size() == 25);
}

TEST_CASE("bad shards are errors naming the file") {
  TestDir dir;
  write_token_shard(dir.file("good.bin"), iota_tokens(100, 3));
  const std::string good = testing::read_bytes(dir.file("good.bin"));

  CHECK_THROWS_WITH(TokenShard::open(dir.file("missing.bin")), Catch::Contains("missing.bin"));
  std::string bad_magic = good;
  bad_magic[0] = 1;
  dir.write("magic.bin", bad_magic);
  CHECK_THROWS_WITH(TokenShard::open(dir.file("magic.bin")),
                    Catch::Contains("magic.bin") && Catch::Contains("magic"));
  std::string bad_version = good;
  bad_version[4] = 3;
  dir.write("version.bin", bad_version);
  CHECK_THROWS_WITH(TokenShard::open(dir.file("version.bin")), Catch::Contains("version 3"));
  dir.write("truncated.bin", good.substr(0, good.size() - 1));
  CHECK_THROWS_WITH(TokenShard::open(dir.file("truncated.bin")),
                    Catch::Contains("truncated.bin") && Catch::Contains("truncated"));
  dir.write("short.bin", good.substr(0, 100));
  CHECK_THROWS_WITH(TokenShard::open(dir.file("short.bin")), Catch::Contains("header"));
  dir.write("long.bin", good + "xx");
  CHECK_THROWS_WITH(TokenShard::open(dir.file("long.bin")), Catch::Contains("trailing"));

  CHECK_THROWS_WITH(TokenDataset::open(dir.file("nothing_*.bin")), Catch::Contains("nothing_"));
  TestDir empty;
  CHECK_THROWS_WITH(TokenDataset::open(empty.path()), Catch::Contains("no *.bin"));
  // An id above 65535 makes the shard uint32 rather than failing.
  write_token_shard(dir.file("big.bin"), std::vector<int32_t>{1, 65536});
  CHECK(TokenShard::open(dir.file("big.bin")).at(1) == 65536u);
  CHECK_THROWS_AS(write_token_shard(dir.file("neg.bin"), std::vector<int32_t>{-1}), Error);
}

}  // namespace
}  // namespace mammoth::data
