#include "memory/allocator.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "base/error.h"
#include "engine/profile/profile.h"

namespace mammoth::memory {

namespace {

// The block size an allocation of nbytes gets: 64-byte multiples, large ones in cache granules.
size_t block_size(size_t nbytes) {
  const size_t rounded = nbytes == 0 ? CpuAllocator::kAlignment
                                     : (nbytes + CpuAllocator::kAlignment - 1) /
                                           CpuAllocator::kAlignment * CpuAllocator::kAlignment;
  if (rounded < CpuAllocator::kCacheMin) return rounded;
  // Below 1 MiB a finer granule keeps the rounding within 1/8 of the block.
  const size_t granule =
      rounded < (size_t{1} << 20) ? CpuAllocator::kCacheGranule / 4 : CpuAllocator::kCacheGranule;
  return (rounded + granule - 1) / granule * granule;
}

// A fresh block of `size` bytes (a multiple of 4 KiB) at a 2 MiB boundary, advised for
// transparent huge pages; null when the kernel refuses the mapping. Maps size + 2 MiB and unmaps
// the misaligned head and the tail, so munmap(p, size) later returns exactly what is kept.
void* map_huge(size_t size) {
  const size_t len = size + CpuAllocator::kHugePage;
  void* raw = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start =
      (base + CpuAllocator::kHugePage - 1) / CpuAllocator::kHugePage * CpuAllocator::kHugePage;
  const size_t head = start - base;
  const size_t tail = len - head - size;
  if (head != 0) ::munmap(raw, head);
  if (tail != 0) ::munmap(reinterpret_cast<void*>(start + size), tail);
  // Advice only: where THP is off the block simply stays on 4 KiB pages.
  ::madvise(reinterpret_cast<void*>(start), size, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(start);
}

}  // namespace

CpuAllocator::CpuAllocator() {
  if (const char* env = std::getenv("MAMMOTH_CPU_HUGE_PAGES")) {
    huge_pages_ = std::strcmp(env, "0") != 0;
  }
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
  if (p == nullptr) p = fresh_block(size);
  if (p == nullptr && cached_.load() > 0) {
    release_cached();
    p = fresh_block(size);
  }
  MAMMOTH_CHECK(p != nullptr) << "[cpu_allocator] out of host memory allocating " << nbytes
                              << " bytes (currently allocated: " << allocated_.load() << ")";
  const int64_t now =
      allocated_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  num_allocs_.fetch_add(1);
  // The memory tracer (train --profile): every value allocated_bytes takes, so the trace's
  // maximum is the allocator's peak over the profiled steps.
  if (profile::on()) {
    profile::note_alloc(p, static_cast<int64_t>(nbytes));
    profile::counter("memory.cpu", now);
  }
  return p;
}

void CpuAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  const int64_t now =
      allocated_.fetch_sub(static_cast<int64_t>(nbytes)) - static_cast<int64_t>(nbytes);
  if (profile::on()) {
    profile::note_free(ptr, static_cast<int64_t>(nbytes));
    profile::counter("memory.cpu", now);
  }
  const size_t size = block_size(nbytes);
  if (size >= kCacheMin && cached_.load() + static_cast<int64_t>(size) <= cache_limit_.load()) {
    std::lock_guard<std::mutex> lock(cache_mu_);
    cache_[size].push_back(ptr);
    cached_.fetch_add(static_cast<int64_t>(size));
    return;
  }
  free_block(ptr, size);
}

bool CpuAllocator::huge(size_t size) const { return huge_pages_ && size >= kHugePage; }

void* CpuAllocator::fresh_block(size_t size) {
  return huge(size) ? map_huge(size) : std::aligned_alloc(kAlignment, size);
}

void CpuAllocator::free_block(void* p, size_t size) {
  if (huge(size)) {
    ::munmap(p, size);
  } else {
    std::free(p);
  }
}

void CpuAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(cache_mu_);
  for (auto& [size, blocks] : cache_) {
    for (void* p : blocks) free_block(p, size);
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
