// The fallback engine: worker threads doing blocking pread/pwrite on O_DIRECT files.
//
// Used where the kernel (or a seccomp sandbox, or kernel.io_uring_disabled) refuses io_uring.
// `threads` workers (default: queue_depth) each take one request at a time from a shared queue,
// so at most that many transfers are in the kernel at once, the same meaning queue depth has
// for io_uring.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "memory/io/async_io.h"

namespace mammoth::memory::io {

class ThreadEngine final : public AsyncIO {
 public:
  explicit ThreadEngine(const AsyncIOOptions& options);
  ~ThreadEngine() override;
  EngineKind kind() const override { return EngineKind::kThreads; }

 protected:
  void start(std::vector<detail::Pending*> batch) override;
  void start_one(detail::Pending* p) override;

 private:
  void worker();
  void transfer(detail::Pending* p);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<detail::Pending*> queue_;
  bool stop_ = false;
  std::atomic<int64_t> in_flight_{0};
  std::vector<std::thread> workers_;
};

}  // namespace mammoth::memory::io
