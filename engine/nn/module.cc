#include "engine/nn/module.h"

#include "engine/autograd.h"
#include "engine/nn/rng.h"
#include "engine/ops.h"

namespace mammoth::engine::nn {

uint64_t name_stream(const std::string& name) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

RngState& rng_state() {
  static RngState s;
  return s;
}

uint64_t rng_reserve(int64_t n) {
  RngState& s = rng_state();
  const uint64_t off = s.offset;
  s.offset += static_cast<uint64_t>((n + 3) / 4);
  return off;
}

void Module::collect(const std::string& prefix, NamedTensors* out, bool buffers) const {
  for (const auto& [name, t] : buffers ? buffers_ : params_) out->emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out, buffers);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", &out, false);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", &out, true);
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() const {
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out;
  for (const auto& [name, child] : children_) {
    out.emplace_back(name, child);
    for (auto& [sub, m] : child->named_modules()) out.emplace_back(name + "." + sub, m);
  }
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::zero_grad() const {
  for (const auto& [name, t] : named_parameters()) t.zero_grad();
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

Tensor& Module::register_parameter(const std::string& name, Tensor t) {
  t.requires_grad_(true);
  params_.emplace_back(name, t);
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  buffers_.emplace_back(name, t);
  return buffers_.back().second;
}

void init_normal(const Tensor& t, uint64_t seed, uint64_t stream, double mean, double stddev) {
  copy_(t, Tensor::randn(t.shape(), seed, mean, stddev, t.dtype(), stream));
}

void Module::init_own(uint64_t seed, const std::string& prefix) {
  for (auto& [name, t] : params_) {
    if (t.dim() >= 2) {
      init_normal(t, seed, name_stream(prefix + name), 0.0, 0.02);
    } else {
      fill_(t, 0.0);
    }
  }
}

void Module::init_tree(uint64_t seed, const std::string& prefix) {
  init_own(seed, prefix);
  for (auto& [name, child] : children_) child->init_tree(seed, prefix + name + ".");
}

void Module::init(uint64_t seed) {
  NoGradGuard ng;
  init_tree(seed, "");
}

Linear::Linear(int64_t in, int64_t out, bool with_bias, DType dtype)
    : in_features(in), out_features(out) {
  MAMMOTH_CHECK(in > 0 && out > 0)
      << "[Linear] sizes must be positive, got in=" << in << " out=" << out;
  weight = register_parameter("weight", Tensor::zeros({out, in}, dtype));
  if (with_bias) bias = register_parameter("bias", Tensor::zeros({out}, dtype));
}

Tensor Linear::forward(const Tensor& x) const {
  Tensor y = linear(x, weight, bias);
  return delta ? y + delta->forward(x, training_) : y;
}

Embedding::Embedding(int64_t n, int64_t dim, DType dtype) {
  MAMMOTH_CHECK(n > 0 && dim > 0) << "[Embedding] sizes must be positive, got " << n << " x "
                                  << dim;
  weight = register_parameter("weight", Tensor::zeros({n, dim}, dtype));
}

Tensor Embedding::forward(const Tensor& ids) const { return embedding(ids, weight); }

LayerNorm::LayerNorm(int64_t dim, double e, DType dtype) : eps(e) {
  weight = register_parameter("weight", Tensor::ones({dim}, dtype));
  bias = register_parameter("bias", Tensor::zeros({dim}, dtype));
}

void LayerNorm::init_own(uint64_t, const std::string&) {
  fill_(weight, 1.0);
  fill_(bias, 0.0);
}

Tensor LayerNorm::forward(const Tensor& x) const { return layer_norm(x, weight, bias, eps); }

RMSNorm::RMSNorm(int64_t dim, double e, DType dtype) : eps(e) {
  weight = register_parameter("weight", Tensor::ones({dim}, dtype));
}

void RMSNorm::init_own(uint64_t, const std::string&) { fill_(weight, 1.0); }

Tensor RMSNorm::forward(const Tensor& x) const { return rms_norm(x, weight, eps); }

Tensor Dropout::forward(const Tensor& x) const {
  if (!training_ || p == 0.0) return x;
  return dropout(x, p, rng_state().seed, rng_reserve(x.numel()), true);
}

}  // namespace mammoth::engine::nn
