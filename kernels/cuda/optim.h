// Fused optimizer updates on the GPU. adamw_multi_tensor updates many parameter tensors with
// one launch per 32 tensors (the apex / torch "fused" AdamW idea), so a model with hundreds of
// small tensors is not launch-bound. Same arithmetic as kernels/cpu/optim.cc, in fp32.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/params.h"

namespace mammoth::kernels::cuda {

struct AdamWTensor {
  float* param = nullptr;
  const float* grad = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  int64_t numel = 0;
};

// Updates every tensor in place on memory::cuda::current_stream().
void adamw_multi_tensor(std::span<const AdamWTensor> tensors, const AdamWParams& params);

}  // namespace mammoth::kernels::cuda
