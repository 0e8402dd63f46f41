// What the training loop needs from a data-parallel runtime, as an interface so that engine/
// does not depend on parallel/ (which implements it: parallel::DataParallel). A loop without
// one runs a single process.
#pragma once

#include <string>
#include <vector>

#include "engine/nn/module.h"

namespace mammoth::engine::train {

class DataParallelRuntime {
 public:
  virtual ~DataParallelRuntime() = default;
  virtual int dp_rank() const = 0;
  virtual int dp_size() const = 0;
  // Before each micro-batch's backward; sync = true on the last micro-batch of a step.
  virtual void begin_backward(bool sync) = 0;
  // After the synchronised backward: optimizer_params() hold averaged gradients.
  virtual void finish_backward() = 0;
  // The tensors this rank's optimizer updates, and which take weight decay.
  virtual const nn::NamedTensors& optimizer_params() const = 0;
  virtual bool decays(const std::string& optimizer_param_name) const = 0;
  // Global L2 norm of the averaged gradient (collective).
  virtual double grad_norm() = 0;
  // After the optimizer step (ZeRO: all-gathers the updated shards).
  virtual void after_step() = 0;
  // Mean of a scalar over the dp group (collective), for logged losses.
  virtual double average(double value) = 0;
  // Optimizer state <-> the single-process layout (see parallel/data_parallel.h).
  virtual nn::NamedTensors gather_state(const nn::NamedTensors& state,
                                        const std::vector<std::string>& suffixes) = 0;
  virtual void scatter_state(const nn::NamedTensors& full, const nn::NamedTensors& state,
                             const std::vector<std::string>& suffixes) const = 0;
  virtual void barrier() = 0;
  // Parameters that live sharded (ZeRO-3) are gathered for direct reads and writes
  // (checkpoints) and released after; `loaded` says they were overwritten.
  virtual void gather_parameters() {}
  virtual void release_parameters(bool /*loaded*/) {}
};

}  // namespace mammoth::engine::train
