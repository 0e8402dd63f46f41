// Allocators: the only way Mammoth obtains memory for tensor storage.
//
// Tensors never call new[]/malloc/cudaMalloc. The engine asks allocator_for(device) for bytes;
// the CPU allocator returns 64-byte aligned blocks (cache lines, AVX-512 loads) and counts
// what it hands out so tests and the job can report allocated and peak bytes. Later tiers
// (pinned host, caching CUDA allocator, chunk manager) implement the same interface.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/device.h"

namespace mammoth::memory {

struct AllocatorStats {
  int64_t allocated_bytes = 0;  // live bytes handed out
  int64_t peak_bytes = 0;       // high-water mark of allocated_bytes since the last reset
  int64_t num_allocs = 0;       // calls to allocate()
  int64_t cached_bytes = 0;     // freed blocks kept for reuse (not in allocated_bytes)
  int64_t cache_hits = 0;       // allocations served from them
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns a block of at least nbytes (nbytes may be 0: then a valid unique pointer).
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  virtual Device device() const = 0;
};

// Host memory, 64-byte aligned, with statistics.
//
// Large blocks (>= kCacheMin, sizes rounded up to kCacheGranule, to a quarter of it below 1 MiB)
// are kept after free for reuse by an allocation of the same rounded size, up to cache_limit()
// bytes in all: glibc maps blocks this big freshly on every malloc (or trims them off its heap
// again), so a training step that allocates its logits, activations and weight gradients anew
// each time would otherwise take a page fault on every 4 KiB of them (~600 ms of a GPT-2 124M
// step; from 128 KiB up, 850 faults a step of llama-tiny under tp 2, BENCHMARKS.md). An
// allocation that fails empties the cache and retries.
//
// Blocks of kHugePage bytes or more are mapped at a 2 MiB boundary and advised for transparent
// huge pages (MADV_HUGEPAGE; Debian's default THP mode "madvise" gives huge pages only to such
// regions). On 4 KiB pages a sequential read stream here ran at half the speed it reaches on
// huge pages (16 vs 32-38 GB/s on one core, BENCHMARKS.md): every 4 KiB costs a TLB miss, a
// nested page walk under a VM, and a restart of the hardware prefetcher. MAMMOTH_CPU_HUGE_PAGES=0
// turns this off (read once, when the allocator is made).
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kCacheMin = size_t{128} << 10;
  static constexpr size_t kCacheGranule = size_t{64} << 10;
  static constexpr size_t kHugePage = size_t{2} << 20;
  CpuAllocator();
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  Device device() const override { return Device::cpu(); }
  // Frees every cached block.
  void release_cached();
  // Most bytes the cache keeps (default 2 GiB, or MAMMOTH_CPU_CACHE_MB); 0 disables it.
  int64_t cache_limit() const { return cache_limit_.load(); }
  void set_cache_limit(int64_t bytes);
  // Whether blocks of kHugePage bytes or more are mapped for huge pages.
  bool huge_pages() const { return huge_pages_; }

 private:
  bool huge(size_t size) const;
  void* fresh_block(size_t size);
  void free_block(void* p, size_t size);

  bool huge_pages_ = true;
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> num_allocs_{0};
  std::atomic<int64_t> cache_limit_{0};
  std::atomic<int64_t> cached_{0};
  std::atomic<int64_t> hits_{0};
  std::mutex cache_mu_;
  std::unordered_map<size_t, std::vector<void*>> cache_;  // rounded size -> free blocks
};

// The process-wide CPU allocator (an explicit singleton).
CpuAllocator& cpu_allocator();

// The allocator serving `device`; throws mammoth::Error when the backend is not available.
Allocator& allocator_for(Device device);

// The CUDA backend registers its allocator here at start-up (null to unregister).
void register_device_allocator(DeviceType type, Allocator* allocator);

}  // namespace mammoth::memory
