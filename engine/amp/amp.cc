#include "engine/amp/amp.h"

#include <cmath>
#include <mutex>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "base/thread_pool.h"
#include "engine/ops.h"
#include "kernels/cpu/gemm.h"
#include "kernels/params.h"
#include "kernels/registry.h"

namespace mammoth::engine::amp {
namespace {

thread_local Precision t_autocast = Precision::kF32;
kernels::KernelFn g_f32_matmul = nullptr;  // the registry's own kernel, called when not casting

// One operand [rows, cols] (element (r, c) at r*rs + c*cs) copied into a contiguous buffer in
// the layout the GEMM reads fastest: row-major when the view is, else as the row-major
// [cols, rows] matrix it is a transposed view of. `convert` rounds each element.
struct Packed {
  bool trans = false;
  int64_t ld = 0;
};

template <typename Out, typename Convert>
Packed pack(const float* src, int64_t rows, int64_t cols, int64_t rs, int64_t cs, Out* dst,
            Convert convert) {
  const bool trans = !(cs == 1 || cols == 1);
  if (!trans) {
    parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t r = b; r < e; ++r)
                     for (int64_t c = 0; c < cols; ++c)
                       dst[r * cols + c] = convert(src[r * rs + c * cs]);
                 });
    return {false, std::max<int64_t>(cols, 1)};
  }
  parallel_for(0, cols, std::max<int64_t>(1, 16384 / std::max<int64_t>(rows, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t c = b; c < e; ++c)
                   for (int64_t r = 0; r < rows; ++r)
                     dst[c * rows + r] = convert(src[r * rs + c * cs]);
               });
  return {true, std::max<int64_t>(rows, 1)};
}

uint16_t to_bf16_bits(float x) { return float_to_bf16(x).bits; }
float round_f16(float x) { return f16_to_float(float_to_f16(x)); }

// The CPU f32 matmul under autocast: (a [B,M,K], b [B,K,N]) -> c [B,M,N], as the registry's.
void autocast_matmul(std::span<const kernels::TensorArg> in,
                     std::span<const kernels::TensorArg> out, const void* params) {
  const Precision mode = t_autocast;
  if (mode == Precision::kF32) {
    g_f32_matmul(in, out, params);
    return;
  }
  const auto* p = static_cast<const kernels::MatmulParams*>(params);
  const kernels::TensorArg &a = in[0], &b = in[1], &c = out[0];
  const int64_t batch = a.shape[0], M = a.shape[1], K = a.shape[2], N = b.shape[2];
  const float alpha = static_cast<float>(p->alpha), beta = static_cast<float>(p->beta);
  if (mode == Precision::kBF16) {
    std::vector<uint16_t> ab(static_cast<size_t>(M * K)), bb(static_cast<size_t>(K * N));
    Packed la, lb;
    for (int64_t i = 0; i < batch; ++i) {
      // A batch stride of 0 broadcasts one operand: convert it once.
      if (i == 0 || a.strides[0] != 0)
        la = pack(a.ptr<const float>() + i * a.strides[0], M, K, a.strides[1], a.strides[2],
                  ab.data(), to_bf16_bits);
      if (i == 0 || b.strides[0] != 0)
        lb = pack(b.ptr<const float>() + i * b.strides[0], K, N, b.strides[1], b.strides[2],
                  bb.data(), to_bf16_bits);
      kernels::cpu::gemm_bf16(la.trans, lb.trans, M, N, K, alpha, ab.data(), la.ld, bb.data(),
                              lb.ld, beta, c.ptr<float>() + i * c.strides[0], c.strides[1]);
    }
    return;
  }
  std::vector<float> af(static_cast<size_t>(M * K)), bf(static_cast<size_t>(K * N));
  Packed la, lb;
  for (int64_t i = 0; i < batch; ++i) {
    if (i == 0 || a.strides[0] != 0)
      la = pack(a.ptr<const float>() + i * a.strides[0], M, K, a.strides[1], a.strides[2],
                af.data(), round_f16);
    if (i == 0 || b.strides[0] != 0)
      lb = pack(b.ptr<const float>() + i * b.strides[0], K, N, b.strides[1], b.strides[2],
                bf.data(), round_f16);
    kernels::cpu::sgemm(la.trans, lb.trans, M, N, K, alpha, af.data(), la.ld, bf.data(), lb.ld,
                        beta, c.ptr<float>() + i * c.strides[0], c.strides[1]);
  }
}

void install_autocast_kernel() {
  static std::once_flag once;
  std::call_once(once, [] {
    kernels::Registry& r = kernels::Registry::instance();
    g_f32_matmul = r.get(kernels::Kernel::matmul, DeviceType::kCPU, DType::kF32);
    r.add(kernels::Kernel::matmul, DeviceType::kCPU, DType::kF32, autocast_matmul);
  });
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
  if (p != Precision::kF32) install_autocast_kernel();
  t_autocast = p;
}

AutocastGuard::~AutocastGuard() { t_autocast = previous_; }

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
