// Tests for engine/data/sampler: window layout, seeded epoch orders, dp shares, validation
// split, and resuming from a saved position.
#include "engine/data/sampler.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <set>

#include "base/error.h"
#include "test/testing/test_dir.h"

namespace mammoth::data {
namespace {

TEST_CASE("uniform_below is unbiased") {
  uint64_t state = 42;
  const int n = 7, draws = 70000;
  std::vector<int> counts(n, 0);
  for (int i = 0; i < draws; ++i) {
    const uint64_t v = uniform_below(&state, n);
    REQUIRE(v < static_cast<uint64_t>(n));
    ++counts[v];
  }
  double chi2 = 0;
  for (int c : counts) chi2 += (c - draws / n) * (c - draws / n) / double(draws / n);
  CHECK(chi2 < 22.5);  // 6 degrees of freedom, p = 0.001
  // A bound that is not a power of two near 2^63 exercises the rejection path.
  const uint64_t big = (uint64_t{1} << 63) + 12345;
  for (int i = 0; i < 1000; ++i) REQUIRE(uniform_below(&state, big) < big);
}

TEST_CASE("windows, split and epoch orders") {
  WindowSampler s(1001, 10, /*seed=*/5, /*val_fraction=*/0.1);
  CHECK(s.num_windows() == 100);
  CHECK(s.num_val_windows() == 10);
  CHECK(s.num_train_windows() == 90);
  CHECK(s.window_start(3) == 30);

  const std::vector<int64_t> e0 = s.epoch_order(0);
  const std::vector<int64_t> e1 = s.epoch_order(1);
  std::vector<int64_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> expect(90);
  std::iota(expect.begin(), expect.end(), 0);
  CHECK(sorted == expect);  // a permutation of the training windows only
  CHECK(e0 != e1);
  CHECK(e0 != expect);
  WindowSampler same(1001, 10, 5, 0.1);
  CHECK(same.epoch_order(1) == e1);  // order depends only on (seed, epoch)
  CHECK(same.epoch_order(0) == e0);
  WindowSampler other(1001, 10, 6, 0.1);
  CHECK(other.epoch_order(0) != e0);
  WindowSampler plain(1001, 10, 5, 0.1, /*shuffle=*/false);
  CHECK(plain.epoch_order(3) == expect);

  CHECK_THROWS_AS(WindowSampler(10, 10, 0), Error);  // 10 tokens: no window of 11
  CHECK_NOTHROW(WindowSampler(11, 10, 0));
  CHECK_THROWS_AS(WindowSampler(1001, 10, 0, 1.0), Error);
  CHECK_THROWS_AS(WindowSampler(1001, 0, 0), Error);
}

TEST_CASE("shuffles are uniform over positions") {
  // Each window should land in each position about equally often across epochs.
  WindowSampler s(6 * 4 + 1, 4, 11);
  REQUIRE(s.num_train_windows() == 6);
  std::vector<std::vector<int>> counts(6, std::vector<int>(6, 0));
  const int epochs = 6000;
  for (int e = 0; e < epochs; ++e) {
    const auto& order = s.epoch_order(e);
    for (int p = 0; p < 6; ++p) ++counts[p][order[p]];
  }
  for (int p = 0; p < 6; ++p)
    for (int w = 0; w < 6; ++w) CHECK(std::abs(counts[p][w] - epochs / 6) < 150);
}

TEST_CASE("dp shares partition the global batch, across epoch boundaries") {
  WindowSampler s(10 * 8 + 1, 8, 3);  // 10 training windows
  const int64_t global = 4;
  std::vector<int64_t> stream;
  for (int64_t step = 0; step < 10; ++step) {
    std::vector<int64_t> whole = s.batch_indices(step, global, 0, 1);
    std::vector<int64_t> joined;
    for (int r = 0; r < 2; ++r) {
      const auto part = s.batch_indices(step, global, r, 2);
      REQUIRE(part.size() == 2);
      joined.insert(joined.end(), part.begin(), part.end());
    }
    CHECK(joined == whole);
    stream.insert(stream.end(), whole.begin(), whole.end());
  }
  // 40 positions = 4 epochs; each epoch's 10 windows are all distinct, and epoch k is
  // epoch_order(k), even where a batch straddles two epochs (steps 2, 7).
  for (int e = 0; e < 4; ++e) {
    std::vector<int64_t> part(stream.begin() + 10 * e, stream.begin() + 10 * (e + 1));
    CHECK(part == s.epoch_order(e));
    CHECK(std::set<int64_t>(part.begin(), part.end()).size() == 10);
  }
  // The epoch of each window read, also for dp shares: stream position / 10.
  for (int64_t step = 0; step < 10; ++step) {
    std::vector<int64_t> joined;
    for (int r = 0; r < 2; ++r) {
      const auto part = s.batch_epochs(step, global, r, 2);
      joined.insert(joined.end(), part.begin(), part.end());
    }
    for (int64_t k = 0; k < global; ++k) CHECK(joined[k] == (step * global + k) / 10);
    CHECK(joined == s.batch_epochs(step, global));
  }
  CHECK_THROWS_AS(s.batch_indices(0, 5, 0, 2), Error);  // 5 is not a multiple of 2
  CHECK_THROWS_AS(s.batch_indices(0, 4, 2, 2), Error);
}

TEST_CASE("saving and restoring the position resumes the same stream") {
  WindowSampler a(37 * 16 + 1, 16, 99, 0.05);
  const int64_t global = 6;
  std::vector<std::vector<int64_t>> first;
  for (int i = 0; i < 25; ++i) first.push_back(a.next_batch(global));
  for (int i = 0; i < 25; ++i) CHECK(first[i] == a.batch_indices(i, global));

  WindowSampler b(37 * 16 + 1, 16, 99, 0.05);
  for (int i = 0; i < 9; ++i) b.next_batch(global);
  const SamplerState saved = b.state();
  CHECK(saved == b.state_after(9, global));
  CHECK(saved.epoch == 9 * global / b.num_train_windows());
  WindowSampler c(37 * 16 + 1, 16, 99, 0.05);
  c.set_state(saved);
  for (int i = 9; i < 25; ++i) CHECK(c.next_batch(global) == first[i]);
  CHECK_THROWS_AS(c.set_state({0, c.num_train_windows()}), Error);
}

TEST_CASE("validation batches read held-out windows in order") {
  WindowSampler s(100 * 4 + 1, 4, 1, 0.1);  // windows 90..99 are validation
  CHECK(s.val_batch_indices(0, 4) == std::vector<int64_t>{90, 91, 92, 93});
  CHECK(s.val_batch_indices(2, 4, 1, 2) == std::vector<int64_t>{90, 91});  // wraps: 98,99,90,91
  for (int64_t step = 0; step < 50; ++step)
    for (int64_t w : s.batch_indices(step, 4)) CHECK(w < 90);
  WindowSampler none(100 * 4 + 1, 4, 1);
  CHECK_THROWS_AS(none.val_batch_indices(0, 4), Error);
}

TEST_CASE("read_window gives inputs and next-token targets") {
  mammoth::testing::TestDir dir;
  std::vector<int32_t> tokens(50);
  std::iota(tokens.begin(), tokens.end(), 100);
  write_token_shard(dir.file("a.bin"), std::vector<int32_t>(tokens.begin(), tokens.begin() + 23));
  write_token_shard(dir.file("b.bin"), std::vector<int32_t>(tokens.begin() + 23, tokens.end()));
  const TokenDataset data = TokenDataset::open(dir.path());
  WindowSampler s(data.size(), 8, 0);
  REQUIRE(s.num_windows() == 6);
  std::vector<int32_t> in(8), tgt(8);
  read_window(data, s, 2, in.data(), tgt.data());  // tokens 16..24, across the shard boundary
  for (int i = 0; i < 8; ++i) {
    CHECK(in[i] == 116 + i);
    CHECK(tgt[i] == 117 + i);
  }
  CHECK_THROWS_AS(read_window(data, s, 6, in.data(), tgt.data()), Error);
}

}  // namespace
}  // namespace mammoth::data
