// thread_scratch: per-thread, per-slot, 64-byte aligned buffers that grow and are reused.
#include "base/scratch.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <thread>

namespace mammoth {
namespace {

bool aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

TEST_CASE("thread_scratch is 64-byte aligned, reused while big enough, grown when not") {
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{63}, size_t{4096}, size_t{3} << 20}) {
    INFO("bytes " << bytes);
    void* p = thread_scratch(ScratchSlot::kRowBuffer, bytes);
    REQUIRE(p != nullptr);
    CHECK(aligned64(p));
    std::memset(p, 0x5a, bytes);  // the whole size is usable
  }
  // A smaller or equal request reuses the buffer (no allocation, no page faults each call).
  float* big = thread_scratch<float>(ScratchSlot::kRowBuffer, int64_t{1} << 18);
  big[0] = 7.0f;
  CHECK(thread_scratch<float>(ScratchSlot::kRowBuffer, 100) == big);
  CHECK(thread_scratch<float>(ScratchSlot::kRowBuffer, int64_t{1} << 18)[0] == 7.0f);
}

TEST_CASE("thread_scratch slots and threads never share memory") {
  char* a = static_cast<char*>(thread_scratch(ScratchSlot::kAttentionA, 1 << 16));
  char* b = static_cast<char*>(thread_scratch(ScratchSlot::kAttentionB, 1 << 16));
  CHECK((a + (1 << 16) <= b || b + (1 << 16) <= a));
  void* other = nullptr;
  std::thread t([&] {
    other = thread_scratch(ScratchSlot::kAttentionA, 1 << 16);
    std::memset(other, 1, 1 << 16);
  });
  t.join();
  CHECK(other != a);
  std::memset(a, 2, 1 << 16);
  CHECK(a[(1 << 16) - 1] == 2);
}

}  // namespace
}  // namespace mammoth
