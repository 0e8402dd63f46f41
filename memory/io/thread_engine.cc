#include "memory/io/thread_engine.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "memory/io/internal.h"

namespace mammoth::memory::io {

using detail::Pending;

ThreadEngine::ThreadEngine(const AsyncIOOptions& options) : AsyncIO(options) {
  const int n = options.threads > 0 ? options.threads : options.queue_depth;
  workers_.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) workers_.emplace_back([this] { worker(); });
}

ThreadEngine::~ThreadEngine() {
  drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadEngine::start(std::vector<Pending*> batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.insert(queue_.end(), batch.begin(), batch.end());
  }
  if (batch.size() == 1) {
    cv_.notify_one();
  } else {
    cv_.notify_all();
  }
}

void ThreadEngine::start_one(Pending* p) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(p);
  }
  cv_.notify_one();
}

void ThreadEngine::worker() {
  for (;;) {
    Pending* p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      p = queue_.front();
      queue_.pop_front();
    }
    counters().note_in_flight(in_flight_.fetch_add(1, std::memory_order_relaxed) + 1);
    transfer(p);
  }
}

void ThreadEngine::transfer(Pending* p) {
  detail::Counters& c = counters();
  std::string error;
  while (p->done < p->length) {
    size_t len = std::min(p->length - p->done, detail::kMaxTransfer);
    if (options().split_transfers_for_test && p->done == 0 && len > kBlockSize) {
      len = len / 2 / kBlockSize * kBlockSize;
    }
    p->asked = len;
    char* buf = p->data + p->done;
    const off_t off = static_cast<off_t>(p->offset + static_cast<int64_t>(p->done));
    const ssize_t n = p->op == Op::kRead ? ::pread(p->file->fd, buf, len, off)
                                         : ::pwrite(p->file->fd, buf, len, off);
    if (n < 0) {
      const int e = errno;
      if ((e == EINTR || e == EAGAIN) && p->attempts < detail::kMaxRetries) {
        ++p->attempts;
        c.retries.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      error = "[io] " + describe(*p) + " failed after " + std::to_string(p->done) +
              " bytes: " + std::strerror(e);
      break;
    }
    if (n == 0) {
      error = "[io] " + describe(*p) +
              (p->op == Op::kRead ? ": reached the end of the file after "
                                  : ": the kernel accepted no bytes after ") +
              std::to_string(p->done) + " bytes";
      break;
    }
    p->done += static_cast<size_t>(n);
    if (p->done < p->length) {
      c.short_transfers.fetch_add(1, std::memory_order_relaxed);
      if (p->done % kBlockSize != 0) {
        // O_DIRECT cannot continue from an unaligned position; only end of file stops there.
        error = "[io] " + describe(*p) + ": the transfer stopped at unaligned byte " +
                std::to_string(p->done) + " (end of file?)";
        break;
      }
    }
  }
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  complete(p, std::move(error));
}

}  // namespace mammoth::memory::io
