// The io_uring engine: one I/O thread owns the ring and does every ring operation.
//
// Why one thread: the ring is then created with IORING_SETUP_SINGLE_ISSUER |
// IORING_SETUP_DEFER_TASKRUN (kernel >= 6.1; COOP_TASKRUN on 5.19-6.0, plain flags before), so
// completions are posted when that thread asks for them instead of interrupting whichever
// thread submitted, and no lock guards the submission or completion queues.
//
// The I/O thread loops: take newly submitted requests (and control operations: file and buffer
// registration) from a locked queue; prepare SQEs while fewer than queue_depth requests are in
// the kernel (no free SQE: submit what is prepared, then retry); submit them all with one
// io_uring_enter that also waits for at least one completion; reap every CQE there is. A CQE
// that moved fewer bytes than asked puts the request back at the front of the queue for the
// remainder; -EAGAIN/-EINTR retry; other negative results fail the request. With
// eager_resubmit (the default), whatever a completion made ready (its callback's next request,
// its remainder) is submitted right after that completion, before the next CQE is handled: on
// a virtio disk that keeps the device's queue full where waiting for the whole reaped batch
// cost ~20% of 4 KiB random-read IOPS. Requests submitted from a callback (this thread) go
// straight to the ready queue, without the lock. When the thread waits with spare capacity,
// submit() wakes it through an eventfd whose read is always armed in the ring.
#pragma once

#include <liburing.h>

#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "memory/io/async_io.h"

namespace mammoth::memory::io {

// How the ring runs completion task work, by what the kernel accepted at setup.
enum class TaskRun : uint8_t { kDeferred, kCooperative, kPlain };
const char* task_run_name(TaskRun mode);

class UringEngine final : public AsyncIO {
 public:
  // Throws Error (naming the call and strerror) when the kernel refuses to set up the ring.
  explicit UringEngine(const AsyncIOOptions& options);
  ~UringEngine() override;
  EngineKind kind() const override { return EngineKind::kUring; }

  bool register_buffer(void* data, size_t length) override;
  void unregister_buffer(void* data) override;

  // Which optional kernel features the ring got (for the bench's header line and tests).
  bool single_issuer() const { return task_run_ == TaskRun::kDeferred; }
  TaskRun task_run() const { return task_run_; }
  int registered_file_slots() const { return file_slots_; }
  int registered_buffer_slots() const { return static_cast<int>(buffers_.size()); }

 protected:
  void start(std::vector<detail::Pending*> batch) override;
  void start_one(detail::Pending* p) override;
  void on_open(FileId file, int fd) override;
  void on_close(FileId file, int fd) override;

 private:
  std::string setup();
  void loop();
  void fill();
  int submit_ring(bool wait);
  void reap();
  void on_cqe(detail::Pending* p, int res);
  void prefetch_for_verify(const void* tag) const;
  bool prep(detail::Pending* p);
  void arm_eventfd();
  void fail_all(const std::string& error);
  int find_buffer(const char* data, size_t length) const;
  // Runs fn on the I/O thread and waits for it.
  void call(const std::function<void()>& fn);
  void kick_locked();

  // Shared with submitting threads (guarded by mu_).
  std::mutex mu_;
  std::deque<detail::Pending*> incoming_;
  std::deque<std::function<void()>> control_;
  bool idle_ = false;  // the I/O thread waits in the kernel with room for more requests
  bool stop_ = false;
  int event_fd_ = -1;
  std::thread thread_;
  std::thread::id io_thread_;  // thread_'s id, set by the thread itself before setup()

  // Owned by the I/O thread.
  io_uring ring_{};
  bool ring_ok_ = false;
  TaskRun task_run_ = TaskRun::kPlain;
  int depth_ = 0;
  int in_flight_ = 0;                         // requests in the kernel
  std::deque<detail::Pending*> ready_;        // waiting for a slot (remainders at the front)
  std::deque<detail::Pending*> unsubmitted_;  // SQEs prepared, not yet consumed (null: eventfd)
  uint64_t event_value_ = 0;                  // target of the armed eventfd read
  bool event_armed_ = false;
  std::string fatal_;  // set when the ring itself failed
  int file_slots_ = 0;
  std::vector<char> file_fixed_;  // per FileId: registered in the ring's file table
  struct Slot {
    char* base = nullptr;
    size_t length = 0;
  };
  std::vector<Slot> buffers_;  // the registered-buffer table; base == nullptr: free
};

}  // namespace mammoth::memory::io
