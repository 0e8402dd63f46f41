// Which token windows each training step reads, on every data-parallel rank.
//
// A dataset of N tokens is cut into W = (N - 1) / T windows of T + 1 tokens (window w starts at
// token w * T; its first T tokens are the input, its last T the targets). The last
// floor(W * val_fraction) windows are held out for validation. Training reads an endless stream
// of the training windows, each epoch in its own seeded order; global batch s is stream
// positions [s * B, (s + 1) * B), and dp rank r reads the contiguous share
// [r * B / dp, (r + 1) * B / dp) of it. A batch may straddle two epochs.
//
// The order depends only on (seed, epoch): a Fisher-Yates shuffle driven by splitmix64 with our
// own unbounded-to-bounded draw, so it is identical across compilers and standard libraries
// (std::shuffle and std::uniform_int_distribution are not). The stream position is the
// checkpointable state: resuming from state() continues the exact same order.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "engine/data/token_shard.h"

namespace mammoth::data {

struct SamplerState {
  int64_t epoch = 0;
  int64_t offset = 0;  // training windows already read in this epoch
  bool operator==(const SamplerState&) const = default;
};

class WindowSampler {
 public:
  // shuffle=false reads windows in order (for evaluation and debugging).
  WindowSampler(int64_t num_tokens, int64_t seq_len, uint64_t seed, double val_fraction = 0.0,
                bool shuffle = true);

  int64_t seq_len() const { return seq_len_; }
  int64_t num_windows() const { return num_windows_; }
  int64_t num_train_windows() const { return num_train_; }
  int64_t num_val_windows() const { return num_windows_ - num_train_; }
  // First token of window w (tokens [start, start + seq_len + 1)).
  int64_t window_start(int64_t w) const { return w * seq_len_; }

  // dp_rank's share of global batch `step` (global_batch windows in all; global_batch must be a
  // multiple of dp_size). Stateless: any step, in any order.
  std::vector<int64_t> batch_indices(int64_t step, int64_t global_batch, int dp_rank = 0,
                                     int dp_size = 1);
  // The epoch in which each window of batch_indices(step, ...) is read (a batch may straddle
  // two), for what is keyed on it (masked-LM's dynamic masks).
  std::vector<int64_t> batch_epochs(int64_t step, int64_t global_batch, int dp_rank = 0,
                                    int dp_size = 1) const;
  // The training window at stream position p (p = epoch * num_train_windows() + offset).
  int64_t train_window_at(int64_t position);
  // The order of the training windows in `epoch`.
  const std::vector<int64_t>& epoch_order(int64_t epoch);

  // Stateful reading: the batch at the current position, then advance by global_batch.
  std::vector<int64_t> next_batch(int64_t global_batch, int dp_rank = 0, int dp_size = 1);
  SamplerState state() const { return state_; }
  void set_state(const SamplerState& s);
  // The state after `steps` batches of global_batch from the start.
  SamplerState state_after(int64_t steps, int64_t global_batch) const;

  // dp_rank's share of validation batch k: validation windows in order, wrapping around.
  std::vector<int64_t> val_batch_indices(int64_t k, int64_t global_batch, int dp_rank = 0,
                                         int dp_size = 1) const;

 private:
  // Windows per rank; checks the rank and batch arguments.
  static int64_t per_rank(int64_t global_batch, int dp_rank, int dp_size);
  std::vector<int64_t> train_share(int64_t first_position, int64_t global_batch, int dp_rank,
                                   int dp_size);

  int64_t seq_len_;
  uint64_t seed_;
  bool shuffle_;
  int64_t num_windows_;
  int64_t num_train_;
  SamplerState state_;
  std::map<int64_t, std::vector<int64_t>> orders_;  // the few most recent epochs
};

// Uniform integer in [0, n) from a 64-bit generator state (splitmix64), without modulo bias.
// Exposed for tests.
uint64_t splitmix64(uint64_t* state);
uint64_t uniform_below(uint64_t* state, uint64_t n);

// Copies window `w` of `sampler` from `data`: input = tokens[start, start + T),
// target = tokens[start + 1, start + T + 1).
void read_window(const TokenDataset& data, const WindowSampler& sampler, int64_t w, int32_t* input,
                 int32_t* target);

}  // namespace mammoth::data
