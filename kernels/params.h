// Parameter structs passed (as const void*) to kernels; one per op family.
#pragma once

#include <algorithm>
#include <cstdint>

namespace mammoth::kernels {

struct ScalarParams {
  double value = 0.0;
};

// How an f32 matmul computes (mixed-precision autocast): kBF16 rounds both inputs to bf16 and
// accumulates in f32 (bf16 GEMM); kF16 rounds them to fp16 values (overflow becomes inf, which
// loss scaling detects) and multiplies in f32. Other dtypes ignore it.
enum class MatmulCompute : uint8_t { kNative, kBF16, kF16 };

// c = alpha * op(a) @ op(b) + beta * c, where transposes are read from the strides.
struct MatmulParams {
  double alpha = 1.0;
  double beta = 0.0;  // 1.0 accumulates into c (gradient accumulation)
  MatmulCompute compute = MatmulCompute::kNative;
};

struct NormParams {
  double eps = 1e-5;
};

struct CrossEntropyParams {
  int64_t ignore_index = -100;   // rows with this target contribute zero loss and gradient
  double label_smoothing = 0.0;  // target distribution (1-s)*onehot + s/V, as PyTorch
};

// Philox 4x32-10 keyed by seed; element i uses counter (offset + i / 4), lane i % 4, so any
// backend reproduces the same mask for the same (seed, offset).
struct DropoutParams {
  double p = 0.0;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// Rotary embedding over the last dim D of x [B, T, H, D] (rotate-half form, as Hugging Face
// LLaMA): pairs (i, i + rot/2) for i < rot/2 rotated by angle pos * base^(-2i/rot), with
// pos = position_offset + t. rot = rotary_dim (0 means D); dims >= rot pass through.
struct RopeParams {
  double base = 10000.0;
  int64_t position_offset = 0;
  int64_t rotary_dim = 0;
  bool inverse = false;  // rotate by -angle (the backward)
};

struct AttentionParams {
  double scale = 0.0;         // 0 means 1/sqrt(D)
  bool causal = false;        // query i attends to keys j <= i + (Tk - Tq)
  bool has_key_mask = false;  // inputs[3] is a bool [B, Tk] mask, true = attend
  // Causal only, > 0: a sliding window (Mistral): query i also hides keys j <= i + (Tk - Tq) -
  // window, so it sees the `window` keys ending at its own position. 0: no window.
  int64_t window = 0;
};

// Keys [begin, end) of Tk that query i of Tq may see under the causal mask and the sliding window
// (the key mask is data, applied apart). The one statement of the rule: every attention kernel
// and the profiler's FLOP count use it. begin and end never decrease with i.
struct KeyRange {
  int64_t begin, end;
};
inline KeyRange visible_keys(bool causal, int64_t window, int64_t i, int64_t Tq, int64_t Tk) {
  if (!causal) return {0, Tk};
  const int64_t last = i + (Tk - Tq);  // the query's own position among the keys
  const int64_t end = std::clamp<int64_t>(last + 1, 0, Tk);
  const int64_t begin = window > 0 ? std::clamp<int64_t>(last - window + 1, 0, end) : 0;
  return {begin, end};
}

struct AdamWParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;         // 1-based, for bias correction
  double grad_scale = 1.0;  // gradients are multiplied by this first (unscaling, clipping)
};

struct SgdParams {
  double lr = 1e-2;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = true;  // momentum buffer starts as the gradient, as PyTorch
  double grad_scale = 1.0;
};

}  // namespace mammoth::kernels
