// `mammoth bench plan`: the time model's predictions against `mammoth train` on this machine.
//
// It calibrates this machine first (plan/calibrate.h: the benches' measurements only, one thread
// per rank), then, for gpt2-tiny and llama-tiny at np 1 and np 2 with one global batch each,
// takes the search's first choice (plan::search, CPU-runnable plans) and a spread of valid plans
// over dp / tp / pp / sp mode / schedule / micro-batch and accumulation / ZeRO / recompute /
// offload, runs each through `mammoth train --plan FILE --threads 1` (np 2 under mpirun) for a few
// steps and compares the measured step time with plan::predict_time. On a machine shared with
// other jobs the wall time of a step depends on the neighbours, so the default measured figure
// (--stat cpu) is the median step after the first x the share of the cores the run's processes
// got (their CPU time / (ranks x wall time)): the step time on cores of its own, which is what
// calibration's CPU-clock compute figures describe. --stat min / median: the fastest / median
// wall step. Nothing measured in training feeds the predictions.
//
// It prints one row per plan (predicted, measured, error), then the median and worst absolute
// error, the Spearman rank correlation of predicted and measured times, and, per (model, world),
// how far the planner's first choice is from the fastest plan measured.
//
//   mammoth bench plan [--quick] [--steps N] [--stat cpu|min|median] [--np 1,2] [--models
//   gpt2-tiny,llama-tiny]
//       [--cluster FILE] [--mpirun "mpirun --oversubscribe --allow-run-as-root"] [--json FILE]
//       [--keep DIR]
// --quick: a quick calibration and three plans of gpt2-tiny at np 1 (the test's run).
// --cluster FILE: predict from this cluster file instead of calibrating.
// --json FILE: one object per plan and a summary object.
#pragma once

#include <string>
#include <vector>

namespace mammoth::tools {

int run_plan_bench(const std::vector<std::string>& args);

}  // namespace mammoth::tools
