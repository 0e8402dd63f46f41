#include "memory/cuda/pinned_allocator.h"

#include <algorithm>

#include "base/error.h"
#include "memory/cuda/cuda_check.h"

namespace mammoth::memory::cuda {
namespace {
constexpr size_t kPinnedRound = 4096;
}

void PinnedHostAllocator::process_events() {
  std::vector<std::pair<void*, Block>> still;
  for (auto& [ptr, b] : pending_) {
    bool done = true;
    for (cudaEvent_t e : b.events) {
      const cudaError_t rc = cudaEventQuery(e);
      if (rc == cudaErrorNotReady) {
        done = false;
        break;
      }
      CUDA_CHECK(rc);
    }
    if (!done) {
      still.emplace_back(ptr, std::move(b));
      continue;
    }
    for (cudaEvent_t e : b.events) CUDA_CHECK(cudaEventDestroy(e));
    free_.emplace(b.size, ptr);
  }
  pending_.swap(still);
}

void* PinnedHostAllocator::allocate(size_t nbytes) {
  const size_t size =
      std::max<size_t>(kPinnedRound, (nbytes + kPinnedRound - 1) / kPinnedRound * kPinnedRound);
  std::lock_guard<std::mutex> lock(mu_);
  process_events();
  void* p = nullptr;
  size_t got = size;
  auto it = free_.lower_bound(size);
  if (it != free_.end() && it->first <= 2 * size) {
    got = it->first;
    p = it->second;
    free_.erase(it);
  } else {
    CUDA_CHECK(cudaHostAlloc(&p, size, cudaHostAllocPortable));
    reserved_ += static_cast<int64_t>(size);
  }
  Block b;
  b.size = got;
  live_.emplace(p, std::move(b));
  allocated_ += static_cast<int64_t>(got);
  peak_ = std::max(peak_, allocated_);
  ++num_allocs_;
  return p;
}

void PinnedHostAllocator::record_stream(void* ptr, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  MAMMOTH_CHECK(it != live_.end()) << "[pinned_allocator] record_stream of unknown pointer " << ptr;
  auto& s = it->second.streams;
  if (std::find(s.begin(), s.end(), stream) == s.end()) s.push_back(stream);
}

void PinnedHostAllocator::deallocate(void* ptr, size_t /*nbytes*/) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  MAMMOTH_CHECK(it != live_.end()) << "[pinned_allocator] deallocate of unknown pointer " << ptr;
  Block b = std::move(it->second);
  live_.erase(it);
  allocated_ -= static_cast<int64_t>(b.size);
  if (b.streams.empty()) {
    free_.emplace(b.size, ptr);
    return;
  }
  for (cudaStream_t s : b.streams) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(e, s));
    b.events.push_back(e);
  }
  b.streams.clear();
  pending_.emplace_back(ptr, std::move(b));
}

AllocatorStats PinnedHostAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {allocated_, peak_, num_allocs_};
}

void PinnedHostAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = allocated_;
}

int64_t PinnedHostAllocator::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}

void PinnedHostAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  process_events();
  for (auto& [size, p] : free_) {
    CUDA_CHECK(cudaFreeHost(p));
    reserved_ -= static_cast<int64_t>(size);
  }
  free_.clear();
}

PinnedHostAllocator& pinned_allocator() {
  static PinnedHostAllocator* a = new PinnedHostAllocator;  // leaked: outlives static tensors
  return *a;
}

}  // namespace mammoth::memory::cuda
