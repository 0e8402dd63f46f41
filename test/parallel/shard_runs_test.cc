// shard_flat_runs against shard_tensor: the runs of every rank's shard, applied to a full
// tensor's flat data, give exactly the shard's non-padding elements, cover every full element
// once over all ranks, and clip to any sub-range.
#include <catch2/catch.hpp>
#include <random>

#include "engine/ops.h"
#include "parallel/tensor_parallel/layers.h"

using namespace mammoth;
using engine::Tensor;

TEST_CASE("shard_flat_runs maps shards onto the full tensor") {
  std::mt19937 rng(3);
  struct Case {
    engine::Shape full;
    int64_t dim;
    int parts;
  };
  const std::vector<Case> cases = {{{10, 6}, 0, 1}, {{10, 6}, 1, 1},   {{9, 4}, 0, 3},
                                   {{7}, 0, 1},     {{3, 5, 4}, 1, 1}, {{12, 5}, 0, 3},
                                   {{5, 37}, 1, 1}, {{37, 5}, 0, 1}};
  for (const Case& c : cases) {
    for (int p : {1, 2, 3, 4}) {
      const parallel::ShardSpec spec =
          parallel::make_shard_spec(c.dim, c.full[static_cast<size_t>(c.dim)], c.parts, p);
      int64_t n = 1;
      for (int64_t d : c.full) n *= d;
      std::vector<double> values(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = static_cast<double>(i + 1);
      const Tensor full = Tensor::from_vector(values, c.full, DType::kF64);
      std::vector<int> hits(static_cast<size_t>(n), 0);
      for (int r = 0; r < p; ++r) {
        const Tensor shard = parallel::shard_tensor(full, spec, r, p);
        const std::vector<double> sv = shard.to_vector();
        const int64_t m = shard.numel();
        INFO("shape " << engine::shape_str(c.full) << " dim " << c.dim << " parts " << c.parts
                      << " p " << p << " rank " << r);
        int64_t covered = 0, last = -1;
        for (const auto& run : parallel::shard_flat_runs(spec, shard.shape(), r, p, 0, m)) {
          CHECK(run.local > last);  // shard order
          last = run.local;
          for (int64_t k = 0; k < run.length; ++k) {
            REQUIRE(run.global + k < n);
            CHECK(sv[static_cast<size_t>(run.local + k)] ==
                  values[static_cast<size_t>(run.global + k)]);
            ++hits[static_cast<size_t>(run.global + k)];
          }
          covered += run.length;
        }
        // Everything not covered is padding (zeros from shard_tensor).
        int64_t nonzero = 0;
        for (double v : sv) nonzero += v != 0;
        CHECK(covered == nonzero);
        // A random sub-range gives the runs clipped to it.
        const int64_t lo = m ? static_cast<int64_t>(rng() % static_cast<unsigned>(m + 1)) : 0;
        const int64_t hi =
            lo + (m > lo ? static_cast<int64_t>(rng() % static_cast<unsigned>(m - lo + 1)) : 0);
        for (const auto& run : parallel::shard_flat_runs(spec, shard.shape(), r, p, lo, hi)) {
          CHECK(run.local >= lo);
          CHECK(run.local + run.length <= hi);
          for (int64_t k = 0; k < run.length; ++k)
            CHECK(sv[static_cast<size_t>(run.local + k)] ==
                  values[static_cast<size_t>(run.global + k)]);
        }
      }
      for (int h : hits) CHECK(h == 1);  // every element once over the ranks
    }
  }
  CHECK_THROWS_WITH(
      parallel::shard_flat_runs(parallel::make_shard_spec(0, 4, 1, 2), {2, 3}, 0, 2, 0, 7),
      Catch::Contains("outside a shard of 6"));
}
