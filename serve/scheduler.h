// The serving scheduler: one thread owns the model and runs continuous batching over a paged KV
// cache (LanguageModel::forward_paged).
//
//   Scheduler s(model, {.kv_blocks = 256});
//   auto r = std::make_shared<Request>(prompt, options);   // models::GenerateOptions
//   s.submit(r);
//   while (r->wait(&seen)) ...                              // tokens arrive as they are sampled
//
// Every step, each running sequence that has consumed its prompt decodes one token, and the
// rest of the step's token budget (max_step_tokens) goes to prompt chunks of sequences still in
// prefill, so a long prompt never stalls the decodes beside it. Sequences join at any step (when
// the pool can hold them) and leave when they finish or are cancelled, freeing their blocks.
//
// Admission control: a request is admitted only when the pool can hold its worst case
// (prompt + max_tokens positions) beside the worst cases of those running, so a running
// sequence never finds the pool empty and nothing is ever preempted; the others wait in FIFO
// order. Blocks are still taken only as a sequence grows, so the metric of blocks in use is what
// the keys and values occupy. A request whose worst case exceeds the whole pool is refused at
// submit().
//
// Sampling draws are generate()'s (same Philox stream per step and seed), so a request gives
// the tokens generate() gives for the same prompt and options whenever the logits agree.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "models/generate.h"
#include "models/model.h"

namespace mammoth::serve {

// One generation request, shared by the caller (an HTTP handler) and the scheduler thread.
class Request {
 public:
  // options.on_token is not called (tokens are read with wait()); options.eos_token ends the
  // request with finish reason "stop".
  Request(std::vector<int64_t> prompt, models::GenerateOptions options);

  const std::vector<int64_t>& prompt() const { return prompt_; }
  const models::GenerateOptions& options() const { return options_; }

  // Blocks until more than tokens->size() tokens exist, the request ended, or `timeout`
  // passed; appends the new tokens to *tokens. Returns false once the request has ended (the
  // tokens appended by that call are its last).
  bool wait(std::vector<int64_t>* tokens,
            std::chrono::milliseconds timeout = std::chrono::milliseconds(100));
  // After wait() returned false: "stop" (eos), "length" (max_tokens or the context),
  // "cancelled", or "error" (then error() says why).
  std::string finish_reason() const;
  std::string error() const;

  // Asks the scheduler to drop the sequence at its next step and free its blocks (a client that
  // went away, a stop string found). Safe from any thread, any number of times.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  friend class Scheduler;
  void push(int64_t token);
  void finish(std::string reason, std::string error = "");

  const std::vector<int64_t> prompt_;
  const models::GenerateOptions options_;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int64_t> tokens_;
  bool finished_ = false;
  std::string finish_reason_, error_;
};

// What a tensor-parallel leader (serve/tp.h) does around the scheduler's steps, on the
// scheduler's thread: the other ranks must run every step this one runs, on their shards.
class StepHook {
 public:
  virtual ~StepHook() = default;
  // Just before each forward_paged step, with its inputs.
  virtual void before_step(const std::vector<int64_t>& ids,
                           const std::vector<models::PagedSequence>& seqs) = 0;
  // Nothing has run for `idle_interval` (the followers' proof that this rank is alive).
  virtual void idle() = 0;
  // The scheduler has stopped: no step follows.
  virtual void stopped() = 0;
  // A step failed here; the other ranks may be inside its collectives, so this ends the job.
  [[noreturn]] virtual void step_failed(const std::string& what) = 0;
};

struct SchedulerOptions {
  int64_t kv_blocks = 512;        // blocks in the pool
  int64_t block_size = 16;        // positions per block
  int64_t max_step_tokens = 256;  // tokens per step: decodes first, prompt chunks in the rest
  int64_t max_running = 64;       // sequences in the running batch
  StepHook* hook = nullptr;       // tensor-parallel serving: rank 0's step broadcast
  std::chrono::milliseconds idle_interval{1000};  // StepHook::idle's period
};

// A snapshot for /metrics.
struct SchedulerStats {
  int64_t requests = 0;          // submitted and admitted to the queue
  int64_t finished = 0;          // ended (any reason)
  int64_t cancelled = 0;         // ended by cancel() (a client gone, a stop string)
  int64_t prompt_tokens = 0;     // prefilled
  int64_t generated_tokens = 0;  // sampled
  int64_t steps = 0;
  int64_t waiting = 0, running = 0;
  int64_t kv_blocks_used = 0, kv_blocks_total = 0;
  double tokens_per_second = 0;  // sampled tokens over the last few seconds
  // Time from submit() to the first token, seconds: sum and count, and quantiles of the most
  // recent requests.
  double ttft_sum = 0;
  int64_t ttft_count = 0;
  double ttft_p50 = 0, ttft_p99 = 0;
};

class Scheduler {
 public:
  // The model must support forward_paged; it is put in eval mode and used only by the
  // scheduler's thread from here on.
  Scheduler(std::shared_ptr<models::LanguageModel> model, SchedulerOptions options);
  ~Scheduler();  // stop()
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request. Throws Error when it can never run: an empty prompt, a token outside the
  // vocabulary, a prompt longer than max_seq, or a worst case larger than the whole pool.
  void submit(std::shared_ptr<Request> request);
  // Ends every request ("error": the server is shutting down) and joins the thread.
  void stop();
  SchedulerStats stats() const;
  const models::ModelConfig& config() const { return model_->config(); }
  const SchedulerOptions& options() const { return options_; }
  // Blocks a request needs at most: prompt + max_tokens positions, up to max_seq.
  int64_t worst_case_blocks(const Request& r) const;

 private:
  struct Sequence {
    std::shared_ptr<Request> request;
    std::vector<int64_t> inputs;  // prompt, then each sampled token
    std::vector<int64_t> blocks;  // block table
    int64_t cached = 0;           // positions whose keys and values are in the blocks
    int64_t generated = 0;
    int64_t reserved = 0;  // worst_case_blocks
    std::chrono::steady_clock::time_point submitted;
  };
  struct Waiting {
    std::shared_ptr<Request> request;
    std::chrono::steady_clock::time_point submitted;
  };

  void loop();
  // Under mu_: admits waiting requests that fit, drops cancelled ones.
  void admit_locked();
  // One forward_paged step over the running batch; false when nothing ran.
  bool step();
  void release(Sequence* s, const std::string& reason, const std::string& error = "");

  std::shared_ptr<models::LanguageModel> model_;
  const SchedulerOptions options_;
  models::PagedKVCache cache_;
  std::vector<int64_t> free_blocks_;  // scheduler thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Waiting> waiting_;
  std::vector<Sequence> running_;  // scheduler thread; size mirrored in stats
  int64_t reserved_ = 0;           // blocks promised to running sequences
  bool stopping_ = false;
  SchedulerStats stats_;
  std::deque<std::pair<std::chrono::steady_clock::time_point, int64_t>> recent_tokens_;
  std::deque<double> recent_ttft_;
  std::thread thread_;
};

}  // namespace mammoth::serve
