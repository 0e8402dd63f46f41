// Optimizers (SGD with momentum/Nesterov, AdamW), global-norm gradient clipping and learning
// rate schedules. Updates run as fused kernels over each parameter's flat buffer, in place,
// with PyTorch's semantics so results can be compared with torch.optim.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/nn/module.h"
#include "kernels/kernel.h"

namespace mammoth::engine::optim {

using nn::NamedTensors;

class Optimizer {
 public:
  explicit Optimizer(NamedTensors params);
  virtual ~Optimizer() = default;
  // Applies one update from the parameters' .grad (parameters without a grad are skipped).
  // grad_scale multiplies every gradient first (clipping, loss-scale unscaling).
  virtual void step(double grad_scale = 1.0) = 0;
  void zero_grad() const;
  double lr() const { return lr_; }
  void set_lr(double lr) { lr_ = lr; }
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) { step_count_ = n; }
  const NamedTensors& params() const { return params_; }
  // Optimizer state tensors by name ("<param>.exp_avg", ...), for checkpoints.
  virtual NamedTensors state() const = 0;

 protected:
  NamedTensors params_;
  double lr_ = 0.0;
  int64_t step_count_ = 0;
};

struct SgdOptions {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(NamedTensors params, const SgdOptions& options);
  void step(double grad_scale = 1.0) override;
  NamedTensors state() const override;

 private:
  SgdOptions options_;
  std::vector<Tensor> momentum_;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// Which parameters get weight decay; the default decays matrices only (not biases, norms).
using DecayFilter = std::function<bool(const std::string& name, const Tensor& t)>;
bool decay_matrices(const std::string& name, const Tensor& t);

// PyTorch's AdamW (decoupled weight decay, bias-corrected moments), one fused kernel launch per
// parameter. The moments live in this object's tensors, or, for a subclass constructed with
// Moments::kExternal, wherever it keeps them (engine/offload keeps them in chunks on any tier):
// such a subclass overrides step() and state(), and calls begin_step() once and update() per
// parameter, so the update rule and its hyper-parameters exist once.
class AdamW : public Optimizer {
 public:
  AdamW(NamedTensors params, const AdamWOptions& options, DecayFilter decay = decay_matrices);
  void step(double grad_scale = 1.0) override;
  NamedTensors state() const override;

 protected:
  enum class Moments { kOwn, kExternal };
  AdamW(NamedTensors params, const AdamWOptions& options, DecayFilter decay, Moments moments);
  // Counts the step and fixes its gradient scale for the update() calls that follow.
  void begin_step(double grad_scale);
  // Updates parameter i in place: args = {parameter, gradient, exp_avg, exp_avg_sq}, resident
  // on `device`, shaped like the parameter.
  void update(size_t i, const std::vector<kernels::TensorArg>& args, DeviceType device) const;

 private:
  AdamWOptions options_;
  std::vector<bool> decay_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  double grad_scale_ = 1.0;
};

// The gradient of parameter `name` (p), contiguous, after checking it matches p's shape and
// dtype; undefined when p has none.
Tensor checked_grad(const std::string& name, const Tensor& p);

// L2 norm of all gradients together (parameters without grad count as zero).
double grad_norm(const NamedTensors& params);
// The sum of squared gradients (grad_norm squared), for norms assembled across processes.
double grad_sq_sum(const NamedTensors& params);
// The factor min(1, max_norm / (norm + 1e-6)) that clipping applies (1 when max_norm <= 0).
double clip_factor(double norm, double max_norm);

struct LrSchedule {
  enum class Kind { kConstant, kCosine, kLinear };
  Kind kind = Kind::kCosine;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.1;  // decay ends at base_lr * min_lr_ratio
  // Learning rate for 0-based `step`: linear warmup from base/warmup to base, then decay.
  double at(int64_t step, double base_lr) const;
  static Kind parse_kind(const std::string& name);
};

}  // namespace mammoth::engine::optim
