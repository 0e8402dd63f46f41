// The CUDA device context: which device this process uses, streams, events, host<->device copies.
//
// One process per device (DESIGN.md): select_device() picks CUDA device = local rank
// (OMPI_COMM_WORLD_LOCAL_RANK, else LOCAL_RANK, SLURM_LOCALID, else 0) modulo the device count.
// cuda_available() is false, without throwing, on a machine with the toolkit's runtime but no
// driver or no GPU (cudaErrorInsufficientDriver / cudaErrorNoDevice); every other failure of a
// CUDA call throws mammoth::Error (memory/cuda/cuda_check.h).
//
// Kernels launch on current_stream(): per thread and device, the legacy default stream unless a
// StreamGuard installs another. Everything here is a thin RAII layer over the runtime API.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "base/device.h"

namespace mammoth::memory::cuda {

// True when at least one CUDA device can be used. `reason` (optional) receives why not.
bool cuda_available(std::string* reason = nullptr);
int device_count();  // 0 when !cuda_available()
// The process's local rank from the launcher's environment (0 when not launched by one).
int local_rank();
// Sets the current device to local_rank() % device_count() and returns it; Device::cpu() when
// no device is available.
Device select_device();
int current_device();
void set_device(int index);
void synchronize();  // the current device

// Restores the previous current device on destruction.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
};

// An owned, non-blocking stream on the device current at construction.
class Stream {
 public:
  Stream();
  explicit Stream(int priority);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  void synchronize() const;
  bool query() const;  // true when all work has completed

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
};

// An owned event (timing disabled unless asked: cheaper for synchronisation).
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return event_; }
  void record(cudaStream_t stream);
  void wait(cudaStream_t stream) const;  // stream waits for this event
  void synchronize() const;
  bool query() const;
  // Milliseconds between `start` and this event (both recorded with timing enabled).
  float elapsed_ms(const Event& start) const;

 private:
  cudaEvent_t event_ = nullptr;
};

// The stream kernels of this thread launch on (nullptr = the legacy default stream).
cudaStream_t current_stream();
void set_current_stream(cudaStream_t stream);

// Installs `stream` as this thread's current stream for its scope.
class StreamGuard {
 public:
  explicit StreamGuard(cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  cudaStream_t previous_;
};

// Copies n bytes between any two devices (CPU <-> CUDA, CUDA <-> CUDA, CPU <-> CPU) and returns
// when the bytes are in place: what Tensor::to(Device) needs. Device copies run on the current
// stream, so work already queued there that produces `src` is ordered before the copy.
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t n);

// Queues the copy on `stream` and returns at once. For truly asynchronous host<->device transfers
// the host side must be pinned (memory/cuda/pinned_allocator.h); pageable memory still works
// but the runtime stages it synchronously.
void copy_bytes_async(void* dst, Device dst_dev, const void* src, Device src_dev, size_t n,
                      cudaStream_t stream);

}  // namespace mammoth::memory::cuda
