#include "memory/cuda/device.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "base/error.h"
#include "memory/cuda/cuda_check.h"

namespace mammoth::memory::cuda {

const char* cublas_status_string(int status) {
  // Values of cublasStatus_t (cublas_api.h); the header is not needed to decode them.
  switch (status) {
    case 0:
      return "CUBLAS_STATUS_SUCCESS";
    case 1:
      return "CUBLAS_STATUS_NOT_INITIALIZED (the library was not initialized)";
    case 3:
      return "CUBLAS_STATUS_ALLOC_FAILED (resource allocation failed)";
    case 7:
      return "CUBLAS_STATUS_INVALID_VALUE (an invalid value was used as an argument)";
    case 8:
      return "CUBLAS_STATUS_ARCH_MISMATCH (architecture mismatch)";
    case 11:
      return "CUBLAS_STATUS_MAPPING_ERROR (an access to GPU memory space failed)";
    case 13:
      return "CUBLAS_STATUS_EXECUTION_FAILED (the GPU program failed to execute)";
    case 14:
      return "CUBLAS_STATUS_INTERNAL_ERROR (an internal operation failed)";
    case 15:
      return "CUBLAS_STATUS_NOT_SUPPORTED (the functionality requested is not supported)";
    case 16:
      return "CUBLAS_STATUS_LICENSE_ERROR (license error)";
    default:
      return "unknown cuBLAS status";
  }
}

namespace {

struct Availability {
  bool available = false;
  int count = 0;
  std::string reason;
};

const Availability& availability() {
  static const Availability a = [] {
    Availability r;
    const cudaError_t rc = cudaGetDeviceCount(&r.count);
    if (rc == cudaErrorInsufficientDriver || rc == cudaErrorNoDevice) {
      r.count = 0;
      r.reason = std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc);
      cudaGetLastError();  // clear the sticky error for later calls
      return r;
    }
    CUDA_CHECK(rc);
    r.available = r.count > 0;
    if (!r.available) r.reason = "cudaGetDeviceCount reported 0 devices";
    return r;
  }();
  return a;
}

thread_local cudaStream_t t_current_stream = nullptr;

}  // namespace

bool cuda_available(std::string* reason) {
  const Availability& a = availability();
  if (reason != nullptr) *reason = a.reason;
  return a.available;
}

int device_count() { return availability().count; }

int local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "SLURM_LOCALID"}) {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long r = std::strtol(v, &end, 10);
    MAMMOTH_CHECK(end != nullptr && *end == '\0' && r >= 0)
        << "[local_rank] environment variable " << name << "=" << v
        << " is not a non-negative integer";
    return static_cast<int>(r);
  }
  return 0;
}

Device select_device() {
  if (!cuda_available()) return Device::cpu();
  const int index = local_rank() % device_count();
  set_device(index);
  return Device::cuda(index);
}

int current_device() {
  int d = 0;
  CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int index) {
  MAMMOTH_CHECK(index >= 0 && index < device_count())
      << "[set_device] device " << index << " does not exist (" << device_count()
      << " CUDA devices)";
  CUDA_CHECK(cudaSetDevice(index));
}

void synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

DeviceGuard::DeviceGuard(int index) : previous_(current_device()) {
  if (index != previous_) CUDA_CHECK(cudaSetDevice(index));
}

DeviceGuard::~DeviceGuard() {
  // Destructors must not throw; a failure to restore surfaces at the next checked call.
  cudaSetDevice(previous_);
}

Stream::Stream() : device_(current_device()) {
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

Stream::Stream(int priority) : device_(current_device()) {
  CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
}

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Stream::Stream(Stream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

void Stream::synchronize() const { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

bool Stream::query() const {
  const cudaError_t rc = cudaStreamQuery(stream_);
  if (rc == cudaErrorNotReady) return false;
  CUDA_CHECK(rc);
  return true;
}

Event::Event(bool timing) {
  CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(event_);
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::record(cudaStream_t stream) { CUDA_CHECK(cudaEventRecord(event_, stream)); }
void Event::wait(cudaStream_t stream) const { CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }
void Event::synchronize() const { CUDA_CHECK(cudaEventSynchronize(event_)); }

bool Event::query() const {
  const cudaError_t rc = cudaEventQuery(event_);
  if (rc == cudaErrorNotReady) return false;
  CUDA_CHECK(rc);
  return true;
}

float Event::elapsed_ms(const Event& start) const {
  float ms = 0.0f;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
  return ms;
}

cudaStream_t current_stream() { return t_current_stream; }
void set_current_stream(cudaStream_t stream) { t_current_stream = stream; }

StreamGuard::StreamGuard(cudaStream_t stream) : previous_(t_current_stream) {
  t_current_stream = stream;
}
StreamGuard::~StreamGuard() { t_current_stream = previous_; }

namespace {

cudaMemcpyKind kind_of(Device dst, Device src) {
  if (dst.is_cpu() && src.is_cpu()) return cudaMemcpyHostToHost;
  if (dst.is_cpu()) return cudaMemcpyDeviceToHost;
  if (src.is_cpu()) return cudaMemcpyHostToDevice;
  return cudaMemcpyDeviceToDevice;
}

}  // namespace

void copy_bytes_async(void* dst, Device dst_dev, const void* src, Device src_dev, size_t n,
                      cudaStream_t stream) {
  if (n == 0) return;
  MAMMOTH_CHECK(dst != nullptr && src != nullptr) << "[copy_bytes] null pointer copying " << n
                                                  << " bytes from " << src_dev << " to " << dst_dev;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, n);
    return;
  }
  if (dst_dev.is_cuda() && src_dev.is_cuda() && dst_dev.index != src_dev.index) {
    CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev.index, src, src_dev.index, n, stream));
    return;
  }
  const int dev = dst_dev.is_cuda() ? dst_dev.index : src_dev.index;
  DeviceGuard guard(dev);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, n, kind_of(dst_dev, src_dev), stream));
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t n) {
  if (n == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, n);
    return;
  }
  const cudaStream_t stream = current_stream();
  copy_bytes_async(dst, dst_dev, src, src_dev, n, stream);
  CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace mammoth::memory::cuda
