#include "engine/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "base/error.h"

namespace mammoth::data {

uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t uniform_below(uint64_t* state, uint64_t n) {
  // Lemire's multiply-shift with rejection: exact and usually one multiplication.
  unsigned __int128 m = static_cast<unsigned __int128>(splitmix64(state)) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(splitmix64(state)) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

WindowSampler::WindowSampler(int64_t num_tokens, int64_t seq_len, uint64_t seed,
                             double val_fraction, bool shuffle)
    : seq_len_(seq_len), seed_(seed), shuffle_(shuffle) {
  MAMMOTH_CHECK(seq_len >= 1) << "[sampler] sequence length " << seq_len << " must be positive";
  MAMMOTH_CHECK(val_fraction >= 0.0 && val_fraction < 1.0)
      << "[sampler] validation fraction " << val_fraction << " must be in [0, 1)";
  num_windows_ = num_tokens > 0 ? (num_tokens - 1) / seq_len : 0;
  MAMMOTH_CHECK(num_windows_ >= 1)
      << "[sampler] " << num_tokens << " tokens hold no window of sequence length " << seq_len
      << " (need at least " << seq_len + 1 << " tokens)";
  const int64_t num_val = static_cast<int64_t>(static_cast<double>(num_windows_) * val_fraction);
  num_train_ = num_windows_ - num_val;
  MAMMOTH_CHECK(num_train_ >= 1) << "[sampler] validation fraction " << val_fraction << " of "
                                 << num_windows_ << " windows leaves no training window";
}

const std::vector<int64_t>& WindowSampler::epoch_order(int64_t epoch) {
  MAMMOTH_CHECK(epoch >= 0) << "[sampler] negative epoch " << epoch;
  auto it = orders_.find(epoch);
  if (it != orders_.end()) return it->second;
  // A batch straddles at most two epochs; keep a few so alternating lookups stay cheap.
  while (orders_.size() >= 3) orders_.erase(orders_.begin());
  std::vector<int64_t> order(num_train_);
  std::iota(order.begin(), order.end(), int64_t{0});
  if (shuffle_) {
    // Mix seed and epoch through splitmix64 so nearby seeds/epochs give unrelated streams.
    uint64_t state = seed_;
    state = splitmix64(&state) ^ static_cast<uint64_t>(epoch);
    splitmix64(&state);
    for (int64_t i = num_train_ - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(uniform_below(&state, static_cast<uint64_t>(i) + 1));
      std::swap(order[i], order[j]);
    }
  }
  return orders_.emplace(epoch, std::move(order)).first->second;
}

int64_t WindowSampler::train_window_at(int64_t position) {
  MAMMOTH_CHECK(position >= 0) << "[sampler] negative stream position " << position;
  return epoch_order(position / num_train_)[position % num_train_];
}

int64_t WindowSampler::per_rank(int64_t global_batch, int dp_rank, int dp_size) {
  MAMMOTH_CHECK(dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size)
      << "[sampler] dp rank " << dp_rank << " is outside a data-parallel group of " << dp_size;
  MAMMOTH_CHECK(global_batch >= 1 && global_batch % dp_size == 0)
      << "[sampler] global batch " << global_batch << " must be a positive multiple of dp size "
      << dp_size;
  return global_batch / dp_size;
}

std::vector<int64_t> WindowSampler::train_share(int64_t first_position, int64_t global_batch,
                                                int dp_rank, int dp_size) {
  const int64_t n = per_rank(global_batch, dp_rank, dp_size);
  std::vector<int64_t> out(n);
  for (int64_t k = 0; k < n; ++k) out[k] = train_window_at(first_position + dp_rank * n + k);
  return out;
}

std::vector<int64_t> WindowSampler::batch_indices(int64_t step, int64_t global_batch, int dp_rank,
                                                  int dp_size) {
  MAMMOTH_CHECK(step >= 0) << "[sampler] negative step " << step;
  return train_share(step * global_batch, global_batch, dp_rank, dp_size);
}

std::vector<int64_t> WindowSampler::batch_epochs(int64_t step, int64_t global_batch, int dp_rank,
                                                 int dp_size) const {
  MAMMOTH_CHECK(step >= 0) << "[sampler] negative step " << step;
  const int64_t n = per_rank(global_batch, dp_rank, dp_size);
  std::vector<int64_t> out(n);
  for (int64_t k = 0; k < n; ++k) out[k] = (step * global_batch + dp_rank * n + k) / num_train_;
  return out;
}

std::vector<int64_t> WindowSampler::next_batch(int64_t global_batch, int dp_rank, int dp_size) {
  const int64_t position = state_.epoch * num_train_ + state_.offset;
  std::vector<int64_t> out = train_share(position, global_batch, dp_rank, dp_size);
  const int64_t next = position + global_batch;
  state_ = {next / num_train_, next % num_train_};
  return out;
}

void WindowSampler::set_state(const SamplerState& s) {
  MAMMOTH_CHECK(s.epoch >= 0 && s.offset >= 0 && s.offset < num_train_)
      << "[sampler] state (epoch " << s.epoch << ", offset " << s.offset << ") is invalid for "
      << num_train_ << " training windows";
  state_ = s;
}

SamplerState WindowSampler::state_after(int64_t steps, int64_t global_batch) const {
  const int64_t p = steps * global_batch;
  return {p / num_train_, p % num_train_};
}

std::vector<int64_t> WindowSampler::val_batch_indices(int64_t k, int64_t global_batch, int dp_rank,
                                                      int dp_size) const {
  MAMMOTH_CHECK(num_val_windows() > 0)
      << "[sampler] no validation windows (validation fraction is 0 or too small)";
  MAMMOTH_CHECK(k >= 0) << "[sampler] negative validation batch " << k;
  const int64_t n = per_rank(global_batch, dp_rank, dp_size);
  std::vector<int64_t> out(n);
  for (int64_t i = 0; i < n; ++i) {
    out[i] = num_train_ + (k * global_batch + dp_rank * n + i) % num_val_windows();
  }
  return out;
}

void read_window(const TokenDataset& data, const WindowSampler& sampler, int64_t w, int32_t* input,
                 int32_t* target) {
  const int64_t t = sampler.seq_len();
  MAMMOTH_CHECK(w >= 0 && w < sampler.num_windows())
      << "[sampler] window " << w << " is outside [0, " << sampler.num_windows() << ")";
  const int64_t start = sampler.window_start(w);
  data.read(start, t, input);
  data.read(start + 1, t, target);
}

}  // namespace mammoth::data
