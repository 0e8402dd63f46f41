// Internal helpers shared by the engine's op files: argument checks and kernel launch.
#pragma once

#include <initializer_list>
#include <vector>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/profile/profile.h"
#include "kernels/params.h"
#include "kernels/registry.h"

namespace mammoth::engine::detail {

// Brings paged storage (offload, ZeRO-3) onto the compute device before its address is taken.
inline void make_resident(const Tensor& t, bool write) {
  if (t.defined() && t.storage()->ensure_resident) t.storage()->ensure_resident(write);
}

// 16-bit parameters are a storage format (eval / generate --dtype bf16|f16 halve the resident
// weights): an op whose activation is f32 reads a bf16 / f16 weight widened to f32, so the
// compute and its numerics stay those of f32. Any other pairing is returned as it is (and the
// op's dtype checks see it).
inline Tensor widen_weight(const Tensor& w, const Tensor& x) {
  if (!w.defined() || x.dtype() != DType::kF32) return w;
  if (w.dtype() != DType::kBF16 && w.dtype() != DType::kF16) return w;
  return cast(w, DType::kF32);
}

// A kernel launch's profile args (engine/profile): dtype, device, the first input's and output's
// shapes, the bytes its arguments span, for matmuls and attention their FLOPs (attention:
// the visible query-key pairs only, as the kernels skip masked blocks), "backward":true inside
// autograd's backward, and its module: that of a parameter it reads, else the last one this
// thread saw (a gelu or a residual add is named by the module it follows).
void describe_launch(kernels::Kernel kernel, const Tensor& key,
                     const std::vector<kernels::TensorArg>& in,
                     const std::vector<kernels::TensorArg>& out, const void* params, char* args);

// Launches the `kernel` registered for `key`'s device and dtype. Inputs and outputs are any
// ranges of Tensors (a kernel with one input per expert takes vectors).
template <typename Inputs, typename Outputs>
void launch_range(const Tensor& key, kernels::Kernel kernel, const Inputs& inputs,
                  const Outputs& outputs, const void* params = nullptr) {
  // Paged storage first (all of it, before any address is taken: a load may move `data`).
  for (const Tensor& t : inputs) make_resident(t, false);
  for (const Tensor& t : outputs) make_resident(t, true);
  // A later argument's page-in may have moved an earlier one out again (a device cache too
  // small for all of this launch's chunks at once, e.g. two tensors that span chunks): its
  // address is then null, and the kernel would read it.
  auto check_paged_in = [kernel](const Tensor& t) {
    if (!t.defined() || !t.storage()->ensure_resident || t.storage()->data != nullptr) return;
    MAMMOTH_THROW() << "[" << kernels::kernel_name(kernel) << "] an argument of shape "
                    << shape_str(t.shape())
                    << " was paged out by another argument's page-in: the device memory budget "
                       "cannot hold all of this kernel's chunks at once (raise --device-mem, or "
                       "lower --chunk-mb)";
  };
  for (const Tensor& t : inputs) check_paged_in(t);
  for (const Tensor& t : outputs) check_paged_in(t);
  std::vector<kernels::TensorArg> in, out;
  for (const Tensor& t : inputs) in.push_back(t.defined() ? t.arg() : kernels::TensorArg{});
  for (const Tensor& t : outputs) out.push_back(t.arg());
  profile::Scope scope(profile::Lane::kCompute, kernels::kernel_name(kernel));
  if (scope.active()) describe_launch(kernel, key, in, out, params, scope.args());
  kernels::launch(kernel, key.device().type, key.dtype(), in, out, params);
}

inline void launch_for(const Tensor& key, kernels::Kernel kernel,
                       std::initializer_list<Tensor> inputs, std::initializer_list<Tensor> outputs,
                       const void* params = nullptr) {
  launch_range(key, kernel, inputs, outputs, params);
}

// Launches `kernel` for the dtype of the first input (or first output when there is none).
inline void launch(kernels::Kernel kernel, std::initializer_list<Tensor> inputs,
                   std::initializer_list<Tensor> outputs, const void* params = nullptr) {
  launch_for(inputs.size() ? *inputs.begin() : *outputs.begin(), kernel, inputs, outputs, params);
}

// Whether `t` may be written over: true when the handle given is the only one, to a TensorImpl
// that is the only one on its storage, and t is a contiguous CPU tensor of our own allocator with
// `like`'s shape and dtype. Callers pass a handle they own: the backward pass's to a node's
// incoming gradient (autograd.cc hands each node its output gradients and drops them after it),
// or a node's own saved tensor in its one backward. A gradient passed to two inputs (add's), a
// seed the caller holds, or a view of a tensor still alive all fail it; so do CUDA tensors (the
// CUDA kernels are not asked to write over their inputs) and paged or external memory.
inline bool overwritable(const Tensor& t, const Tensor& like) {
  return t.defined() && t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1 &&
         t.device().is_cpu() && like.device().is_cpu() && t.dtype() == like.dtype() &&
         t.shape() == like.shape() && t.is_contiguous() && !t.storage()->ensure_resident &&
         !t.storage()->release;
}

// The output of a backward kernel that accepts dx over its input dy ("dx may be dy",
// kernels/op_list.h; cross_entropy's over its saved logits): dy itself where it is overwritable,
// else a new tensor shaped like `like`. Saves a gradient-sized allocation per op, and the kernel's
// stores hit lines it just read (fast_impl.h, in_place).
inline Tensor grad_buffer(const Tensor& dy, const Tensor& like) {
  return overwritable(dy, like) ? dy : Tensor::empty(like.shape(), like.dtype(), like.device());
}

// Same dtype and device for every defined tensor; names `op` and both values otherwise.
void check_same(const char* op, std::initializer_list<Tensor> tensors);
void check_floating(const char* op, const Tensor& t);
void check_dtype(const char* op, const char* arg, const Tensor& t, DType expected);
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);

}  // namespace mammoth::engine::detail
