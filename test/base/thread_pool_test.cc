// Tests for base/thread_pool.h: parallel_for covers every index exactly once, respects the
// grain, runs nested calls serially, propagates exceptions and survives resizing.
#include "base/thread_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace {

// Runs parallel_for and returns the chunks it produced, sorted.
std::vector<std::pair<int64_t, int64_t>> chunks_of(int64_t begin, int64_t end, int64_t grain) {
  std::mutex m;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  mammoth::parallel_for(begin, end, grain, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(m);
    chunks.emplace_back(b, e);
  });
  std::sort(chunks.begin(), chunks.end());
  return chunks;
}

}  // namespace

TEST_CASE("parallel_for covers [begin, end) exactly once", "[thread_pool]") {
  mammoth::set_num_threads(4);
  REQUIRE(mammoth::num_threads() == 4);
  for (int64_t n : {0, 1, 3, 4, 5, 17, 1000, 100003}) {
    for (int64_t grain : {1, 7, 64, 1000000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n) + 10);
      mammoth::parallel_for(10, 10 + n, grain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i - 10)]++;
      });
      for (int64_t i = 0; i < n; ++i) {
        if (hits[static_cast<size_t>(i)] != 1) {
          FAIL("n=" << n << " grain=" << grain << ": index " << i << " hit " << hits[i].load());
        }
      }
      // Chunks tile the range without gaps or overlap.
      const auto chunks = chunks_of(10, 10 + n, grain);
      int64_t next = 10;
      for (const auto& [b, e] : chunks) {
        REQUIRE(b == next);
        REQUIRE(e > b);
        next = e;
      }
      REQUIRE(next == (n == 0 ? 10 : 10 + n));
    }
  }
}

TEST_CASE("parallel_for respects the grain and the thread count", "[thread_pool]") {
  mammoth::set_num_threads(4);
  // 100 items, grain 40: at most ceil(100 / 40) = 3 chunks.
  REQUIRE(chunks_of(0, 100, 40).size() <= 3);
  // Fewer items than the grain: one chunk, run on the caller.
  const auto caller = std::this_thread::get_id();
  std::thread::id ran_on;
  mammoth::parallel_for(0, 5, 10, [&](int64_t, int64_t) { ran_on = std::this_thread::get_id(); });
  REQUIRE(ran_on == caller);
  // Never more chunks than threads.
  REQUIRE(chunks_of(0, 1000, 1).size() <= 4);

  mammoth::set_num_threads(1);
  REQUIRE(mammoth::num_threads() == 1);
  REQUIRE(chunks_of(0, 1000, 1).size() == 1);
}

TEST_CASE("parallel_for uses several threads", "[thread_pool]") {
  mammoth::set_num_threads(4);
  std::mutex m;
  std::set<std::thread::id> ids;
  std::atomic<int> arrived{0};
  mammoth::parallel_for(0, 4, 1, [&](int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
    }
    // Hold each chunk until all four started (bounded wait): proves they run concurrently.
    arrived++;
    for (int spin = 0; spin < 2000 && arrived.load() < 4; ++spin) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  REQUIRE(ids.size() == 4);
}

TEST_CASE("nested parallel_for runs serially inside a chunk", "[thread_pool]") {
  mammoth::set_num_threads(4);
  REQUIRE_FALSE(mammoth::in_parallel_region());
  std::atomic<int64_t> total{0};
  std::atomic<int> nested_chunks{0};
  std::atomic<bool> saw_region{true};
  mammoth::parallel_for(0, 8, 1, [&](int64_t b, int64_t e) {
    if (!mammoth::in_parallel_region()) saw_region = false;
    for (int64_t i = b; i < e; ++i) {
      mammoth::parallel_for(0, 100, 1, [&](int64_t nb, int64_t ne) {
        nested_chunks++;
        total += ne - nb;
      });
    }
  });
  REQUIRE(saw_region);
  REQUIRE(total == 800);
  REQUIRE(nested_chunks == 8);  // each nested call is one serial chunk
  REQUIRE_FALSE(mammoth::in_parallel_region());
}

TEST_CASE("an exception in a chunk reaches the caller and the pool stays usable", "[thread_pool]") {
  mammoth::set_num_threads(3);
  REQUIRE_THROWS_WITH(mammoth::parallel_for(0, 300, 1,
                                            [](int64_t b, int64_t) {
                                              if (b > 0) throw std::runtime_error("chunk failed");
                                            }),
                      "chunk failed");
  int64_t sum = 0;
  std::mutex m;
  mammoth::parallel_for(0, 1000, 1, [&](int64_t b, int64_t e) {
    int64_t local = 0;
    for (int64_t i = b; i < e; ++i) local += i;
    std::lock_guard<std::mutex> lock(m);
    sum += local;
  });
  REQUIRE(sum == 999 * 1000 / 2);
}

TEST_CASE("set_num_threads(0) means hardware concurrency", "[thread_pool]") {
  mammoth::set_num_threads(0);
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  REQUIRE(mammoth::num_threads() == hw);
  mammoth::set_num_threads(2);
  REQUIRE(mammoth::num_threads() == 2);
}

TEST_CASE("start-up and resize never lose a job (regression: a worker missed the first job)") {
  // Each resize starts new workers; the first parallel_for after it must be picked up by them.
  for (int iter = 0; iter < 300; ++iter) {
    mammoth::set_num_threads(1 + iter % 3);
    std::atomic<int64_t> total{0};
    mammoth::parallel_for(0, 64, 1, [&](int64_t b, int64_t e) { total += e - b; });
    REQUIRE(total.load() == 64);
  }
  mammoth::set_num_threads(0);
}
