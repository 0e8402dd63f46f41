// Page-locked host memory for fast, truly asynchronous host<->device copies (the host tier of
// the memory manager, staging buffers). cudaHostAlloc is expensive, so freed blocks are cached
// by size and reused (best fit, at most twice the request). A block used by an asynchronous
// copy must be record_stream()-ed: it is reused only after that stream's work has completed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "memory/allocator.h"

namespace mammoth::memory::cuda {

class PinnedHostAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  void record_stream(void* ptr, cudaStream_t stream);
  AllocatorStats stats() const override;
  void reset_peak() override;
  Device device() const override { return Device::cpu(); }
  int64_t reserved_bytes() const;
  void empty_cache();  // cudaFreeHost every cached block

 private:
  struct Block {
    size_t size = 0;
    std::vector<cudaEvent_t> events;  // recorded at deallocation on the record_stream streams
    std::vector<cudaStream_t> streams;
  };
  void process_events();

  mutable std::mutex mu_;
  std::unordered_map<void*, Block> live_;
  std::vector<std::pair<void*, Block>> pending_;
  std::multimap<size_t, void*> free_;
  int64_t allocated_ = 0, peak_ = 0, reserved_ = 0, num_allocs_ = 0;
};

// The process-wide pinned allocator (an explicit singleton).
PinnedHostAllocator& pinned_allocator();

}  // namespace mammoth::memory::cuda
