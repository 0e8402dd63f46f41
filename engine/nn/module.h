// Module: the building block of models, with Hugging Face style hierarchical parameter names.
//
// A module registers its parameters and child modules by name; named_parameters() walks the
// tree and joins names with dots ("h.0.attn.c_attn.weight"), so checkpoints use the names
// that Hugging Face checkpoints use. init(seed) fills every parameter from a Philox stream
// keyed by its full name: initialisation depends on the seed and the names only, never on
// construction order or the number of processes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace mammoth::engine::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// A stable 64-bit hash of a name (FNV-1a), used as its Philox stream.
uint64_t name_stream(const std::string& name);

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  NamedTensors named_parameters() const;
  std::vector<Tensor> parameters() const;
  NamedTensors named_buffers() const;
  // Every module below this one (not itself), depth first, by full name ("h.0.attn.c_attn").
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;
  int64_t num_parameters() const;
  void zero_grad() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Initialises every parameter in the tree from `seed` (see the file comment).
  void init(uint64_t seed);

 protected:
  Tensor& register_parameter(const std::string& name, Tensor t);
  Tensor& register_buffer(const std::string& name, Tensor t);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }
  // Sets this module's own parameters; `prefix` is its full name with a trailing dot.
  // Default: weights N(0, 0.02), biases 0 (GPT-2's scheme).
  virtual void init_own(uint64_t seed, const std::string& prefix);

  NamedTensors params_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;

 private:
  void collect(const std::string& prefix, NamedTensors* out, bool buffers) const;
  void init_tree(uint64_t seed, const std::string& prefix);
};

// Fills t in place with N(mean, std) from Philox(seed, stream).
void init_normal(const Tensor& t, uint64_t seed, uint64_t stream, double mean, double stddev);

// A term added to a Linear's output by something that wraps the layer without being part of
// it (LoRA, models/lora.h): its parameters stay out of the layer's (and the model's) names, so
// the model's weights load, save and export as before.
class LinearDelta {
 public:
  virtual ~LinearDelta() = default;
  // x [..., in] -> [..., out]; `training` is the wrapped layer's mode (for dropout).
  virtual Tensor forward(const Tensor& x, bool training) const = 0;
};

// y = x W^T + b, W [out, in] (PyTorch / Hugging Face nn.Linear layout); plus delta(x) when a
// delta is attached. forward is virtual so that a model's blocks hold an nn::Linear whether the
// parallel plan gave them this one or a tensor-parallel one (parallel/tensor_parallel), whose
// weight is then this rank's shard.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, DType dtype = DType::kF32);
  virtual Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  int64_t in_features, out_features;
  std::shared_ptr<const LinearDelta> delta;  // null: none
};

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t dim, DType dtype = DType::kF32);
  Tensor forward(const Tensor& ids) const;
  Tensor weight;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, DType dtype = DType::kF32);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  double eps;

 protected:
  void init_own(uint64_t seed, const std::string& prefix) override;
};

class RMSNorm : public Module {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6, DType dtype = DType::kF32);
  Tensor forward(const Tensor& x) const;
  Tensor weight;
  double eps;

 protected:
  void init_own(uint64_t seed, const std::string& prefix) override;
};

// Inverted dropout drawing its mask offsets from the process RNG (engine/nn/rng.h).
class Dropout : public Module {
 public:
  explicit Dropout(double p) : p(p) {}
  Tensor forward(const Tensor& x) const;
  double p;
};

}  // namespace mammoth::engine::nn
