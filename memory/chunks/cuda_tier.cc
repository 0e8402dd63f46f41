#include "memory/chunks/cuda_tier.h"

#include "base/error.h"

#ifdef MAMMOTH_WITH_CUDA

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "memory/cuda/cuda_check.h"
#include "memory/cuda/device.h"

namespace mammoth::memory::chunks {
namespace {

cudaStream_t stream_of(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t event_of(void* e) { return static_cast<cudaEvent_t>(e); }

}  // namespace

CudaTier::CudaTier(int device) : device_(device) {
  std::string reason;
  MAMMOTH_CHECK(cuda::cuda_available(&reason))
      << "[ChunkManager] the device tier is cuda:" << device << " but there is no CUDA device ("
      << reason << ")";
  MAMMOTH_CHECK(device >= 0 && device < cuda::device_count())
      << "[ChunkManager] the device tier is cuda:" << device << " but this machine has "
      << cuda::device_count() << " CUDA device(s)";
  cuda::DeviceGuard guard(device_);
  cudaStream_t s = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  copy_stream_ = s;
  compute_done_ = new_event();
}

CudaTier::~CudaTier() {
  // Destructors do not throw: a failure here surfaces at the next checked CUDA call.
  cudaSetDevice(device_);
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(stream_of(copy_stream_));
    cudaStreamDestroy(stream_of(copy_stream_));
  }
  if (compute_done_ != nullptr) cudaEventDestroy(event_of(compute_done_));
}

void* CudaTier::device_alloc(size_t n) {
  cuda::DeviceGuard guard(device_);
  void* p = nullptr;
  const cudaError_t rc = cudaMalloc(&p, n);
  if (rc == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    MAMMOTH_THROW() << "[ChunkManager] cannot allocate " << n << " bytes on cuda:" << device_
                    << " for chunks (" << free_b << " of " << total_b
                    << " bytes free): lower --device-mem";
  }
  CUDA_CHECK(rc);
  CUDA_CHECK(cudaMemset(p, 0, n));
  device_bytes_ += static_cast<int64_t>(n);
  return p;
}

void CudaTier::device_free(void* p, size_t n) {
  if (p == nullptr) return;
  cuda::DeviceGuard guard(device_);
  CUDA_CHECK(cudaFree(p));  // synchronises the device: no kernel still uses it
  device_bytes_ -= static_cast<int64_t>(n);
}

void* CudaTier::host_alloc(size_t n) {
  cuda::DeviceGuard guard(device_);
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, n, cudaHostAllocPortable));
  std::memset(p, 0, n);
  return p;
}

void CudaTier::host_free(void* p) {
  if (p != nullptr) CUDA_CHECK(cudaFreeHost(p));
}

void* CudaTier::new_event() {
  cuda::DeviceGuard guard(device_);
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void CudaTier::free_event(void* event) {
  if (event != nullptr) cudaEventDestroy(event_of(event));
}

void CudaTier::copy_after_compute() {
  // cudaStreamWaitEvent captures the event's latest record at the call, so one event serves
  // every call in turn.
  CUDA_CHECK(cudaEventRecord(event_of(compute_done_), cuda::current_stream()));
  CUDA_CHECK(cudaStreamWaitEvent(stream_of(copy_stream_), event_of(compute_done_), 0));
}

void CudaTier::load(void* device_dst, const void* host_src, size_t n, void* event) {
  cuda::DeviceGuard guard(device_);
  CUDA_CHECK(
      cudaMemcpyAsync(device_dst, host_src, n, cudaMemcpyHostToDevice, stream_of(copy_stream_)));
  CUDA_CHECK(cudaEventRecord(event_of(event), stream_of(copy_stream_)));
}

void CudaTier::write_back(void* host_dst, const void* device_src, size_t n, void* event) {
  cuda::DeviceGuard guard(device_);
  CUDA_CHECK(
      cudaMemcpyAsync(host_dst, device_src, n, cudaMemcpyDeviceToHost, stream_of(copy_stream_)));
  CUDA_CHECK(cudaEventRecord(event_of(event), stream_of(copy_stream_)));
}

void CudaTier::compute_wait(void* event) {
  CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(), event_of(event), 0));
}

void CudaTier::host_wait(void* event) { CUDA_CHECK(cudaEventSynchronize(event_of(event))); }

void CudaTier::synchronize() {
  cuda::DeviceGuard guard(device_);
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace mammoth::memory::chunks

#else  // !MAMMOTH_WITH_CUDA

// A build without the CUDA backend: the constructor refuses, so nothing else is ever called.
namespace mammoth::memory::chunks {

CudaTier::CudaTier(int device) : device_(device) {
  MAMMOTH_THROW() << "[ChunkManager] the device tier is cuda:" << device
                  << " but this build has no CUDA backend (no toolkit, or "
                  << "--//third_party/cuda:enable_cuda=false)";
}
CudaTier::~CudaTier() = default;
void* CudaTier::device_alloc(size_t) { MAMMOTH_THROW() << "[CudaTier] no CUDA backend"; }
void CudaTier::device_free(void*, size_t) {}
void* CudaTier::host_alloc(size_t) { MAMMOTH_THROW() << "[CudaTier] no CUDA backend"; }
void CudaTier::host_free(void*) {}
void* CudaTier::new_event() { MAMMOTH_THROW() << "[CudaTier] no CUDA backend"; }
void CudaTier::free_event(void*) {}
void CudaTier::copy_after_compute() { MAMMOTH_THROW() << "[CudaTier] no CUDA backend"; }
void CudaTier::load(void*, const void*, size_t, void*) {
  MAMMOTH_THROW() << "[CudaTier] no CUDA backend";
}
void CudaTier::write_back(void*, const void*, size_t, void*) {
  MAMMOTH_THROW() << "[CudaTier] no CUDA backend";
}
void CudaTier::compute_wait(void*) { MAMMOTH_THROW() << "[CudaTier] no CUDA backend"; }
void CudaTier::host_wait(void*) { MAMMOTH_THROW() << "[CudaTier] no CUDA backend"; }
void CudaTier::synchronize() {}

}  // namespace mammoth::memory::chunks

#endif  // MAMMOTH_WITH_CUDA
