// Mixed precision for training: autocast of matmuls to bf16/fp16 with fp32 master weights, and
// the dynamic loss scaler that fp16 needs.
//
// Autocast. Inside an AutocastGuard(kBF16) every f32 matmul on the CPU (forward and backward,
// so every linear layer, attention's projections and the LM head) rounds both inputs to bf16
// and multiplies them with the bf16 GEMM of kernels/cpu/gemm.h (vdpbf16ps where the CPU has
// AVX512_BF16), accumulating and writing f32: the numerics of PyTorch's CPU autocast for
// matmul, without bf16 tensors anywhere in the graph. Under kF16 the inputs are rounded to
// fp16 values (held in f32: values beyond 65504 become inf, which is what loss scaling is
// for) and multiplied by the f32 GEMM. Parameters, optimizer state, norms, softmax and the loss
// stay f32, so the master weights are the parameters themselves.
//
// How: the guard sets the thread's autocast mode (engine/autocast.h); the matmul op passes it
// to its kernel as kernels::MatmulCompute, which the CPU f32 kernel implements. On CPUs with
// AVX512_BF16 that kernel rounds the f32 operands to bf16 while packing them into the GEMM's
// panels (kernels/cpu/gemm_bf16_f32.h), so no bf16 copy of a weight or activation is kept or
// cached: a parameter update needs no invalidation. (The CUDA kernel does not read the mode
// yet: under autocast CUDA matmuls still run in f32.)
//
// Loss scaling (fp16). DynamicLossScaler follows torch.cuda.amp.GradScaler: the loss is
// multiplied by scale() before backward; a step whose gradients hold an inf or NaN is skipped
// and the scale halved; after growth_interval clean steps in a row the scale doubles.
#pragma once

#include <cstdint>
#include <string>

#include "base/json.h"
#include "engine/nn/module.h"

namespace mammoth::engine::amp {

enum class Precision { kF32, kBF16, kF16 };

// "fp32" | "bf16" | "fp16"; throws naming `option` for anything else.
Precision parse_precision(const std::string& name, const char* option = "--amp");
const char* precision_name(Precision p);

// The calling thread's autocast mode (kF32 outside any guard).
Precision autocast_precision();

// Sets the calling thread's autocast mode for its scope (nesting restores the outer mode).
class AutocastGuard {
 public:
  explicit AutocastGuard(Precision p);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  Precision previous_;
};

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0 / 65536.0;  // never scale below this (a run with NaN data stays NaN)
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(const LossScalerOptions& options = {});

  double scale() const { return scale_; }
  int64_t skipped_steps() const { return skipped_; }
  int64_t clean_steps() const { return clean_; }

  // Records the outcome of one step's gradients; returns true when the step may be applied.
  // A non-finite step halves the scale and counts as skipped.
  bool update(bool grads_finite);

  // For checkpoints: {"scale", "clean_steps", "skipped_steps"}.
  json::Value state() const;
  void load_state(const json::Value& state);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t clean_ = 0;
  int64_t skipped_ = 0;
};

// True when every parameter's gradient (where defined) is finite.
bool grads_finite(const nn::NamedTensors& params);

}  // namespace mammoth::engine::amp
