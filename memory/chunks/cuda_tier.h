// CudaTier: the CUDA side of the chunk manager's device tier (memory/chunks/chunk_manager.h).
//
// What the manager needs from a GPU, behind opaque handles so chunk_manager.cc includes no CUDA
// header: device memory for device-homed chunks and device cache slots (cudaMalloc'd outside
// the caching allocator, so the bytes held are exactly what the manager accounts), pinned host
// memory for host-homed chunks and NVMe staging slots, and copies on one dedicated copy stream
// ordered against the compute stream (the calling thread's memory::cuda::current_stream(), the
// stream its kernels launch on) with events only: nothing here blocks the host except
// host_wait() and synchronize().
//
// Where the CUDA backend is not built (no MAMMOTH_WITH_CUDA) the constructor throws, saying so,
// and nothing else is reachable: chunk_manager.cc needs no #ifdef.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mammoth::memory::chunks {

class CudaTier {
 public:
  explicit CudaTier(int device);  // throws Error naming the reason when there is no such GPU
  ~CudaTier();
  CudaTier(const CudaTier&) = delete;
  CudaTier& operator=(const CudaTier&) = delete;

  int device() const { return device_; }
  // Zeroed device memory (cudaMalloc + cudaMemset); counted in device_bytes().
  void* device_alloc(size_t n);
  void device_free(void* p, size_t n);
  // Zeroed page-locked host memory (cudaHostAlloc), 4 KiB aligned (O_DIRECT needs that).
  void* host_alloc(size_t n);
  void host_free(void* p);
  int64_t device_bytes() const { return device_bytes_; }

  // One event per chunk: the last copy-stream operation on it (a load reading its home copy, a
  // write-back writing it).
  void* new_event();
  void free_event(void* event);

  // The copy stream waits for everything the compute stream has queued so far: a slot about to
  // be overwritten, or a dirty chunk about to be copied out, is no longer used by a kernel.
  void copy_after_compute();
  // Queued on the copy stream; `event` is recorded after the copy.
  void load(void* device_dst, const void* host_src, size_t n, void* event);
  void write_back(void* host_dst, const void* device_src, size_t n, void* event);
  // The compute stream waits for `event` (a load) before its next kernel: no host sync.
  void compute_wait(void* event);
  // The host waits for `event` (before it reads or writes a home copy a copy may still touch).
  void host_wait(void* event);
  // Every queued copy and kernel on this device is done.
  void synchronize();

 private:
  int device_ = 0;
  void* copy_stream_ = nullptr;   // cudaStream_t
  void* compute_done_ = nullptr;  // cudaEvent_t, re-recorded by each copy_after_compute
  int64_t device_bytes_ = 0;
};

}  // namespace mammoth::memory::chunks
