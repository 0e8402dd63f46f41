#include "memory/allocator.h"

#include <cstdlib>
#include <new>

#include "base/error.h"

namespace mammoth::memory {

namespace {

// The block size an allocation of nbytes gets: 64-byte multiples, large ones in cache granules.
size_t block_size(size_t nbytes) {
  const size_t rounded = nbytes == 0 ? CpuAllocator::kAlignment
                                     : (nbytes + CpuAllocator::kAlignment - 1) /
                                           CpuAllocator::kAlignment * CpuAllocator::kAlignment;
  if (rounded < CpuAllocator::kCacheMin) return rounded;
  return (rounded + CpuAllocator::kCacheGranule - 1) / CpuAllocator::kCacheGranule *
         CpuAllocator::kCacheGranule;
}

}  // namespace

CpuAllocator::CpuAllocator() {
  int64_t limit = int64_t{2} << 30;
  if (const char* env = std::getenv("MAMMOTH_CPU_CACHE_MB")) {
    char* end = nullptr;
    const long long mb = std::strtoll(env, &end, 10);
    if (end != env && *end == '\0' && mb >= 0) limit = static_cast<int64_t>(mb) << 20;
  }
  cache_limit_.store(limit);
}

void* CpuAllocator::allocate(size_t nbytes) {
  const size_t size = block_size(nbytes);
  void* p = nullptr;
  if (size >= kCacheMin) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    auto it = cache_.find(size);
    if (it != cache_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cached_.fetch_sub(static_cast<int64_t>(size));
      hits_.fetch_add(1);
    }
  }
  if (p == nullptr) p = std::aligned_alloc(kAlignment, size);
  if (p == nullptr && cached_.load() > 0) {
    release_cached();
    p = std::aligned_alloc(kAlignment, size);
  }
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
  allocated_.fetch_sub(static_cast<int64_t>(nbytes));
  const size_t size = block_size(nbytes);
  if (size >= kCacheMin && cached_.load() + static_cast<int64_t>(size) <= cache_limit_.load()) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    cache_[size].push_back(ptr);
    cached_.fetch_add(static_cast<int64_t>(size));
    return;
  }
  std::free(ptr);
}

void CpuAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(cache_mu_);
  for (auto& [size, blocks] : cache_) {
    for (void* p : blocks) std::free(p);
    cached_.fetch_sub(static_cast<int64_t>(size * blocks.size()));
  }
  cache_.clear();
}

void CpuAllocator::set_cache_limit(int64_t bytes) {
  MAMMOTH_CHECK(bytes >= 0) << "[cpu_allocator] cache limit must be >= 0, got " << bytes;
  cache_limit_.store(bytes);
  if (cached_.load() > bytes) release_cached();
}

AllocatorStats CpuAllocator::stats() const {
  return {allocated_.load(), peak_.load(), num_allocs_.load(), cached_.load(), hits_.load()};
}

void CpuAllocator::reset_peak() { peak_.store(allocated_.load()); }

CpuAllocator& cpu_allocator() {
  // Never destroyed: tensors freed by other statics' destructors at exit still find it.
  static CpuAllocator* a = new CpuAllocator;
  return *a;
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
