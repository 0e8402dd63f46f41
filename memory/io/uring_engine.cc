#include "memory/io/uring_engine.h"

#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>

#include "base/error.h"
#include "memory/io/internal.h"

namespace mammoth::memory::io {

using detail::Pending;

namespace {

std::string errno_text(int negative_errno) { return std::strerror(-negative_errno); }

}  // namespace

const char* task_run_name(TaskRun mode) {
  switch (mode) {
    case TaskRun::kDeferred:
      return "single issuer + deferred task run";
    case TaskRun::kCooperative:
      return "cooperative task run";
    case TaskRun::kPlain:
      return "plain";
  }
  return "?";
}

UringEngine::UringEngine(const AsyncIOOptions& options) : AsyncIO(options) {
  depth_ = options.queue_depth;
  event_fd_ = ::eventfd(0, EFD_CLOEXEC);
  MAMMOTH_CHECK(event_fd_ >= 0) << "[io_uring] eventfd failed: " << std::strerror(errno);
  std::promise<std::string> ready;
  std::future<std::string> result = ready.get_future();
  // The ring is created on the I/O thread: with SINGLE_ISSUER the creating task is the only
  // one allowed to submit or register.
  thread_ = std::thread([this, &ready] {
    io_thread_ = std::this_thread::get_id();  // read by others after `ready` is set
    std::string error = setup();
    const bool ok = error.empty();
    ready.set_value(std::move(error));
    if (!ok) return;
    loop();
    io_uring_queue_exit(&ring_);
  });
  const std::string error = result.get();
  if (!error.empty()) {
    thread_.join();
    ::close(event_fd_);
    MAMMOTH_THROW() << error;
  }
}

UringEngine::~UringEngine() {
  drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    const uint64_t one = 1;
    // The loop checks stop_ after every wake-up; the write only has to wake it.
    [[maybe_unused]] const ssize_t n = ::write(event_fd_, &one, sizeof(one));
  }
  thread_.join();
  ::close(event_fd_);
}

std::string UringEngine::setup() {
  const unsigned entries =
      static_cast<unsigned>(options().ring_entries > 0 ? options().ring_entries : depth_);
  // Room for every request in flight plus the eventfd read, so the CQ never overflows.
  const unsigned cq_entries = 2 * std::max<unsigned>(entries, static_cast<unsigned>(depth_) + 1);
  // The ladder of setup flags, newest first; a kernel that does not know a flag refuses the
  // setup with EINVAL, and the next rung asks for less. Deferred task run (6.1) posts
  // completions only when this thread enters the kernel for them; cooperative task run (5.19)
  // at least does not interrupt it with an IPI for each completion.
  struct Rung {
    unsigned flags;
    TaskRun mode;
  };
  static constexpr Rung kLadder[] = {
      {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, TaskRun::kDeferred},
      {IORING_SETUP_COOP_TASKRUN, TaskRun::kCooperative},
      {0, TaskRun::kPlain},
  };
  int r = -EINVAL;
  for (size_t rung = static_cast<size_t>(options().ring_setup_rung_for_test);
       rung < std::size(kLadder) && r == -EINVAL; ++rung) {
    io_uring_params params{};
    params.flags = IORING_SETUP_CQSIZE | kLadder[rung].flags;
    params.cq_entries = cq_entries;
    r = io_uring_queue_init_params(entries, &ring_, &params);
    if (r == 0) task_run_ = kLadder[rung].mode;
  }
  if (r < 0) {
    return "[io_uring] io_uring_queue_init_params(" + std::to_string(entries) +
           " entries) failed: " + errno_text(r);
  }
  ring_ok_ = true;

  // Registered files and buffers are optimisations: without them requests use plain fds and
  // plain reads/writes.
  if (options().max_registered_files > 0) {
    rlimit nofile{};
    ::getrlimit(RLIMIT_NOFILE, &nofile);
    const unsigned n = static_cast<unsigned>(
        std::min<rlim_t>(static_cast<rlim_t>(options().max_registered_files), nofile.rlim_cur));
    if (n > 0 && io_uring_register_files_sparse(&ring_, n) == 0) file_slots_ = static_cast<int>(n);
  }
  if (options().max_registered_buffers > 0 &&
      io_uring_register_buffers_sparse(
          &ring_, static_cast<unsigned>(options().max_registered_buffers)) == 0) {
    buffers_.resize(static_cast<size_t>(options().max_registered_buffers));
  }

  // A first round trip through io_uring_enter: sandboxes that allow the setup but not the
  // submission fail here, at construction, instead of on the first real request.
  arm_eventfd();
  r = submit_ring(false);
  if (r < 0) {
    io_uring_queue_exit(&ring_);
    ring_ok_ = false;
    return "[io_uring] io_uring_enter failed: " + errno_text(r);
  }
  return {};
}

void UringEngine::arm_eventfd() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) {
    submit_ring(false);
    sqe = io_uring_get_sqe(&ring_);
  }
  if (sqe == nullptr) return;  // retried after the next reap
  io_uring_prep_read(sqe, event_fd_, &event_value_, sizeof(event_value_), 0);
  io_uring_sqe_set_data(sqe, &event_value_);
  unsubmitted_.push_back(nullptr);
  event_armed_ = true;
}

// Submits the prepared SQEs (waiting for one completion when `wait`) and forgets the Pending
// entries the kernel consumed. Returns io_uring_enter's result.
int UringEngine::submit_ring(bool wait) {
  // io_uring_submit_and_get_events also runs deferred task work, so CQEs become visible.
  const int r = wait ? io_uring_submit_and_wait(&ring_, 1) : io_uring_submit_and_get_events(&ring_);
  counters().kernel_calls.fetch_add(1, std::memory_order_relaxed);
  if (wait) counters().kernel_waits.fetch_add(1, std::memory_order_relaxed);
  if (r > 0) {
    const size_t n = std::min(static_cast<size_t>(r), unsubmitted_.size());
    unsubmitted_.erase(unsubmitted_.begin(), unsubmitted_.begin() + static_cast<long>(n));
  }
  return r;
}

void UringEngine::start(std::vector<Pending*> batch) {
  if (std::this_thread::get_id() == io_thread_ && fatal_.empty()) {
    // A completion callback submitting the next request (the prefetch pipeline, the bench's
    // random reads): the loop fills from ready_ right after this reap, so skip the lock and the
    // queue hand-off. (After a fatal error, requests go through incoming_, which fails them.)
    ready_.insert(ready_.end(), batch.begin(), batch.end());
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  incoming_.insert(incoming_.end(), batch.begin(), batch.end());
  kick_locked();
}

void UringEngine::start_one(Pending* p) {
  if (std::this_thread::get_id() == io_thread_ && fatal_.empty()) {
    ready_.push_back(p);  // as in start(): a callback's next request
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  incoming_.push_back(p);
  kick_locked();
}

void UringEngine::kick_locked() {
  if (!idle_) return;
  idle_ = false;  // one wake-up is enough until the thread waits again
  const uint64_t one = 1;
  const ssize_t n = ::write(event_fd_, &one, sizeof(one));
  // An eventfd write fails only when the counter would overflow, which a wake-up never does.
  MAMMOTH_CHECK(n == sizeof(one)) << "[io_uring] eventfd write failed: " << std::strerror(errno);
}

void UringEngine::call(const std::function<void()>& fn) {
  if (std::this_thread::get_id() == io_thread_) {
    fn();
    return;
  }
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    control_.push_back([&] {
      fn();
      done.set_value();
    });
    idle_ = true;  // control operations wake the thread even when it is at full depth
    kick_locked();
  }
  finished.get();
}

void UringEngine::loop() {
  // Swapped with the shared queues each turn and emptied again: a deque allocates even when
  // empty, and this runs once per completion at high IOPS.
  std::deque<Pending*> incoming;
  std::deque<std::function<void()>> control;
  for (;;) {
    incoming.clear();
    control.clear();
    bool stop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      incoming.swap(incoming_);
      control.swap(control_);
      stop = stop_;
      idle_ = false;
    }
    for (auto& fn : control) fn();
    if (!fatal_.empty()) {
      for (Pending* p : incoming) complete(p, fatal_);
      incoming.clear();
    }
    ready_.insert(ready_.end(), incoming.begin(), incoming.end());
    if (stop && ready_.empty() && in_flight_ == 0) return;
    if (!event_armed_ && fatal_.empty()) arm_eventfd();
    fill();

    bool wait;
    {
      std::lock_guard<std::mutex> lock(mu_);
      wait = incoming_.empty() && control_.empty() && !stop_;
      // With requests still queued here the thread is at full depth: new ones would only queue
      // behind them, so submitters need not wake it.
      idle_ = wait && ready_.empty();
    }
    const int r = submit_ring(wait);
    {
      std::lock_guard<std::mutex> lock(mu_);
      idle_ = false;  // completions' callbacks may submit: no need to wake this thread
    }
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY && r != -ETIME) {
      fail_all("[io_uring] io_uring_enter failed: " + errno_text(r));
      if (in_flight_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    reap();
  }
}

void UringEngine::fill() {
  if (!fatal_.empty()) return;
  while (!ready_.empty() && in_flight_ < depth_) {
    Pending* p = ready_.front();
    if (!prep(p)) {
      // No free SQE: hand the prepared ones to the kernel to make room, then retry.
      counters().sqe_waits.fetch_add(1, std::memory_order_relaxed);
      const int r = submit_ring(false);
      if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
        fail_all("[io_uring] io_uring_enter failed: " + errno_text(r));
        return;
      }
      if (r <= 0) return;  // the kernel is busy: wait for completions first
      continue;
    }
    ready_.pop_front();
    ++in_flight_;
  }
  counters().note_in_flight(in_flight_);
}

bool UringEngine::prep(Pending* p) {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  if (sqe == nullptr) return false;
  size_t len = std::min(p->length - p->done, detail::kMaxTransfer);
  if (options().split_transfers_for_test && p->done == 0 && len > kBlockSize) {
    len = len / 2 / kBlockSize * kBlockSize;
  }
  p->asked = len;
  char* buf = p->data + p->done;
  const uint64_t off = static_cast<uint64_t>(p->offset) + p->done;
  if (p->buf_index == -2) p->buf_index = find_buffer(p->data, p->length);
  const bool fixed_file = p->id < static_cast<FileId>(file_fixed_.size()) && file_fixed_[p->id];
  const int fd = fixed_file ? p->id : p->file->fd;
  const unsigned n = static_cast<unsigned>(len);
  if (p->op == Op::kRead) {
    if (p->buf_index >= 0) {
      io_uring_prep_read_fixed(sqe, fd, buf, n, off, p->buf_index);
    } else {
      io_uring_prep_read(sqe, fd, buf, n, off);
    }
  } else {
    if (p->buf_index >= 0) {
      io_uring_prep_write_fixed(sqe, fd, buf, n, off, p->buf_index);
    } else {
      io_uring_prep_write(sqe, fd, buf, n, off);
    }
  }
  if (p->buf_index >= 0) counters().fixed_buffer_ios.fetch_add(1, std::memory_order_relaxed);
  if (fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data(sqe, p);
  unsubmitted_.push_back(p);
  return true;
}

void UringEngine::reap() {
  constexpr unsigned kBatch = 256;
  io_uring_cqe* cqes[kBatch];
  void* data[kBatch];
  int res[kBatch];
  for (;;) {
    const unsigned n = io_uring_peek_batch_cqe(&ring_, cqes, kBatch);
    if (n == 0) return;
    // Copy out and release the CQ slots before running completions (checksums, callbacks).
    for (unsigned i = 0; i < n; ++i) {
      data[i] = io_uring_cqe_get_data(cqes[i]);
      res[i] = cqes[i]->res;
    }
    io_uring_cq_advance(&ring_, n);
    for (unsigned i = 0; i < n; ++i) {
      if (data[i] == &event_value_) {
        event_armed_ = false;  // re-armed at the top of the loop
        continue;
      }
      if (data[i] == nullptr) continue;  // a NOP left by fail_all
      if (i + 1 < n) prefetch_for_verify(data[i + 1]);
      --in_flight_;
      on_cqe(static_cast<Pending*>(data[i]), res[i]);
      // What this completion made ready (a callback's next request, a remainder, a retry)
      // goes to the kernel now, before the rest of the batch is verified and called back: the
      // slot refills at once, as fio does, instead of after the whole batch. The same call
      // collects completions that arrived meanwhile (deferred task work).
      if (options().eager_resubmit && !ready_.empty() && in_flight_ < depth_) {
        fill();
        const int r = submit_ring(false);
        if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
          fail_all("[io_uring] io_uring_enter failed: " + errno_text(r));
        }
      }
    }
  }
}

// The bytes of a small read that completed are cold in this core's cache (the device, or the
// hypervisor's thread, wrote them); its checksum verification would stall on each line. Asking
// for them one completion ahead overlaps those misses with the current completion's work (its
// resubmission's system call).
void UringEngine::prefetch_for_verify(const void* tag) const {
  if (!options().checksums || tag == nullptr || tag == &event_value_) return;
  const auto* p = static_cast<const Pending*>(tag);
  if (p->op != Op::kRead || p->length > 4 * kBlockSize) return;
  for (size_t i = 0; i < p->length; i += 64) __builtin_prefetch(p->data + i);
}

void UringEngine::on_cqe(Pending* p, int res) {
  detail::Counters& c = counters();
  if (res < 0) {
    if ((res == -EAGAIN || res == -EINTR) && p->attempts < detail::kMaxRetries) {
      ++p->attempts;
      c.retries.fetch_add(1, std::memory_order_relaxed);
      ready_.push_front(p);
      return;
    }
    complete(p, "[io] " + describe(*p) + " failed after " + std::to_string(p->done) +
                    " bytes: " + errno_text(res));
    return;
  }
  if (res == 0) {
    complete(p, "[io] " + describe(*p) +
                    (p->op == Op::kRead ? ": reached the end of the file after "
                                        : ": the kernel accepted no bytes after ") +
                    std::to_string(p->done) + " bytes");
    return;
  }
  p->done += static_cast<size_t>(res);
  if (p->done < p->length) {
    c.short_transfers.fetch_add(1, std::memory_order_relaxed);
    if (p->done % kBlockSize != 0) {
      // O_DIRECT cannot continue from an unaligned position; only end of file stops there.
      complete(p, "[io] " + describe(*p) + ": the transfer stopped at unaligned byte " +
                      std::to_string(p->done) + " (end of file?)");
      return;
    }
    ready_.push_front(p);  // the remainder goes first: its caller is already waiting longest
    return;
  }
  complete(p, {});
}

void UringEngine::fail_all(const std::string& error) {
  if (fatal_.empty()) fatal_ = error;
  // Prepared SQEs the kernel has not consumed get no CQE while io_uring_enter fails: fail their
  // requests now, and turn the SQEs into NOPs without a request so that, should a later
  // io_uring_enter consume them after all, no freed request is touched. (Only this thread
  // enters the ring, so the kernel is not reading them meanwhile.)
  for (Pending* p : unsubmitted_) {
    if (p == nullptr) {
      event_armed_ = false;
      continue;
    }
    --in_flight_;
    complete(p, fatal_);
  }
  unsubmitted_.clear();
  io_uring_sq& sq = ring_.sq;
  for (unsigned i = __atomic_load_n(sq.khead, __ATOMIC_ACQUIRE); i != sq.sqe_tail; ++i) {
    io_uring_sqe* sqe = &sq.sqes[sq.array[i & sq.ring_mask]];
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, nullptr);
  }
  for (Pending* p : ready_) complete(p, fatal_);
  ready_.clear();
}

int UringEngine::find_buffer(const char* data, size_t length) const {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const Slot& s = buffers_[i];
    if (s.base != nullptr && data >= s.base && data + length <= s.base + s.length) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

bool UringEngine::register_buffer(void* data, size_t length) {
  MAMMOTH_CHECK(data != nullptr && length > 0) << "[io_uring] register_buffer: empty buffer";
  // The kernel pins whole pages and refuses single buffers above 1 GiB.
  if (buffers_.empty() || length > (size_t{1} << 30)) return false;
  bool ok = false;
  call([&] {
    if (!fatal_.empty()) return;
    auto it = std::find_if(buffers_.begin(), buffers_.end(),
                           [](const Slot& s) { return s.base == nullptr; });
    if (it == buffers_.end()) return;
    iovec iov{data, length};
    __u64 tag = 0;
    const unsigned slot = static_cast<unsigned>(it - buffers_.begin());
    // Fails with ENOMEM past RLIMIT_MEMLOCK for unprivileged users: then no fast path.
    if (io_uring_register_buffers_update_tag(&ring_, slot, &iov, &tag, 1) == 1) {
      *it = {static_cast<char*>(data), length};
      ok = true;
    }
  });
  return ok;
}

void UringEngine::unregister_buffer(void* data) {
  call([&] {
    for (size_t i = 0; i < buffers_.size(); ++i) {
      if (buffers_[i].base != static_cast<char*>(data)) continue;
      // An empty iovec clears the slot; requests already in the kernel keep their pages.
      iovec iov{nullptr, 0};
      __u64 tag = 0;
      io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(i), &iov, &tag, 1);
      buffers_[i] = Slot{};
      // Requests still queued here must not name the slot any more.
      for (Pending* p : ready_) {
        if (p->buf_index == static_cast<int>(i)) p->buf_index = -1;
      }
    }
  });
}

void UringEngine::on_open(FileId file, int fd) {
  if (file >= file_slots_) return;
  call([&] {
    if (file_fixed_.size() <= static_cast<size_t>(file)) file_fixed_.resize(file + 1, 0);
    file_fixed_[file] =
        io_uring_register_files_update(&ring_, static_cast<unsigned>(file), &fd, 1) == 1;
  });
}

void UringEngine::on_close(FileId file, int /*fd*/) {
  if (file >= file_slots_) return;
  call([&] {
    if (static_cast<size_t>(file) < file_fixed_.size() && file_fixed_[file]) {
      int none = -1;
      io_uring_register_files_update(&ring_, static_cast<unsigned>(file), &none, 1);
      file_fixed_[file] = 0;
    }
  });
}

}  // namespace mammoth::memory::io
