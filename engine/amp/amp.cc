#include "engine/amp/amp.h"

#include <cmath>
#include <mutex>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "engine/autocast.h"
#include "engine/ops.h"
#include "kernels/params.h"

namespace mammoth::engine::amp {
namespace {

thread_local Precision t_autocast = Precision::kF32;

kernels::MatmulCompute compute_of(Precision p) {
  switch (p) {
    case Precision::kBF16:
      return kernels::MatmulCompute::kBF16;
    case Precision::kF16:
      return kernels::MatmulCompute::kF16;
    case Precision::kF32:
      break;
  }
  return kernels::MatmulCompute::kNative;
}

}  // namespace

Precision parse_precision(const std::string& name, const char* option) {
  if (name == "fp32" || name == "f32") return Precision::kF32;
  if (name == "bf16") return Precision::kBF16;
  if (name == "fp16" || name == "f16") return Precision::kF16;
  MAMMOTH_THROW() << "[amp] " << option << " must be fp32, bf16 or fp16, got '" << name << "'";
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::kF32:
      return "fp32";
    case Precision::kBF16:
      return "bf16";
    case Precision::kF16:
      return "fp16";
  }
  return "?";
}

Precision autocast_precision() { return t_autocast; }

AutocastGuard::AutocastGuard(Precision p) : previous_(t_autocast) {
  t_autocast = p;
  set_autocast_matmul_compute(compute_of(p));
}

AutocastGuard::~AutocastGuard() {
  t_autocast = previous_;
  set_autocast_matmul_compute(compute_of(previous_));
}

DynamicLossScaler::DynamicLossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.init_scale) {
  MAMMOTH_CHECK(options.init_scale > 0 && options.growth_factor >= 1 &&
                options.backoff_factor > 0 && options.backoff_factor < 1 &&
                options.growth_interval > 0)
      << "[amp] bad loss-scaler options: init " << options.init_scale << ", growth "
      << options.growth_factor << ", backoff " << options.backoff_factor << ", interval "
      << options.growth_interval;
}

bool DynamicLossScaler::update(bool grads_finite) {
  if (!grads_finite) {
    scale_ = std::max(scale_ * options_.backoff_factor, options_.min_scale);
    clean_ = 0;
    ++skipped_;
    return false;
  }
  if (++clean_ >= options_.growth_interval) {
    scale_ *= options_.growth_factor;
    clean_ = 0;
  }
  return true;
}

json::Value DynamicLossScaler::state() const {
  json::Value v = json::Value::object();
  v.set("scale", json::Value(scale_));
  v.set("clean_steps", json::Value(clean_));
  v.set("skipped_steps", json::Value(skipped_));
  return v;
}

void DynamicLossScaler::load_state(const json::Value& state) {
  scale_ = state.at("scale").as_double();
  clean_ = state.at("clean_steps").as_int();
  skipped_ = state.at("skipped_steps").as_int();
  MAMMOTH_CHECK(scale_ > 0 && std::isfinite(scale_))
      << "[amp] checkpoint loss scale " << scale_ << " is not a positive finite number";
}

bool grads_finite(const nn::NamedTensors& params) {
  for (const auto& [name, p] : params) {
    const Tensor g = p.grad();
    if (g.defined() && !all_finite(g)) return false;
  }
  return true;
}

}  // namespace mammoth::engine::amp
