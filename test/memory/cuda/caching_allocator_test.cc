// The caching device allocator's logic (size classes, splitting, merging, stream-aware reuse,
// out-of-memory retry, statistics), tested without a GPU: host memory and hand-driven events
// stand in for the device through DeviceMemoryBackend.
#include "memory/cuda/caching_allocator.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>

#include "base/error.h"

namespace mammoth::memory::cuda {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

struct FakeEvent {
  bool done = false;
  void* stream = nullptr;
};

// Host memory with a budget; events complete only when the test says so.
class FakeBackend final : public DeviceMemoryBackend {
 public:
  explicit FakeBackend(size_t budget) : budget_(budget) {}
  ~FakeBackend() override {
    for (auto& [p, n] : live_) std::free(p);
  }
  void* raw_allocate(size_t n) override {
    if (used_ + n > budget_) return nullptr;
    void* p = std::aligned_alloc(512, n);
    live_[p] = n;
    used_ += n;
    return p;
  }
  void raw_free(void* p) override {
    used_ -= live_.at(p);
    live_.erase(p);
    std::free(p);
  }
  void* create_event() override { return new FakeEvent; }
  void record_event(void* e, void* stream) override {
    static_cast<FakeEvent*>(e)->stream = stream;
    events_.insert(static_cast<FakeEvent*>(e));
  }
  bool event_done(void* e) override { return static_cast<FakeEvent*>(e)->done; }
  void destroy_event(void* e) override {
    events_.erase(static_cast<FakeEvent*>(e));
    delete static_cast<FakeEvent*>(e);
  }
  void* current_stream() override { return stream_; }
  int device_index() const override { return 0; }

  // Completes every event recorded on `stream`.
  void finish(void* stream) {
    for (FakeEvent* e : events_) {
      if (e->stream == stream) e->done = true;
    }
  }
  size_t used() const { return used_; }
  void* stream_ = reinterpret_cast<void*>(0x1);

 private:
  size_t budget_, used_ = 0;
  std::map<void*, size_t> live_;
  std::set<FakeEvent*> events_;
};

void* const kS1 = reinterpret_cast<void*>(0x1);
void* const kS2 = reinterpret_cast<void*>(0x2);

struct Fixture {
  FakeBackend* backend;
  std::unique_ptr<CachingAllocator> alloc;
  explicit Fixture(size_t budget = 1024 * kMiB) {
    auto b = std::make_unique<FakeBackend>(budget);
    backend = b.get();
    alloc = std::make_unique<CachingAllocator>(std::move(b));
  }
};

TEST_CASE("sizes round up to 512-byte classes") {
  CHECK(CachingAllocator::round_size(0) == 512);
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(512) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
}

TEST_CASE("small blocks are split from one 2 MiB segment and merge again") {
  Fixture f;
  char* a = static_cast<char*>(f.alloc->allocate(1000));
  char* b = static_cast<char*>(f.alloc->allocate(1000));
  CHECK(b == a + 1024);
  auto s = f.alloc->detailed_stats();
  CHECK(s.num_device_allocs == 1);
  CHECK(s.reserved_bytes == static_cast<int64_t>(2 * kMiB));
  CHECK(s.allocated_bytes == 2048);
  CHECK(s.requested_bytes == 2000);
  f.alloc->deallocate(a, 1000);
  f.alloc->deallocate(b, 1000);
  // Merged back into one free 2 MiB block: a 1 MiB request starts at the segment's start.
  void* c = f.alloc->allocate(kMiB);
  CHECK(c == a);
  CHECK(f.alloc->detailed_stats().num_device_allocs == 1);
  f.alloc->deallocate(c, kMiB);
}

TEST_CASE("a freed block is reused by the same stream, not by another") {
  Fixture f;
  void* a = f.alloc->allocate(3000, kS1);
  f.alloc->deallocate(a, 3000);
  void* b = f.alloc->allocate(2900, kS1);
  CHECK(b == a);
  CHECK(f.alloc->detailed_stats().num_cache_hits >= 1);
  f.alloc->deallocate(b, 2900);
  void* c = f.alloc->allocate(2900, kS2);
  CHECK(c != a);
  CHECK(f.alloc->detailed_stats().num_device_allocs == 2);
  f.alloc->deallocate(c, 2900);
}

TEST_CASE("record_stream delays reuse until the other stream's work is done") {
  Fixture f;
  void* a = f.alloc->allocate(4096, kS1);
  f.alloc->record_stream(a, kS2);
  f.alloc->deallocate(a, 4096);
  CHECK(f.alloc->detailed_stats().pending_free_blocks == 1);
  void* b = f.alloc->allocate(4096, kS1);
  CHECK(b != a);  // still in use by stream 2
  f.backend->finish(kS2);
  void* c = f.alloc->allocate(4096, kS1);
  CHECK(c == a);
  CHECK(f.alloc->detailed_stats().pending_free_blocks == 0);
  f.alloc->deallocate(b, 4096);
  f.alloc->deallocate(c, 4096);
}

TEST_CASE("large requests: 20 MiB segments below 10 MiB, split when > 1 MiB remains") {
  Fixture f;
  char* a = static_cast<char*>(f.alloc->allocate(3 * kMiB));
  CHECK(f.alloc->detailed_stats().reserved_bytes == static_cast<int64_t>(20 * kMiB));
  char* b = static_cast<char*>(f.alloc->allocate(5 * kMiB));
  CHECK(b == a + 3 * kMiB);
  // 13 MiB does not fit the 12 MiB tail: its own segment, rounded to 2 MiB.
  char* c = static_cast<char*>(f.alloc->allocate(13 * kMiB + 1));
  CHECK(f.alloc->detailed_stats().reserved_bytes == static_cast<int64_t>(34 * kMiB));
  // 11 MiB does fit the tail (best fit among the stream's free blocks): no new segment.
  char* d = static_cast<char*>(f.alloc->allocate(11 * kMiB));
  CHECK(d == a + 8 * kMiB);
  CHECK(f.alloc->detailed_stats().reserved_bytes == static_cast<int64_t>(34 * kMiB));
  f.alloc->deallocate(d, 11 * kMiB);
  f.alloc->deallocate(a, 3 * kMiB);
  f.alloc->deallocate(b, 5 * kMiB);
  f.alloc->deallocate(c, 13 * kMiB + 1);
  CHECK(f.alloc->detailed_stats().allocated_bytes == 0);
  f.alloc->empty_cache();
  CHECK(f.alloc->detailed_stats().reserved_bytes == 0);
  CHECK(f.backend->used() == 0);
}

TEST_CASE("out of memory: the cache is flushed and the request retried, then a clear error") {
  Fixture f(40 * kMiB);
  void* a = f.alloc->allocate(15 * kMiB);  // a 16 MiB segment
  f.alloc->deallocate(a, 15 * kMiB);       // cached
  void* b = f.alloc->allocate(30 * kMiB);  // needs the cached 16 MiB back
  auto s = f.alloc->detailed_stats();
  CHECK(s.num_oom_retries == 1);
  CHECK(s.num_device_frees == 1);
  CHECK(s.reserved_bytes == static_cast<int64_t>(30 * kMiB));
  CHECK_THROWS_WITH(f.alloc->allocate(20 * kMiB), Catch::Contains("out of memory"));
  f.alloc->deallocate(b, 30 * kMiB);
}

TEST_CASE("peak statistics and bad frees") {
  Fixture f;
  void* a = f.alloc->allocate(kMiB);
  void* b = f.alloc->allocate(kMiB);
  f.alloc->deallocate(a, kMiB);
  CHECK(f.alloc->stats().peak_bytes == static_cast<int64_t>(2 * kMiB));
  CHECK(f.alloc->stats().allocated_bytes == static_cast<int64_t>(kMiB));
  f.alloc->reset_peak();
  CHECK(f.alloc->stats().peak_bytes == static_cast<int64_t>(kMiB));
  CHECK(f.alloc->stats().num_allocs == 2);
  CHECK_THROWS_WITH(f.alloc->deallocate(a, kMiB), Catch::Contains("freed twice"));
  f.alloc->deallocate(b, kMiB);
}

}  // namespace
}  // namespace mammoth::memory::cuda
