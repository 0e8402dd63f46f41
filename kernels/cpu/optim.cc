// CPU optimizer updates over flat buffers, in place (PyTorch's AdamW and SGD semantics).
//
// f32 AdamW runs the vectorised kernel of fast.h, which also accepts bf16/f16 gradients and
// can write a bf16/f16 copy of the updated parameters in the same pass (the CPU Adam of
// optimizer offload): inputs (param f32, grad f32|bf16|f16, m, v[, param copy bf16|f16]).
#include <cmath>
#include <type_traits>

#include "base/error.h"
#include "kernels/cpu/fast.h"
#include "kernels/cpu/register.h"
#include "kernels/params.h"

namespace mammoth::kernels::cpu {
namespace {

// inputs: param, grad, m, v (param, m, v are updated in place; outputs alias them).
template <typename T>
void adamw_kernel(std::span<const TensorArg> in, std::span<const TensorArg>, const void* params) {
  const auto* p = static_cast<const AdamWParams*>(params);
  const int64_t n = in[0].numel();
  T* w = in[0].ptr<T>();
  T* m = in[2].ptr<T>();
  T* v = in[3].ptr<T>();
  const double bc1 = 1.0 - std::pow(p->beta1, static_cast<double>(p->step));
  const double bc2 = 1.0 - std::pow(p->beta2, static_cast<double>(p->step));
  const T b1 = static_cast<T>(p->beta1), b2 = static_cast<T>(p->beta2);
  const T decay = static_cast<T>(1.0 - p->lr * p->weight_decay);
  const T step_size = static_cast<T>(p->lr / bc1);
  const T inv_sqrt_bc2 = static_cast<T>(1.0 / std::sqrt(bc2));
  const T eps = static_cast<T>(p->eps), gs = static_cast<T>(p->grad_scale);
  if constexpr (std::is_same_v<T, float>) {
    const DType gdt = in[1].dtype;
    MAMMOTH_CHECK(gdt == DType::kF32 || gdt == DType::kBF16 || gdt == DType::kF16)
        << "[adamw] f32 parameters take f32, bf16 or f16 gradients, not " << gdt;
    void* w16 = nullptr;
    DType w16dt = DType::kBF16;
    if (in.size() > 4 && in[4].data != nullptr) {
      w16 = in[4].data;
      w16dt = in[4].dtype;
      MAMMOTH_CHECK(w16dt == DType::kBF16 || w16dt == DType::kF16)
          << "[adamw] the parameter copy must be bf16 or f16, not " << w16dt;
    }
    const AdamWConsts c{b1, b2, decay, step_size, inv_sqrt_bc2, eps, gs};
    fast_kernels().adamw(w, in[1].data, gdt, m, v, w16, w16dt, n, c);
    return;
  }
  const T* g = in[1].ptr<const T>();
  parallel_for(0, n, 16384, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T gi = g[i] * gs;
      m[i] = b1 * m[i] + (T(1) - b1) * gi;
      v[i] = b2 * v[i] + (T(1) - b2) * gi * gi;
      const T denom = std::sqrt(v[i]) * inv_sqrt_bc2 + eps;
      w[i] = w[i] * decay - step_size * m[i] / denom;
    }
  });
}

// inputs: param, grad, momentum buffer (may be empty when momentum == 0).
template <typename T>
void sgd_kernel(std::span<const TensorArg> in, std::span<const TensorArg>, const void* params) {
  const auto* p = static_cast<const SgdParams*>(params);
  const int64_t n = in[0].numel();
  T* w = in[0].ptr<T>();
  const T* g = in[1].ptr<const T>();
  T* buf = p->momentum != 0.0 ? in[2].ptr<T>() : nullptr;
  const T lr = static_cast<T>(p->lr), mom = static_cast<T>(p->momentum);
  const T damp = static_cast<T>(1.0 - p->dampening), wd = static_cast<T>(p->weight_decay);
  const T gs = static_cast<T>(p->grad_scale);
  parallel_for(0, n, 16384, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      T d = g[i] * gs + wd * w[i];
      if (buf != nullptr) {
        buf[i] = p->first_step ? d : mom * buf[i] + damp * d;
        d = p->nesterov ? d + mom * buf[i] : buf[i];
      }
      w[i] -= lr * d;
    }
  });
}

}  // namespace

void register_optim(Registry& r) {
  add_float_kernels(r, Kernel::adamw, adamw_kernel<float>, adamw_kernel<double>);
  add_float_kernels(r, Kernel::sgd, sgd_kernel<float>, sgd_kernel<double>);
}

}  // namespace mammoth::kernels::cpu
