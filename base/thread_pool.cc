#include "base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace mammoth {
namespace {

thread_local bool tls_in_parallel = false;

// Workers and the caller spin briefly before sleeping: a training step of a small model runs
// hundreds of short parallel_for calls, and a condition-variable wake-up (a futex call and a
// context switch, ~10 us each way) per call was a large part of such a step. Past the spin
// (kSpin) everyone sleeps as before, so an idle pool or an oversubscribed machine pays little.
class ThreadPool {
 public:
  explicit ThreadPool(int n) { start(n); }
  ~ThreadPool() { stop(); }

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  void resize(int n) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    stop();
    start(n);
  }

  void run(int64_t num_chunks, const std::function<void(int64_t)>& chunk_fn) {
    std::lock_guard<std::mutex> run_lock(run_mutex_);
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &chunk_fn;
      num_chunks_ = num_chunks;
      next_chunk_.store(0);
      pending_workers_.store(static_cast<int>(workers_.size()));
      error_ = nullptr;
      generation_.fetch_add(1, std::memory_order_release);
      wake = sleepers_ > 0;
    }
    if (wake) cv_.notify_all();
    work();
    if (!spin_until([&] { return pending_workers_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> lock(mutex_);
      caller_waiting_ = true;
      done_cv_.wait(lock, [&] { return pending_workers_.load() == 0; });
      caller_waiting_ = false;
    }
    job_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static constexpr std::chrono::microseconds kSpin{100};

  // Polls `done` until it holds (true) or kSpin has passed (false).
  template <typename F>
  static bool spin_until(F done) {
    const auto limit = std::chrono::steady_clock::now() + kSpin;
    for (int i = 1;; ++i) {
      if (done()) return true;
      if ((i & 63) == 0 && std::chrono::steady_clock::now() > limit) return done();
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }

  void start(int n) {
    shutdown_.store(false);
    // Each worker starts from the current generation, so a job published before the thread
    // first runs is still picked up.
    for (int i = 1; i < n; ++i) {
      workers_.emplace_back([this, g = generation_.load()] { worker_loop(g); });
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      shutdown_.store(true);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    workers_.clear();
  }

  void work() {
    tls_in_parallel = true;
    for (;;) {
      int64_t c = next_chunk_.fetch_add(1);
      if (c >= num_chunks_) break;
      try {
        (*job_)(c);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
    tls_in_parallel = false;
  }

  void worker_loop(uint64_t seen) {
    for (;;) {
      auto fresh = [&] {
        return shutdown_.load() || generation_.load(std::memory_order_acquire) != seen;
      };
      if (!spin_until(fresh)) {
        std::unique_lock<std::mutex> lock(mutex_);
        ++sleepers_;
        cv_.wait(lock, fresh);
        --sleepers_;
      }
      if (shutdown_.load()) return;
      seen = generation_.load(std::memory_order_acquire);
      work();
      if (pending_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (caller_waiting_) done_cv_.notify_one();
      }
    }
  }

  std::mutex run_mutex_;  // one parallel_for at a time from outside the pool
  std::mutex mutex_;      // guards sleepers_, caller_waiting_, error_ and the waits
  std::condition_variable cv_, done_cv_;
  std::vector<std::thread> workers_;
  const std::function<void(int64_t)>* job_ = nullptr;
  int64_t num_chunks_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  std::atomic<int> pending_workers_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> shutdown_{false};
  int sleepers_ = 0;             // workers blocked on cv_
  bool caller_waiting_ = false;  // run() blocked on done_cv_
  std::exception_ptr error_;
};

int default_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

ThreadPool& pool() {
  static ThreadPool p(default_threads());
  return p;
}

}  // namespace

int num_threads() { return pool().size(); }

void set_num_threads(int n) { pool().resize(n <= 0 ? default_threads() : n); }

bool in_parallel_region() { return tls_in_parallel; }

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (end <= begin) return;
  const int64_t n = end - begin;
  grain = std::max<int64_t>(grain, 1);
  const int threads = tls_in_parallel ? 1 : num_threads();
  int64_t chunks = std::min<int64_t>(threads, (n + grain - 1) / grain);
  if (chunks <= 1) {
    fn(begin, end);
    return;
  }
  const int64_t per = (n + chunks - 1) / chunks;
  chunks = (n + per - 1) / per;
  pool().run(chunks, [&](int64_t c) {
    const int64_t b = begin + c * per;
    fn(b, std::min(end, b + per));
  });
}

}  // namespace mammoth
