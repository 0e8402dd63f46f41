#include "serve/scheduler.h"

#include <algorithm>

#include "base/error.h"
#include "base/philox.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/layers.h"

namespace mammoth::serve {

using engine::Tensor;
using Clock = std::chrono::steady_clock;

namespace {
// tokens/s is measured over this window.
constexpr auto kRateWindow = std::chrono::seconds(5);
// Time-to-first-token quantiles are over this many recent requests.
constexpr size_t kTtftWindow = 1000;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// generate()'s uniform draw for `step` under `seed` (models/generate.cc): the same Philox key
// and counter, so seeded sampling here matches `mammoth generate`.
double uniform_draw(uint64_t seed, int64_t step) {
  const PhiloxOut r = philox4x32(static_cast<uint64_t>(step), 0x67656e6572617465ull, seed);
  return static_cast<double>(r.v[0]) / 4294967296.0;
}
}  // namespace

Request::Request(std::vector<int64_t> prompt, models::GenerateOptions options)
    : prompt_(std::move(prompt)), options_(std::move(options)) {}

bool Request::wait(std::vector<int64_t>* tokens, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return tokens_.size() > tokens->size() || finished_; });
  tokens->insert(tokens->end(), tokens_.begin() + static_cast<long>(tokens->size()), tokens_.end());
  return !finished_;
}

std::string Request::finish_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finish_reason_;
}

std::string Request::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void Request::push(int64_t token) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.push_back(token);
  }
  cv_.notify_all();
}

void Request::finish(std::string reason, std::string error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    finish_reason_ = std::move(reason);
    error_ = std::move(error);
  }
  cv_.notify_all();
}

Scheduler::Scheduler(std::shared_ptr<models::LanguageModel> model, SchedulerOptions options)
    : model_(std::move(model)), options_(options) {
  MAMMOTH_CHECK(model_ != nullptr) << "[serve] no model";
  MAMMOTH_CHECK(model_->supports_paged_kv())
      << "[serve] model family " << models::family_name(model_->config().family)
      << " cannot be served: it has no paged KV cache (GPT-2 and LLaMA have)";
  MAMMOTH_CHECK(options_.kv_blocks > 0)
      << "[serve] --kv-blocks must be positive, got " << options_.kv_blocks;
  MAMMOTH_CHECK(options_.block_size > 0)
      << "[serve] --kv-block-size must be positive, got " << options_.block_size;
  MAMMOTH_CHECK(options_.max_step_tokens > 0)
      << "[serve] --max-step-tokens must be positive, got " << options_.max_step_tokens;
  MAMMOTH_CHECK(options_.max_running > 0)
      << "[serve] --max-running must be positive, got " << options_.max_running;
  model_->eval();
  cache_ = model_->make_paged_cache(options_.kv_blocks, options_.block_size);
  // Lowest ids first, so a quiet server keeps reusing the same few blocks.
  for (int64_t b = options_.kv_blocks - 1; b >= 0; --b) free_blocks_.push_back(b);
  stats_.kv_blocks_total = options_.kv_blocks;
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { stop(); }

int64_t Scheduler::worst_case_blocks(const Request& r) const {
  const int64_t positions = std::min(
      static_cast<int64_t>(r.prompt().size()) + std::max<int64_t>(r.options().max_new_tokens, 1),
      config().max_seq);
  return (positions + options_.block_size - 1) / options_.block_size;
}

void Scheduler::submit(std::shared_ptr<Request> request) {
  const models::ModelConfig& c = config();
  const std::vector<int64_t>& prompt = request->prompt();
  MAMMOTH_CHECK(!prompt.empty()) << "[serve] the prompt needs at least one token";
  for (int64_t t : prompt) {
    MAMMOTH_CHECK(t >= 0 && t < c.vocab_size)
        << "[serve] prompt token " << t << " is outside the vocabulary of " << c.vocab_size;
  }
  MAMMOTH_CHECK(static_cast<int64_t>(prompt.size()) <= c.max_seq)
      << "[serve] a prompt of " << prompt.size() << " tokens exceeds the context of " << c.max_seq;
  MAMMOTH_CHECK(request->options().max_new_tokens > 0)
      << "[serve] max_tokens must be positive, got " << request->options().max_new_tokens;
  const int64_t need = worst_case_blocks(*request);
  MAMMOTH_CHECK(need <= options_.kv_blocks)
      << "[serve] the request needs up to " << need << " KV blocks of " << options_.block_size
      << " positions, more than the whole pool of " << options_.kv_blocks
      << " (--kv-blocks); shorten the prompt or max_tokens";
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      request->finish("error", "the server is shutting down");
      return;
    }
    waiting_.push_back({std::move(request), Clock::now()});
    ++stats_.requests;
    stats_.waiting = static_cast<int64_t>(waiting_.size());
  }
  cv_.notify_all();
}

void Scheduler::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulerStats s = stats_;
  const Clock::time_point now = Clock::now();
  int64_t recent = 0;
  for (const auto& [when, n] : recent_tokens_) {
    if (now - when <= kRateWindow) recent += n;
  }
  s.tokens_per_second = recent / std::chrono::duration<double>(kRateWindow).count();
  if (!recent_ttft_.empty()) {
    std::vector<double> sorted(recent_ttft_.begin(), recent_ttft_.end());
    std::sort(sorted.begin(), sorted.end());
    auto quantile = [&](double q) {
      return sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()))];
    };
    s.ttft_p50 = quantile(0.5);
    s.ttft_p99 = quantile(0.99);
  }
  return s;
}

void Scheduler::release(Sequence* s, const std::string& reason, const std::string& error) {
  for (int64_t b : s->blocks) free_blocks_.push_back(b);
  s->blocks.clear();
  {
    // The stats first: whoever wakes on finish() must see the blocks returned.
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ -= s->reserved;
    s->reserved = 0;  // marks the sequence for removal from running_
    ++stats_.finished;
    if (reason == "cancelled") ++stats_.cancelled;
    stats_.kv_blocks_used = options_.kv_blocks - static_cast<int64_t>(free_blocks_.size());
  }
  s->request->finish(reason, error);
}

void Scheduler::admit_locked() {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->request->cancelled()) {
      it->request->finish("cancelled");
      ++stats_.finished;
      ++stats_.cancelled;
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
  // FIFO: the head waits for room rather than being overtaken by smaller requests behind it.
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < options_.max_running) {
    const int64_t need = worst_case_blocks(*waiting_.front().request);
    if (reserved_ + need > options_.kv_blocks) break;
    Waiting w = std::move(waiting_.front());
    waiting_.pop_front();
    reserved_ += need;
    Sequence s;
    s.inputs = w.request->prompt();
    s.request = std::move(w.request);
    s.reserved = need;
    s.submitted = w.submitted;
    running_.push_back(std::move(s));
  }
  stats_.waiting = static_cast<int64_t>(waiting_.size());
}

bool Scheduler::step() {
  // Drop cancelled sequences first, so their blocks serve this very step.
  for (auto it = running_.begin(); it != running_.end();) {
    if (it->request->cancelled()) {
      release(&*it, "cancelled");
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    admit_locked();
  }
  if (running_.empty()) return false;

  // Decodes first (one token each), then prompt chunks in admission order within the budget.
  std::vector<Sequence*> batch;
  std::vector<int64_t> counts;
  int64_t budget = options_.max_step_tokens;
  for (Sequence& s : running_) {
    if (s.cached >= static_cast<int64_t>(s.request->prompt().size())) {
      batch.push_back(&s);
      counts.push_back(1);
      --budget;
    }
  }
  for (Sequence& s : running_) {
    const int64_t rest = static_cast<int64_t>(s.request->prompt().size()) - s.cached;
    if (rest <= 0) continue;
    if (budget <= 0) break;
    batch.push_back(&s);
    counts.push_back(std::min(rest, budget));
    budget -= counts.back();
  }
  if (batch.empty()) return false;

  std::vector<int64_t> ids;
  std::vector<models::PagedSequence> seqs;
  int64_t prefilled = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& s = *batch[i];
    const int64_t end = s.cached + counts[i];
    while (static_cast<int64_t>(s.blocks.size()) * options_.block_size < end) {
      // Admission reserved the worst case, so the pool cannot be empty here.
      MAMMOTH_CHECK(!free_blocks_.empty()) << "[serve] internal: KV pool empty despite reservation";
      s.blocks.push_back(free_blocks_.back());
      free_blocks_.pop_back();
    }
    ids.insert(ids.end(), s.inputs.begin() + s.cached, s.inputs.begin() + end);
    seqs.push_back({.blocks = &s.blocks, .start = s.cached, .count = counts[i]});
    if (s.cached < static_cast<int64_t>(s.request->prompt().size())) prefilled += counts[i];
  }

  Tensor logits;
  try {
    if (options_.hook != nullptr) options_.hook->before_step(ids, seqs);
    engine::NoGradGuard ng;
    const Device device = models::module_device(*model_);
    const int64_t n = static_cast<int64_t>(ids.size());
    logits = model_->forward_paged(Tensor::from_ints(ids, {n}).to(device), seqs, &cache_)
                 .to(Device::cpu());  // [S, V]
  } catch (const std::exception& e) {
    if (options_.hook != nullptr) options_.hook->step_failed(e.what());
    // A failed step fails the sequences in it, never the server.
    for (Sequence* s : batch) s->request->cancel();
    for (auto it = running_.begin(); it != running_.end();) {
      if (it->request->cancelled()) {
        release(&*it, "error", e.what());
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    return true;
  }

  const Clock::time_point now = Clock::now();
  int64_t sampled = 0;
  std::vector<Sequence*> done;
  std::vector<std::string> reasons;
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& s = *batch[i];
    s.cached += counts[i];
    if (s.cached < static_cast<int64_t>(s.inputs.size())) continue;  // prompt still prefilling
    const models::GenerateOptions& o = s.request->options();
    const std::vector<double> row = logits.select(0, static_cast<int64_t>(i)).to_vector();
    const int64_t next = models::sample_token(row, o, uniform_draw(o.seed, s.generated));
    if (s.generated == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      const double ttft = seconds_between(s.submitted, now);
      stats_.ttft_sum += ttft;
      ++stats_.ttft_count;
      recent_ttft_.push_back(ttft);
      if (recent_ttft_.size() > kTtftWindow) recent_ttft_.pop_front();
    }
    ++s.generated;
    ++sampled;
    s.inputs.push_back(next);
    s.request->push(next);
    // generate()'s ends: eos, max_new_tokens, or a cache full at max_seq.
    if (next == o.eos_token) {
      done.push_back(&s);
      reasons.push_back("stop");
    } else if (s.generated >= o.max_new_tokens || s.cached >= config().max_seq) {
      done.push_back(&s);
      reasons.push_back("length");
    }
  }
  for (size_t i = 0; i < done.size(); ++i) release(done[i], reasons[i]);
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [](const Sequence& s) { return s.reserved == 0; }),
                 running_.end());
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.steps;
  stats_.prompt_tokens += prefilled;
  stats_.generated_tokens += sampled;
  recent_tokens_.emplace_back(now, sampled);
  while (!recent_tokens_.empty() && now - recent_tokens_.front().first > kRateWindow) {
    recent_tokens_.pop_front();
  }
  return true;
}

void Scheduler::loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] { return stopping_ || !waiting_.empty() || !running_.empty(); };
      if (options_.hook == nullptr) {
        cv_.wait(lock, ready);
      } else if (!cv_.wait_for(lock, options_.idle_interval, ready)) {
        lock.unlock();
        options_.hook->idle();
        continue;
      }
      if (stopping_) break;
    }
    step();
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.running = static_cast<int64_t>(running_.size());
      stats_.kv_blocks_used = options_.kv_blocks - static_cast<int64_t>(free_blocks_.size());
    }
  }
  for (Sequence& s : running_) release(&s, "error", "the server is shutting down");
  running_.clear();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Waiting& w : waiting_) w.request->finish("error", "the server is shutting down");
    waiting_.clear();
    stats_.running = 0;
    stats_.waiting = 0;
    stats_.kv_blocks_used = options_.kv_blocks - static_cast<int64_t>(free_blocks_.size());
  }
  if (options_.hook != nullptr) options_.hook->stopped();
}

}  // namespace mammoth::serve
