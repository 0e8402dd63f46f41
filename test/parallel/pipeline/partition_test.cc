// Pipeline stage partitioning: the balanced cut is optimal (checked against every cut of small
// random cases), beats counting layers when the head is heavy, and bad sizes are errors.
#include "parallel/pipeline/partition.h"

#include <catch2/catch.hpp>
#include <functional>
#include <random>

#include "base/error.h"

using namespace mammoth;
namespace pl = parallel::pipeline;

namespace {

// The smallest bottleneck over every way to cut `cost` into `stages` non-empty runs.
double brute_force(const std::vector<double>& cost, double first, double last, int stages) {
  const int64_t L = static_cast<int64_t>(cost.size());
  double best = 1e300;
  pl::Partition p{0};
  std::function<void(int)> rec = [&](int s) {
    if (s == stages - 1) {
      p.push_back(L);
      best = std::min(best, pl::max_stage_cost(p, cost, first, last));
      p.pop_back();
      return;
    }
    for (int64_t cut = p.back() + 1; cut <= L - (stages - 1 - s); ++cut) {
      p.push_back(cut);
      rec(s + 1);
      p.pop_back();
    }
  };
  rec(0);
  return best;
}

}  // namespace

TEST_CASE("partition by count") {
  CHECK(pl::partition_by_count(8, 4) == pl::Partition{0, 2, 4, 6, 8});
  CHECK(pl::partition_by_count(7, 3) == pl::Partition{0, 3, 5, 7});
  CHECK(pl::partition_by_count(3, 3) == pl::Partition{0, 1, 2, 3});
  CHECK_THROWS_WITH(pl::partition_by_count(2, 3), Catch::Contains("2 layers cannot fill 3"));
}

TEST_CASE("the balanced partition is optimal on random small cases") {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.1, 3.0);
  for (int trial = 0; trial < 300; ++trial) {
    const int L = 1 + static_cast<int>(rng() % 9);
    const int S = 1 + static_cast<int>(rng() % std::min(L, 4));
    std::vector<double> cost(static_cast<size_t>(L));
    for (double& c : cost) c = u(rng);
    const double first = rng() % 2 ? u(rng) : 0.0, last = u(rng) * 3;
    const pl::Partition p = pl::balanced_partition(cost, first, last, S);
    INFO("trial " << trial << " L " << L << " S " << S);
    REQUIRE(p.size() == static_cast<size_t>(S) + 1);
    CHECK(p.front() == 0);
    CHECK(p.back() == L);
    for (int s = 0; s < S; ++s) CHECK(p[s] < p[s + 1]);  // every stage has a layer
    CHECK(pl::max_stage_cost(p, cost, first, last) ==
          Approx(brute_force(cost, first, last, S)).epsilon(1e-12));
  }
}

TEST_CASE("a heavy head moves layers off the last stage") {
  // GPT-2 small at T=1024: the LM head costs ~4.5 blocks.
  const std::vector<double> blocks(12, 1.0);
  const pl::Partition count = pl::partition_by_count(12, 4);
  const pl::Partition balanced = pl::balanced_partition(blocks, 0.0, 4.5, 4);
  CHECK(pl::max_stage_cost(count, blocks, 0.0, 4.5) == Approx(7.5));
  CHECK(pl::max_stage_cost(balanced, blocks, 0.0, 4.5) == Approx(5.5));
  CHECK(balanced.back() - balanced[3] == 1);  // the head's stage keeps one layer
  CHECK_THROWS_WITH(pl::balanced_partition(blocks, 0.0, 1.0, 13),
                    Catch::Contains("12 layers cannot fill 13"));
  CHECK_THROWS_WITH(pl::balanced_partition({1.0, -1.0}, 0.0, 0.0, 2),
                    Catch::Contains("negative cost"));
  CHECK_THROWS_WITH(pl::partition_is_balanced("even"), Catch::Contains("'even'"));
}
