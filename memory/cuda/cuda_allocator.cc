// The CUDA backend of the caching allocator, the per-device instances, and the allocator the
// engine reaches through memory::allocator_for(Device::cuda(i)).
#include <array>
#include <memory>
#include <mutex>
#include <utility>

#include "base/error.h"
#include "memory/cuda/caching_allocator.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/device.h"

namespace mammoth::memory::cuda {
namespace {

class CudaBackend final : public DeviceMemoryBackend {
 public:
  explicit CudaBackend(int device) : device_(device) {}

  void* raw_allocate(size_t nbytes) override {
    DeviceGuard guard(device_);
    void* p = nullptr;
    const cudaError_t rc = cudaMalloc(&p, nbytes);
    if (rc == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky, but clear it so the next check sees a clean state
      return nullptr;
    }
    CUDA_CHECK(rc);
    return p;
  }
  void raw_free(void* ptr) override {
    DeviceGuard guard(device_);
    CUDA_CHECK(cudaFree(ptr));
  }
  void* create_event() override {
    DeviceGuard guard(device_);
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void record_event(void* event, void* stream) override {
    DeviceGuard guard(device_);
    CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
  }
  bool event_done(void* event) override {
    const cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (rc == cudaErrorNotReady) return false;
    CUDA_CHECK(rc);
    return true;
  }
  void destroy_event(void* event) override {
    CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
  }
  void* current_stream() override { return cuda::current_stream(); }
  int device_index() const override { return device_; }

 private:
  int device_;
};

constexpr int kMaxDevices = 64;

struct DeviceAllocators {
  std::mutex mu;
  std::array<std::unique_ptr<CachingAllocator>, kMaxDevices> per_device;
};

DeviceAllocators& allocators() {
  // Leaked on purpose: tensors freed during static destruction must still find their allocator.
  static DeviceAllocators* a = new DeviceAllocators;
  return *a;
}

void require_device(const char* where) {
  std::string reason;
  MAMMOTH_CHECK(cuda_available(&reason))
      << "[" << where << "] no CUDA device (" << reason << "): use the CPU backend";
}

// Routes to the current device's caching allocator.
class CudaAllocatorRouter final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    require_device("cuda_allocator");
    return device_allocator(current_device()).allocate(nbytes);
  }
  void deallocate(void* ptr, size_t nbytes) override {
    if (ptr == nullptr) return;
    CachingAllocator& cur = device_allocator(current_device());
    if (cur.owns(ptr)) {
      cur.deallocate(ptr, nbytes);
      return;
    }
    for (int d = 0; d < device_count(); ++d) {
      CachingAllocator& a = device_allocator(d);
      if (a.owns(ptr)) {
        DeviceGuard guard(d);
        a.deallocate(ptr, nbytes);
        return;
      }
    }
    MAMMOTH_THROW() << "[cuda_allocator] deallocate of unknown device pointer " << ptr;
  }
  AllocatorStats stats() const override {
    if (!cuda_available()) return {};
    return device_allocator(current_device()).stats();
  }
  void reset_peak() override {
    if (cuda_available()) device_allocator(current_device()).reset_peak();
  }
  Device device() const override {
    return cuda_available() ? Device::cuda(current_device()) : Device::cuda(0);
  }
};

// Registers the router at load time (no CUDA call happens here).
const bool kRegistered = [] {
  register_device_allocator(DeviceType::kCUDA, &cuda_allocator());
  return true;
}();

}  // namespace

CachingAllocator& device_allocator(int index) {
  require_device("device_allocator");
  MAMMOTH_CHECK(index >= 0 && index < device_count() && index < kMaxDevices)
      << "[device_allocator] device " << index << " does not exist (" << device_count()
      << " CUDA devices)";
  DeviceAllocators& a = allocators();
  std::lock_guard<std::mutex> lock(a.mu);
  if (a.per_device[index] == nullptr) {
    a.per_device[index] = std::make_unique<CachingAllocator>(std::make_unique<CudaBackend>(index));
  }
  return *a.per_device[index];
}

void empty_cache() {
  DeviceAllocators& a = allocators();
  std::lock_guard<std::mutex> lock(a.mu);
  for (auto& p : a.per_device) {
    if (p != nullptr) p->empty_cache();
  }
}

Allocator& cuda_allocator() {
  static CudaAllocatorRouter* router = new CudaAllocatorRouter;
  (void)kRegistered;
  return *router;
}

DeviceBuffer::DeviceBuffer(size_t nbytes) : nbytes_(nbytes), device_(current_device()) {
  ptr_ = device_allocator(device_).allocate(nbytes);
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) {
    try {
      device_allocator(device_).deallocate(ptr_, nbytes_);
    } catch (...) {
      // A destructor must not throw; the block is leaked to the cache's bookkeeping only.
    }
  }
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), nbytes_(o.nbytes_), device_(o.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    DeviceBuffer tmp(std::move(*this));
    ptr_ = std::exchange(o.ptr_, nullptr);
    nbytes_ = o.nbytes_;
    device_ = o.device_;
  }
  return *this;
}

}  // namespace mammoth::memory::cuda
