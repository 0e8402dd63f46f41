// Small building blocks shared by the model families: a module list with numeric child names,
// a Linear with its own init scale, and attention with optional dropout on the probabilities.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/module.h"
#include "engine/ops.h"
#include "engine/tensor.h"

namespace mammoth::models {

// Children named "0", "1", ... so parameters read "h.3.attn.c_attn.weight" as in HF.
template <typename M>
class ModuleList : public engine::nn::Module {
 public:
  std::shared_ptr<M> add(std::shared_ptr<M> m) {
    register_module(std::to_string(items_.size()), m);
    items_.push_back(m);
    return m;
  }
  size_t size() const { return items_.size(); }
  M& operator[](size_t i) const { return *items_[i]; }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

// nn.Linear whose weight is drawn from N(0, std) (GPT-2 scales residual projections by
// 1/sqrt(2 n_layer)); biases start at zero.
class ScaledLinear : public engine::nn::Linear {
 public:
  ScaledLinear(int64_t in, int64_t out, bool bias, DType dtype, double stddev)
      : Linear(in, out, bias, dtype), stddev_(stddev) {}

 protected:
  void init_own(uint64_t seed, const std::string& prefix) override;

 private:
  double stddev_;
};

// Scaled dot-product attention over q [B, Hq, Tq, D], k and v [B, Hk, Tk, D]. With dropout
// (p > 0 and training) the probabilities are materialised and dropped as in PyTorch's eager
// attention; otherwise the fused engine::attention runs.
engine::Tensor attend(const engine::Tensor& q, const engine::Tensor& k, const engine::Tensor& v,
                      const engine::AttentionOptions& options, double dropout_p, bool training);

// [B, T, H*D] -> [B, H, T, D]
engine::Tensor split_heads(const engine::Tensor& x, int64_t heads);
// [B, H, T, D] -> [B, T, H*D]
engine::Tensor merge_heads(const engine::Tensor& x);

// Position ids offset, offset+1, ..., offset+t-1 as i64 [t].
// On `device`: forward passes make their own tensors where their input lives.
engine::Tensor positions(int64_t offset, int64_t t, Device device);

// The device of a module's first parameter (the CPU for a module without parameters).
Device module_device(const engine::nn::Module& module);

}  // namespace mammoth::models
