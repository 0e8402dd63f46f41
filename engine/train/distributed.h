// What the training loop needs from a data-parallel runtime, as an interface so that engine/
// does not depend on parallel/ (which implements it: parallel::DataParallel). A loop without
// one runs a single process.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/nn/module.h"

namespace mammoth::engine::train {

// Elements [offset, offset + data.numel()) of the single-process tensor `name`, in row-major
// order; `data` is contiguous, of any shape. The unit of sharded checkpoints.
struct CheckpointPiece {
  std::string name;
  int64_t offset = 0;
  Tensor data;
};

class DataParallelRuntime {
 public:
  virtual ~DataParallelRuntime() = default;
  virtual int dp_rank() const = 0;
  virtual int dp_size() const = 0;
  // Before each micro-batch's backward; sync = true on the last micro-batch of a step.
  virtual void begin_backward(bool sync) = 0;
  // After the synchronised backward: optimizer_params() hold averaged gradients.
  virtual void finish_backward() = 0;
  // A model-parallel gradient sum per parameter (tp/sp: sequence-partial gradients), for the
  // runtime to run on each parameter of a gradient bucket just before that bucket is reduced,
  // so that the reduction still overlaps the backward. Returns false when the runtime cannot
  // (then the loop runs the whole sum after backward and reduces afterwards).
  using GradSync = std::function<void(const std::string& name, const Tensor& param)>;
  virtual bool set_grad_sync(GradSync sync) {
    (void)sync;
    return false;
  }
  // The tensors this rank's optimizer updates, and which take weight decay.
  virtual const nn::NamedTensors& optimizer_params() const = 0;
  virtual bool decays(const std::string& optimizer_param_name) const = 0;
  // Global L2 norm of the averaged gradient (collective).
  virtual double grad_norm() = 0;
  // After the optimizer step (ZeRO: all-gathers the updated shards).
  virtual void after_step() = 0;
  // Mean of a scalar over the dp group (collective), for logged losses.
  virtual double average(double value) = 0;
  virtual void barrier() = 0;
  // Sharded checkpoints (engine/train/checkpoint.h): views of the flat ranges of
  // single-process parameters and optimizer state ("<param>.<suffix>", cut from `state`, this
  // rank's optimizer state) that this rank holds. writing: only the ranges this rank writes,
  // each element by exactly one dp rank; otherwise every range it must load.
  virtual std::vector<CheckpointPiece> checkpoint_pieces(const nn::NamedTensors& state,
                                                         const std::vector<std::string>& suffixes,
                                                         bool writing) = 0;
  // After pieces were loaded into those views (ZeRO-3 drops its stale gathered buckets).
  virtual void pieces_loaded() {}
};

// A model split across the ranks of each data-parallel replica (tensor parallelism): this
// rank's parameters are shards of the single-process ones. Checkpoints map every piece of a
// shard onto the single-process tensor (no gathering: each rank writes and reads its own), so
// they resume at any tp.
class ModelShardRuntime {
 public:
  virtual ~ModelShardRuntime() = default;
  // `length` elements from local index `local` are single-process elements from `global` on
  // (both flattened row-major).
  struct FlatRun {
    int64_t global = 0, local = 0, length = 0;
  };
  // The runs covering elements [lo, hi) of this rank's tensor shaped like parameter `param`'s
  // shard (the parameter or its optimizer state), in local order; padding is in none.
  virtual std::vector<FlatRun> single_process_runs(const std::string& param, int64_t lo,
                                                   int64_t hi) const = 0;
  // Whether this rank writes its part of `param` (exactly one rank per distinct part).
  virtual bool writes(const std::string& param) const = 0;
  // The single-process parameters (their names, shapes and dtypes).
  virtual const nn::NamedTensors& single_process_parameters() const = 0;
};

}  // namespace mammoth::engine::train
