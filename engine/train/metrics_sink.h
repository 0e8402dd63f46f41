// Where a training step's figures go: the console progress line (every log_every steps, the
// last step, and any step that evaluated), one JSON line per step in --metrics, and TensorBoard
// scalars. Only the logging rank has a sink that writes; the others' record() does nothing.
#pragma once

#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "base/json.h"
#include "engine/train/tensorboard.h"

namespace mammoth::engine::train {

struct StepRecord {
  int64_t step = 0;   // steps completed, 1-based
  int64_t steps = 0;  // the run's total
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double loss_scale = 1.0;  // the scale this step ran under
  bool scaling = false;     // fp16 dynamic loss scaling is on
  int64_t skipped_steps = 0;
  bool applied = true;  // false: an fp16 step skipped for inf/NaN gradients
  double tokens_per_s = 0;
  double step_s = 0;  // wall time of the step
  // CPU time this process used in the step (all its threads): below step_s x threads the
  // process lost its cores to other jobs, or waited without spinning.
  double cpu_s = 0;
  double predicted_step_s = 0;  // the planner's prediction (0: none)
  double mfu = 0;               // 0: not reported
  int64_t peak_mem_bytes = 0;
  int64_t predicted_peak_mem_bytes = 0;  // the planner's prediction for this rank (0: none)
  double val_loss = 0;                   // NaN: not evaluated this step
  double val_accuracy = NAN;             // classification's; NaN: not measured this step
  double eta_s = 0;
  json::Value offload;     // chunk tiers (null: no offload)
  json::Value grad_norms;  // --log-grad-norms: module -> unscaled gradient L2 norm (null: none)
  json::Value extra;       // TrainOptions::step_metrics' members (null: none)
};

struct MetricsSinkOptions {
  bool console = true;       // progress lines on stderr
  int64_t log_every = 1;     // a progress line every N steps
  std::string metrics_path;  // JSON lines (empty: none)
  bool append = false;       // resuming: append to metrics_path
  std::string tensorboard_dir;
};

class MetricsSink {
 public:
  explicit MetricsSink(const MetricsSinkOptions& options);
  ~MetricsSink();
  void record(const StepRecord& r);

 private:
  MetricsSinkOptions options_;
  std::ofstream metrics_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
};

// "h:mm:ss".
std::string format_duration(double seconds);

}  // namespace mammoth::engine::train
