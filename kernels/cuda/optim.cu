// CUDA optimizer kernels: multi-tensor fused AdamW (kernels/cuda/optim.h) and SGD. The registry's
// adamw kernel is the one-tensor case of the multi-tensor launch.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optim.h"
#include "kernels/params.h"

namespace mammoth::kernels::cuda {
namespace {

constexpr int kMaxTensors = 32;
constexpr int kThreads = 256;
constexpr int64_t kChunk = kThreads * 16;  // elements per block

struct AdamWBatch {
  int count = 0;
  float* p[kMaxTensors];
  const float* g[kMaxTensors];
  float* m[kMaxTensors];
  float* v[kMaxTensors];
  int64_t n[kMaxTensors];
  int64_t first_block[kMaxTensors + 1];
};

struct AdamWConsts {
  float b1, b2, decay, step_size, inv_sqrt_bc2, eps, gs;
};

__device__ __forceinline__ void adamw_one(float& w, float g, float& m, float& v,
                                          const AdamWConsts& c) {
  const float gi = g * c.gs;
  m = c.b1 * m + (1.0f - c.b1) * gi;
  v = c.b2 * v + (1.0f - c.b2) * gi * gi;
  const float denom = sqrtf(v) * c.inv_sqrt_bc2 + c.eps;
  w = w * c.decay - c.step_size * m / denom;
}

__global__ void __launch_bounds__(kThreads) adamw_batch(AdamWBatch batch, AdamWConsts c) {
  int t = 0;
  while (t + 1 < batch.count && blockIdx.x >= batch.first_block[t + 1]) ++t;
  const int64_t start = (blockIdx.x - batch.first_block[t]) * kChunk;
  const int64_t end = min(batch.n[t], start + kChunk);
  float* p = batch.p[t];
  const float* g = batch.g[t];
  float* m = batch.m[t];
  float* v = batch.v[t];
  const bool vec = ((reinterpret_cast<uintptr_t>(p) | reinterpret_cast<uintptr_t>(g) |
                     reinterpret_cast<uintptr_t>(m) | reinterpret_cast<uintptr_t>(v)) &
                    15) == 0;
  if (vec) {
    const int64_t vend = start + (end - start) / 4 * 4;
    for (int64_t i = start + threadIdx.x * 4; i < vend; i += kThreads * 4) {
      float4 w4 = *reinterpret_cast<float4*>(p + i);
      const float4 g4 = *reinterpret_cast<const float4*>(g + i);
      float4 m4 = *reinterpret_cast<float4*>(m + i);
      float4 v4 = *reinterpret_cast<float4*>(v + i);
      adamw_one(w4.x, g4.x, m4.x, v4.x, c);
      adamw_one(w4.y, g4.y, m4.y, v4.y, c);
      adamw_one(w4.z, g4.z, m4.z, v4.z, c);
      adamw_one(w4.w, g4.w, m4.w, v4.w, c);
      *reinterpret_cast<float4*>(p + i) = w4;
      *reinterpret_cast<float4*>(m + i) = m4;
      *reinterpret_cast<float4*>(v + i) = v4;
    }
    for (int64_t i = vend + threadIdx.x; i < end; i += kThreads)
      adamw_one(p[i], g[i], m[i], v[i], c);
  } else {
    for (int64_t i = start + threadIdx.x; i < end; i += kThreads)
      adamw_one(p[i], g[i], m[i], v[i], c);
  }
}

AdamWConsts adamw_consts(const AdamWParams& p) {
  // Exactly the CPU kernel's constants (computed in double, rounded to float).
  const double bc1 = 1.0 - std::pow(p.beta1, static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(p.beta2, static_cast<double>(p.step));
  return {static_cast<float>(p.beta1),
          static_cast<float>(p.beta2),
          static_cast<float>(1.0 - p.lr * p.weight_decay),
          static_cast<float>(p.lr / bc1),
          static_cast<float>(1.0 / std::sqrt(bc2)),
          static_cast<float>(p.eps),
          static_cast<float>(p.grad_scale)};
}

template <typename T>
void adamw_kernel(std::span<const TensorArg> in, std::span<const TensorArg>, const void* params) {
  const AdamWTensor t{in[0].ptr<float>(), in[1].ptr<const float>(), in[2].ptr<float>(),
                      in[3].ptr<float>(), in[0].numel()};
  adamw_multi_tensor({&t, 1}, *static_cast<const AdamWParams*>(params));
}

struct SgdConsts {
  float lr, mom, damp, wd, gs;
  bool nesterov, first_step;
};

__global__ void sgd_update(float* __restrict__ w, const float* __restrict__ g,
                           float* __restrict__ buf, int64_t n, SgdConsts c) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    float d = g[i] * c.gs + c.wd * w[i];
    if (buf != nullptr) {
      buf[i] = c.first_step ? d : c.mom * buf[i] + c.damp * d;
      d = c.nesterov ? d + c.mom * buf[i] : buf[i];
    }
    w[i] -= c.lr * d;
  }
}

template <typename T>
void sgd_kernel(std::span<const TensorArg> in, std::span<const TensorArg>, const void* params) {
  const auto* p = static_cast<const SgdParams*>(params);
  const int64_t n = in[0].numel();
  if (n == 0) return;
  const SgdConsts c{static_cast<float>(p->lr),
                    static_cast<float>(p->momentum),
                    static_cast<float>(1.0 - p->dampening),
                    static_cast<float>(p->weight_decay),
                    static_cast<float>(p->grad_scale),
                    p->nesterov,
                    p->first_step};
  float* buf = p->momentum != 0.0 ? in[2].ptr<float>() : nullptr;
  sgd_update<<<grid_for(n, 256), 256, 0, stream()>>>(in[0].ptr<float>(), in[1].ptr<const float>(),
                                                     buf, n, c);
  CUDA_CHECK_LAUNCH("sgd");
}

}  // namespace

void adamw_multi_tensor(std::span<const AdamWTensor> tensors, const AdamWParams& params) {
  const AdamWConsts c = adamw_consts(params);
  AdamWBatch batch;
  int64_t blocks = 0;
  auto flush = [&] {
    if (batch.count == 0) return;
    batch.first_block[batch.count] = blocks;
    MAMMOTH_CHECK(blocks < (int64_t{1} << 31)) << "[adamw] too many elements in one launch";
    adamw_batch<<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(batch, c);
    CUDA_CHECK_LAUNCH("adamw");
    batch.count = 0;
    blocks = 0;
  };
  for (const AdamWTensor& t : tensors) {
    if (t.numel == 0) continue;
    const int i = batch.count++;
    batch.p[i] = t.param;
    batch.g[i] = t.grad;
    batch.m[i] = t.m;
    batch.v[i] = t.v;
    batch.n[i] = t.numel;
    batch.first_block[i] = blocks;
    blocks += ceil_div(t.numel, kChunk);
    if (batch.count == kMaxTensors) flush();
  }
  flush();
}

void register_optim(Registry& r) {
  r.add(Kernel::adamw, DeviceType::kCUDA, DType::kF32, adamw_kernel<float>);
  r.add(Kernel::sgd, DeviceType::kCUDA, DType::kF32, sgd_kernel<float>);
}

}  // namespace mammoth::kernels::cuda
