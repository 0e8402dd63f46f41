#include "engine/optim/optim.h"

#include <cmath>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/params.h"
#include "kernels/registry.h"

namespace mammoth::engine::optim {

using kernels::Kernel;

Optimizer::Optimizer(NamedTensors params) : params_(std::move(params)) {
  for (const auto& [name, t] : params_) {
    MAMMOTH_CHECK(t.is_contiguous() && is_floating(t.dtype()))
        << "[optimizer] parameter '" << name << "' must be a contiguous floating-point tensor";
  }
}

void Optimizer::zero_grad() const {
  for (const auto& [name, t] : params_) t.zero_grad();
}

namespace {
// Paged storage (ZeRO-3 shards on NVMe, memory/chunks) comes in before its address is taken, as
// engine/ops launches do; an update writes every tensor but the gradient (index 1).
std::vector<kernels::TensorArg> resident_args(const std::vector<Tensor>& tensors) {
  std::vector<kernels::TensorArg> args;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.defined() && t.storage()->ensure_resident) t.storage()->ensure_resident(i != 1);
  }
  for (const Tensor& t : tensors) args.push_back(t.defined() ? t.arg() : kernels::TensorArg{});
  return args;
}
}  // namespace

Tensor checked_grad(const std::string& name, const Tensor& p) {
  Tensor g = p.grad();
  if (!g.defined()) return g;
  MAMMOTH_CHECK(g.shape() == p.shape() && g.dtype() == p.dtype())
      << "[optimizer] gradient of '" << name << "' has shape " << shape_str(g.shape()) << " "
      << dtype_name(g.dtype()) << " but the parameter is " << shape_str(p.shape()) << " "
      << dtype_name(p.dtype());
  return g.is_contiguous() ? g : g.contiguous();
}

SGD::SGD(NamedTensors params, const SgdOptions& options)
    : Optimizer(std::move(params)), options_(options) {
  MAMMOTH_CHECK(options.lr >= 0) << "[SGD] lr must be >= 0, got " << options.lr;
  MAMMOTH_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0))
      << "[SGD] nesterov needs momentum > 0 and zero dampening";
  lr_ = options.lr;
  for (const auto& [name, t] : params_) {
    momentum_.push_back(options.momentum != 0 ? Tensor::zeros(t.shape(), t.dtype(), t.device())
                                              : Tensor());
  }
}

void SGD::step(double grad_scale) {
  NoGradGuard ng;
  kernels::SgdParams p;
  p.lr = lr_;
  p.momentum = options_.momentum;
  p.dampening = options_.dampening;
  p.weight_decay = options_.weight_decay;
  p.nesterov = options_.nesterov;
  p.first_step = step_count_ == 0;
  p.grad_scale = grad_scale;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor g = checked_grad(params_[i].first, params_[i].second);
    if (!g.defined()) continue;
    const Tensor& param = params_[i].second;
    kernels::launch(Kernel::sgd, param.device().type, param.dtype(),
                    resident_args({param, g, momentum_[i]}), {}, &p);
  }
  ++step_count_;
}

NamedTensors SGD::state() const {
  NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (momentum_[i].defined())
      out.emplace_back(params_[i].first + ".momentum_buffer", momentum_[i]);
  }
  return out;
}

bool decay_matrices(const std::string&, const Tensor& t) { return t.dim() >= 2; }

AdamW::AdamW(NamedTensors params, const AdamWOptions& options, DecayFilter decay)
    : AdamW(std::move(params), options, std::move(decay), Moments::kOwn) {}

AdamW::AdamW(NamedTensors params, const AdamWOptions& options, DecayFilter decay, Moments moments)
    : Optimizer(std::move(params)), options_(options) {
  MAMMOTH_CHECK(options.lr >= 0) << "[AdamW] lr must be >= 0, got " << options.lr;
  MAMMOTH_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1)
      << "[AdamW] betas must be in [0, 1), got (" << options.beta1 << ", " << options.beta2 << ")";
  lr_ = options.lr;
  for (const auto& [name, t] : params_) {
    decay_.push_back(decay(name, t));
    if (moments == Moments::kExternal) continue;
    exp_avg_.push_back(Tensor::zeros(t.shape(), t.dtype(), t.device()));
    exp_avg_sq_.push_back(Tensor::zeros(t.shape(), t.dtype(), t.device()));
  }
}

void AdamW::begin_step(double grad_scale) {
  ++step_count_;
  grad_scale_ = grad_scale;
}

void AdamW::update(size_t i, const std::vector<kernels::TensorArg>& args, DeviceType device) const {
  kernels::AdamWParams p;
  p.lr = lr_;
  p.beta1 = options_.beta1;
  p.beta2 = options_.beta2;
  p.eps = options_.eps;
  p.step = step_count_;
  p.grad_scale = grad_scale_;
  p.weight_decay = decay_[i] ? options_.weight_decay : 0.0;
  kernels::launch(Kernel::adamw, device, args[0].dtype, args, {}, &p);
}

void AdamW::step(double grad_scale) {
  NoGradGuard ng;
  begin_step(grad_scale);
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [name, param] = params_[i];
    const Tensor g = checked_grad(name, param);
    if (!g.defined()) continue;
    update(i, resident_args({param, g, exp_avg_[i], exp_avg_sq_[i]}), param.device().type);
  }
}

NamedTensors AdamW::state() const {
  NamedTensors out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.emplace_back(params_[i].first + ".exp_avg", exp_avg_[i]);
    out.emplace_back(params_[i].first + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  return out;
}

double grad_sq_sum(const NamedTensors& params) {
  NoGradGuard ng;
  double total = 0;
  for (const auto& [name, t] : params) {
    const Tensor g = t.grad();
    if (!g.defined()) continue;
    total += sum_squares(g).item();
  }
  return total;
}

double grad_norm(const NamedTensors& params) { return std::sqrt(grad_sq_sum(params)); }

double clip_factor(double norm, double max_norm) {
  if (max_norm <= 0 || !std::isfinite(norm)) return 1.0;
  return std::min(1.0, max_norm / (norm + 1e-6));
}

double LrSchedule::at(int64_t step, double base_lr) const {
  if (warmup_steps > 0 && step < warmup_steps) {
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (kind == Kind::kConstant) return base_lr;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::clamp(
      static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  const double min_lr = base_lr * min_lr_ratio;
  if (kind == Kind::kLinear) return base_lr - (base_lr - min_lr) * progress;
  return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

LrSchedule::Kind LrSchedule::parse_kind(const std::string& name) {
  if (name == "constant") return Kind::kConstant;
  if (name == "cosine") return Kind::kCosine;
  if (name == "linear") return Kind::kLinear;
  MAMMOTH_THROW() << "[lr-schedule] unknown schedule '" << name
                  << "' (expected constant, cosine or linear)";
}

}  // namespace mammoth::engine::optim
