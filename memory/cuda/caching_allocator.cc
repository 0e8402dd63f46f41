// The device-independent caching logic; the CUDA backend lives in cuda_allocator.cc.
#include "memory/cuda/caching_allocator.h"

#include <algorithm>
#include <tuple>

#include "base/error.h"

namespace mammoth::memory::cuda {

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  return std::make_tuple(reinterpret_cast<uintptr_t>(a->stream), a->size,
                         reinterpret_cast<uintptr_t>(a->ptr)) <
         std::make_tuple(reinterpret_cast<uintptr_t>(b->stream), b->size,
                         reinterpret_cast<uintptr_t>(b->ptr));
}

CachingAllocator::CachingAllocator(std::unique_ptr<DeviceMemoryBackend> backend)
    : backend_(std::move(backend)) {
  MAMMOTH_CHECK(backend_ != nullptr) << "[caching_allocator] null backend";
}

CachingAllocator::~CachingAllocator() {
  // Process teardown: the device context may already be gone, so leave device memory to the
  // driver instead of calling into it; only host bookkeeping is freed.
  auto drop = [](Bin& bin) {
    for (Block* b : bin) delete b;
    bin.clear();
  };
  drop(small_bin_);
  drop(large_bin_);
  for (auto& [ptr, b] : live_) delete b;
  for (PendingEvent& p : pending_) {
    if (--p.block->pending_events == 0) delete p.block;
  }
}

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes < kRound) return kRound;
  return (nbytes + kRound - 1) / kRound * kRound;
}

Device CachingAllocator::device() const { return Device::cuda(backend_->device_index()); }

CachingAllocator::Block* CachingAllocator::find_free(Bin& bin, size_t size, void* stream) {
  Block key;
  key.stream = stream;
  key.size = size;
  key.ptr = nullptr;
  auto it = bin.lower_bound(&key);
  if (it == bin.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  bin.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t size, void* stream, bool small) {
  size_t seg = small
                   ? kSmallSegment
                   : (size < kMinLargeAlloc ? kLargeSegment
                                            : (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge);
  void* p = backend_->raw_allocate(seg);
  if (p == nullptr) {
    // Out of memory: wait for nothing, but give back every cached segment and try once more.
    ++stats_.num_oom_retries;
    release_cached_segments();
    p = backend_->raw_allocate(seg);
    if (p == nullptr && seg > size && !small) {
      seg = (size + kRoundLarge - 1) / kRoundLarge * kRoundLarge;  // no slack this time
      p = backend_->raw_allocate(seg);
    }
  }
  MAMMOTH_CHECK(p != nullptr) << "[cuda_allocator] out of memory on cuda:"
                              << backend_->device_index() << " allocating " << size
                              << " bytes (segment " << seg << "); allocated "
                              << stats_.allocated_bytes << ", reserved " << stats_.reserved_bytes
                              << ", peak allocated " << stats_.peak_allocated_bytes;
  ++stats_.num_device_allocs;
  stats_.reserved_bytes += static_cast<int64_t>(seg);
  auto* b = new Block;
  b->ptr = static_cast<char*>(p);
  b->size = seg;
  b->stream = stream;
  b->small = small;
  return b;
}

void* CachingAllocator::allocate(size_t nbytes) {
  return allocate(nbytes, backend_->current_stream());
}

void* CachingAllocator::allocate(size_t nbytes, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  process_events();
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallRequest;
  Bin& bin = small ? small_bin_ : large_bin_;
  Block* b = find_free(bin, size, stream);
  if (b != nullptr) {
    ++stats_.num_cache_hits;
  } else {
    b = new_segment(size, stream, small);
  }
  // Split off the tail when enough is left to be worth keeping.
  const size_t rest = b->size - size;
  if ((small && rest >= kRound) || (!small && rest > kSmallRequest)) {
    auto* tail = new Block;
    tail->ptr = b->ptr + size;
    tail->size = rest;
    tail->stream = stream;
    tail->small = small;
    tail->prev = b;
    tail->next = b->next;
    if (b->next != nullptr) b->next->prev = tail;
    b->next = tail;
    b->size = size;
    bin.insert(tail);
  }
  b->allocated = true;
  b->requested = nbytes;
  live_[b->ptr] = b;
  ++stats_.num_allocs;
  stats_.allocated_bytes += static_cast<int64_t>(b->size);
  stats_.requested_bytes += static_cast<int64_t>(nbytes);
  update_peaks();
  return b->ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t /*nbytes*/) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  MAMMOTH_CHECK(it != live_.end()) << "[cuda_allocator] deallocate of pointer " << ptr
                                   << " that this allocator (cuda:" << backend_->device_index()
                                   << ") did not hand out, or freed twice";
  Block* b = it->second;
  live_.erase(it);
  b->allocated = false;
  stats_.allocated_bytes -= static_cast<int64_t>(b->size);
  stats_.requested_bytes -= static_cast<int64_t>(b->requested);
  if (b->other_streams.empty()) {
    free_block(b);
    return;
  }
  for (void* s : b->other_streams) {
    void* ev = backend_->create_event();
    backend_->record_event(ev, s);
    pending_.push_back({ev, b});
    ++b->pending_events;
  }
  b->other_streams.clear();
  ++stats_.pending_free_blocks;
}

void CachingAllocator::record_stream(void* ptr, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  MAMMOTH_CHECK(it != live_.end()) << "[cuda_allocator] record_stream of unknown pointer " << ptr;
  Block* b = it->second;
  if (stream == b->stream) return;
  if (std::find(b->other_streams.begin(), b->other_streams.end(), stream) ==
      b->other_streams.end()) {
    b->other_streams.push_back(stream);
  }
}

void CachingAllocator::free_block(Block* b) {
  Bin& bin = b->small ? small_bin_ : large_bin_;
  if (b->prev != nullptr && !b->prev->allocated && b->prev->pending_events == 0) {
    Block* p = b->prev;
    bin.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr) b->next->prev = p;
    delete b;
    b = p;
  }
  if (b->next != nullptr && !b->next->allocated && b->next->pending_events == 0) {
    Block* n = b->next;
    bin.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr) n->next->prev = b;
    delete n;
  }
  bin.insert(b);
}

void CachingAllocator::process_events() {
  if (pending_.empty()) return;
  std::vector<PendingEvent> still;
  for (PendingEvent& p : pending_) {
    if (!backend_->event_done(p.event)) {
      still.push_back(p);
      continue;
    }
    backend_->destroy_event(p.event);
    if (--p.block->pending_events == 0) {
      --stats_.pending_free_blocks;
      free_block(p.block);
    }
  }
  pending_.swap(still);
}

void CachingAllocator::release_cached_segments() {
  for (Bin* bin : {&small_bin_, &large_bin_}) {
    for (auto it = bin->begin(); it != bin->end();) {
      Block* b = *it;
      if (b->prev == nullptr && b->next == nullptr) {  // a whole, free segment
        backend_->raw_free(b->ptr);
        stats_.reserved_bytes -= static_cast<int64_t>(b->size);
        ++stats_.num_device_frees;
        delete b;
        it = bin->erase(it);
      } else {
        ++it;
      }
    }
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  process_events();
  release_cached_segments();
}

void CachingAllocator::update_peaks() {
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {stats_.allocated_bytes, stats_.peak_allocated_bytes, stats_.num_allocs};
}

CachingAllocatorStats CachingAllocator::detailed_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

bool CachingAllocator::owns(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.count(ptr) != 0;
}

}  // namespace mammoth::memory::cuda
