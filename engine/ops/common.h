// Internal helpers shared by the engine's op files: argument checks and kernel launch.
#pragma once

#include <initializer_list>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/params.h"
#include "kernels/registry.h"

namespace mammoth::engine::detail {

// Brings paged storage (offload, ZeRO-3) onto the compute device before its address is taken.
inline void make_resident(const Tensor& t, bool write) {
  if (t.defined() && t.storage()->ensure_resident) t.storage()->ensure_resident(write);
}

// Launches the `kernel` registered for `key`'s device and dtype.
inline void launch_for(const Tensor& key, kernels::Kernel kernel,
                       std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs,
                       const void* params = nullptr) {
  // Paged storage first (all of it, before any address is taken: a load may move `data`).
  for (const Tensor& t : inputs) make_resident(t, false);
  for (const Tensor& t : outputs) make_resident(t, true);
  std::vector<kernels::TensorArg> in, out;
  for (const Tensor& t : inputs) in.push_back(t.defined() ? t.arg() : kernels::TensorArg{});
  for (const Tensor& t : outputs) out.push_back(t.arg());
  kernels::launch(kernel, key.device().type, key.dtype(), in, out, params);
}

// Launches `kernel` for the dtype of the first input (or first output when there is none).
inline void launch(kernels::Kernel kernel, std::initializer_list<Tensor> inputs,
                   std::initializer_list<Tensor> outputs, const void* params = nullptr) {
  launch_for(inputs.size() ? *inputs.begin() : *outputs.begin(), kernel, inputs, outputs, params);
}

// Same dtype and device for every defined tensor; names `op` and both values otherwise.
void check_same(const char* op, std::initializer_list<Tensor> tensors);
void check_floating(const char* op, const Tensor& t);
void check_dtype(const char* op, const char* arg, const Tensor& t, DType expected);
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);

}  // namespace mammoth::engine::detail
