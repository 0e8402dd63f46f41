// One `train --profile DIR` session: records steps [first, last), then writes
// DIR/rank_R.trace.json on every rank, DIR/merged.trace.json and DIR/summary.json on rank 0,
// and prints the summary (top ops, time by op class against its roofline bound, compute vs
// exposed communication, FLOP/s, MFU, the memory tracer's peak).
//
// Clocks: rank 0 writes its steady_clock reading to DIR/clock.json, then every rank leaves
// one barrier. Ranks on the same boot of rank 0's machine share its CLOCK_MONOTONIC and take
// that reading as time 0; others take the moment they left the barrier (off by its exit skew,
// the network's latency across hosts). The merge reads the other ranks' files from DIR, which must
// be shared by the ranks (one host, or a shared filesystem).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "engine/profile/profile.h"

namespace mammoth::profile {

struct SessionOptions {
  std::string dir;
  int64_t first = 1, last = 4;  // steps [first, last), 0-based
  int rank = 0, world = 1;
  std::function<void()> barrier;  // over all ranks; null: one process
  // The model's FLOPs per step over all ranks (mammoth analyze's count), and the machine's
  // peak FLOP/s for MFU (0: not reported).
  double flops_per_step = 0;
  std::string model_config;  // JSON of the model's config (summary.json holds it), or ""
  double peak_flops = 0;
  // The memory bandwidth (bytes/s) for the op classes' roofline bounds, beside peak_flops (0:
  // that term of the bound is left out).
  double peak_bytes_per_s = 0;
  // The allocator's peak since the last reset (the trainer resets it as each step begins) and
  // its live bytes now.
  std::function<int64_t()> allocator_peak;
  std::function<int64_t()> allocator_live;
  // This rank's parameters, gradients and optimizer states made before the session (what the
  // runtime holds): the memory tracer splits the bytes live at the start by them, in that
  // order, the rest being other persistent buffers.
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
};

// Parses "a:b" (steps [a, b), 0-based, a < b); throws naming the flag otherwise.
std::pair<int64_t, int64_t> parse_steps(const std::string& text);

class Session {
 public:
  explicit Session(SessionOptions o);
  // The trainer's step observer (TrainOptions::on_step).
  void on_step(int64_t step, bool begin);

 private:
  void finish();
  SessionOptions o_;
  int64_t origin_ns_ = 0;
  int64_t measured_peak_ = 0;  // the allocator's, over the profiled steps
  bool running_ = false, done_ = false;
};

}  // namespace mammoth::profile
