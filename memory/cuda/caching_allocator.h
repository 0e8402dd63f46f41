// The caching device allocator: cudaMalloc is slow and synchronising, so freed blocks are kept
// and reused, as PyTorch's CUDACachingAllocator does.
//
// Requests are rounded to 512-byte size classes. Small requests (<= 1 MiB) are carved from
// 2 MiB segments, large ones from segments of 20 MiB (requests < 10 MiB) or the request rounded
// to 2 MiB; a block bigger than needed is split and the remainder stays free (small pool: when
// >= 512 B is left; large pool: when > 1 MiB is left, which bounds fragmentation). Free blocks
// sit in per-pool bins ordered by (stream, size, address): an allocation takes the best fit
// among blocks of its own stream, and freed neighbours in a segment merge again.
//
// Stream-aware reuse: a block belongs to the stream it was allocated on, and work queued on
// that stream is ordered, so the block can be reused by the same stream as soon as it is freed.
// If the block was also used on other streams (record_stream), deallocation records an event on
// each of them and the block returns to the bins only when all those events have completed.
//
// The caching logic talks to the device through DeviceMemoryBackend, so it is unit-tested on a
// machine without a GPU (test/memory/cuda) with host memory standing in for device memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "memory/allocator.h"

namespace mammoth::memory::cuda {

// What the caching logic needs from a device. Streams and events are opaque handles
// (cudaStream_t / cudaEvent_t for the CUDA backend).
class DeviceMemoryBackend {
 public:
  virtual ~DeviceMemoryBackend() = default;
  // nullptr when the device is out of memory; other failures throw.
  virtual void* raw_allocate(size_t nbytes) = 0;
  virtual void raw_free(void* ptr) = 0;
  virtual void* create_event() = 0;
  virtual void record_event(void* event, void* stream) = 0;
  virtual bool event_done(void* event) = 0;
  virtual void destroy_event(void* event) = 0;
  virtual void* current_stream() = 0;
  virtual int device_index() const = 0;
};

struct CachingAllocatorStats {
  int64_t allocated_bytes = 0;  // sum of the (rounded) sizes of live blocks
  int64_t peak_allocated_bytes = 0;
  int64_t requested_bytes = 0;  // sum of the sizes callers asked for (live)
  int64_t reserved_bytes = 0;   // device memory held in segments (live + cached)
  int64_t peak_reserved_bytes = 0;
  int64_t num_allocs = 0;
  int64_t num_cache_hits = 0;       // allocations served without a new segment
  int64_t num_device_allocs = 0;    // segments obtained from the device
  int64_t num_device_frees = 0;     // segments returned (empty_cache, out-of-memory retry)
  int64_t num_oom_retries = 0;      // times the cache was flushed to satisfy a request
  int64_t pending_free_blocks = 0;  // freed, waiting for other streams' events
};

class CachingAllocator final : public Allocator {
 public:
  static constexpr size_t kRound = 512;
  static constexpr size_t kSmallRequest = size_t{1} << 20;  // <= 1 MiB: small pool
  static constexpr size_t kSmallSegment = size_t{2} << 20;
  static constexpr size_t kLargeSegment = size_t{20} << 20;
  static constexpr size_t kMinLargeAlloc = size_t{10} << 20;  // below: a 20 MiB segment
  static constexpr size_t kRoundLarge = size_t{2} << 20;

  explicit CachingAllocator(std::unique_ptr<DeviceMemoryBackend> backend);
  ~CachingAllocator() override;

  // On the backend's current stream.
  void* allocate(size_t nbytes) override;
  void* allocate(size_t nbytes, void* stream);
  void deallocate(void* ptr, size_t nbytes) override;
  // `ptr` (from allocate) is also used by work on `stream`: its memory is not reused before
  // that work, queued up to the deallocation, has completed.
  void record_stream(void* ptr, void* stream);
  AllocatorStats stats() const override;
  CachingAllocatorStats detailed_stats() const;
  void reset_peak() override;
  // Returns every cached, wholly free segment to the device.
  void empty_cache();
  Device device() const override;
  bool owns(const void* ptr) const;

  static size_t round_size(size_t nbytes);

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;
    void* stream = nullptr;
    bool small = false;
    bool allocated = false;
    Block* prev = nullptr;  // neighbours in the same segment
    Block* next = nullptr;
    std::vector<void*> other_streams;
    int pending_events = 0;
  };
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Bin = std::set<Block*, BlockLess>;
  struct PendingEvent {
    void* event;
    Block* block;
  };

  Block* find_free(Bin& bin, size_t size, void* stream);
  Block* new_segment(size_t size, void* stream, bool small);
  void free_block(Block* block);  // back into its bin, merged with free neighbours
  void process_events();
  void release_cached_segments();
  void update_peaks();

  std::unique_ptr<DeviceMemoryBackend> backend_;
  mutable std::mutex mu_;
  Bin small_bin_, large_bin_;
  std::unordered_map<const void*, Block*> live_;
  std::vector<PendingEvent> pending_;
  CachingAllocatorStats stats_;
};

// The caching allocator of CUDA device `index` (created on first use). Throws when there is no
// such device.
CachingAllocator& device_allocator(int index);
// Frees the cached memory of every device allocator created so far.
void empty_cache();

// The allocator memory::allocator_for(Device::cuda(i)) returns: it routes to
// device_allocator(current device). Registered with memory::register_device_allocator when
// this library is linked (an explicit, documented singleton).
Allocator& cuda_allocator();

// A device buffer from the caching allocator on the current stream, freed at scope exit:
// scratch space for kernels (stream order makes immediate reuse safe).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t nbytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t size() const { return nbytes_; }

 private:
  void* ptr_ = nullptr;
  size_t nbytes_ = 0;
  int device_ = 0;
};

}  // namespace mammoth::memory::cuda
