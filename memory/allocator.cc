#include "memory/allocator.h"

#include <cstdlib>
#include <new>

#include "base/error.h"

namespace mammoth::memory {

void* CpuAllocator::allocate(size_t nbytes) {
  const size_t rounded = (nbytes + kAlignment - 1) / kAlignment * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  MAMMOTH_CHECK(p != nullptr) << "[cpu_allocator] out of host memory allocating " << nbytes
                              << " bytes (currently allocated: " << allocated_.load() << ")";
  const int64_t now =
      allocated_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  num_allocs_.fetch_add(1);
  return p;
}

void CpuAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  std::free(ptr);
  allocated_.fetch_sub(static_cast<int64_t>(nbytes));
}

AllocatorStats CpuAllocator::stats() const {
  return {allocated_.load(), peak_.load(), num_allocs_.load()};
}

void CpuAllocator::reset_peak() { peak_.store(allocated_.load()); }

CpuAllocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

namespace {
Allocator*& cuda_slot() {
  static Allocator* a = nullptr;
  return a;
}
}  // namespace

void register_device_allocator(DeviceType type, Allocator* allocator) {
  MAMMOTH_CHECK(type == DeviceType::kCUDA) << "[allocator] only CUDA allocators are registered";
  cuda_slot() = allocator;
}

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  Allocator* a = cuda_slot();
  MAMMOTH_CHECK(a != nullptr) << "[allocator] no allocator for device " << device
                              << ": this build or machine has no CUDA backend";
  return *a;
}

}  // namespace mammoth::memory
