// The kernel layer's whole vocabulary: raw buffers with shapes, strides and dtypes.
//
// Kernels know nothing of Tensor or autograd. A kernel receives its inputs and outputs as
// TensorArgs (data pointer at element 0, dtype, shape, strides in elements) and a pointer to
// the op's parameter struct from kernels/params.h. Outputs are allocated by the caller.
// Unless an op's comment in op_list.h says "strided", the engine passes contiguous buffers.
#pragma once

#include <cstdint>
#include <span>

#include "base/device.h"
#include "base/dtype.h"

namespace mammoth::kernels {

inline constexpr int kMaxDims = 8;

struct TensorArg {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  bool is_contiguous() const {
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != expected) return false;
      expected *= shape[i];
    }
    return true;
  }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

using KernelFn = void (*)(std::span<const TensorArg> inputs, std::span<const TensorArg> outputs,
                          const void* params);

}  // namespace mammoth::kernels
