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

#include "base/device.h"

namespace mammoth::memory {

struct AllocatorStats {
  int64_t allocated_bytes = 0;  // live bytes handed out
  int64_t peak_bytes = 0;       // high-water mark of allocated_bytes since the last reset
  int64_t num_allocs = 0;       // calls to allocate()
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
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  Device device() const override { return Device::cpu(); }

 private:
  std::atomic<int64_t> allocated_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> num_allocs_{0};
};

// The process-wide CPU allocator (an explicit singleton).
CpuAllocator& cpu_allocator();

// The allocator serving `device`; throws mammoth::Error when the backend is not available.
Allocator& allocator_for(Device device);

// The CUDA backend registers its allocator here at start-up (null to unregister).
void register_device_allocator(DeviceType type, Allocator* allocator);

}  // namespace mammoth::memory
