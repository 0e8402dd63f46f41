#include "base/scratch.h"

#include <cstdlib>

#include "base/error.h"

namespace mammoth {
namespace {

constexpr int kSlots = static_cast<int>(ScratchSlot::kCount);

struct Buffers {
  void* ptr[kSlots] = {};
  size_t cap[kSlots] = {};
  ~Buffers() {
    for (void* p : ptr) std::free(p);
  }
};

}  // namespace

void* thread_scratch(ScratchSlot slot, size_t bytes) {
  thread_local Buffers b;
  const int s = static_cast<int>(slot);
  if (b.cap[s] < bytes || b.ptr[s] == nullptr) {
    std::free(b.ptr[s]);
    b.ptr[s] = nullptr;
    b.cap[s] = 0;
    const size_t rounded = (bytes + 63) / 64 * 64 + 64;  // never a zero-byte allocation
    b.ptr[s] = std::aligned_alloc(64, rounded);
    MAMMOTH_CHECK(b.ptr[s] != nullptr)
        << "cannot allocate " << rounded << " bytes of kernel scratch (slot " << s << ")";
    b.cap[s] = rounded;
  }
  return b.ptr[s];
}

}  // namespace mammoth
