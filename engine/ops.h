// Every differentiable op of the engine, as free functions.
//
// Each op checks its arguments (shapes, dtypes, devices; errors name the op and the values),
// allocates its outputs, launches the kernel registered for (kernel, device, dtype) and, when
// an input requires grad, records its backward. Ops accept non-contiguous inputs; they make a
// contiguous copy only where the kernel needs one. Binary ops broadcast like NumPy.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "engine/tensor.h"

namespace mammoth::engine {

// ---- elementwise ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);       // exact: 0.5 x (1 + erf(x / sqrt 2))
Tensor gelu_tanh(const Tensor& x);  // GPT-2's tanh approximation
Tensor silu(const Tensor& x);
Tensor add_scalar(const Tensor& x, double c);
Tensor mul_scalar(const Tensor& x, double c);
Tensor pow_scalar(const Tensor& x, double p);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);     // cond: bool
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);  // mask: bool
Tensor cast(const Tensor& x, DType dtype);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }
inline Tensor operator+(const Tensor& x, double c) { return add_scalar(x, c); }
inline Tensor operator-(const Tensor& x, double c) { return add_scalar(x, -c); }
inline Tensor operator*(const Tensor& x, double c) { return mul_scalar(x, c); }
inline Tensor operator/(const Tensor& x, double c) { return mul_scalar(x, 1.0 / c); }

// ---- reductions (dims may be negative; empty dims = all) ----
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// The sum of x^2 over every element, a scalar: a squared norm without the x * x temporary, read
// by every thread (the gradient norm's op).
Tensor sum_squares(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);  // values (first max wins)
// Sums `x` down to `shape` (the inverse of broadcasting), used by backward passes.
Tensor sum_to_shape(const Tensor& x, const Shape& shape);

// ---- linear algebra ----
// a [..., M, K] @ b [..., K, N] -> [..., M, N]; batch dims broadcast; transposed views are
// read in place.
Tensor matmul(const Tensor& a, const Tensor& b);
// x [..., in] @ w[out, in]^T + b[out]   (b may be undefined)
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

// ---- normalisation, activations over a dim ----
Tensor softmax(const Tensor& x, int64_t dim = -1);
Tensor log_softmax(const Tensor& x, int64_t dim = -1);
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

// ---- embedding and loss ----
Tensor embedding(const Tensor& ids, const Tensor& weight);  // ids i64 [...] -> [..., C]
struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};
// Mean over non-ignored rows of logits [..., V] against targets i64 [...].
Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options = {});

// ---- randomness ----
// Inverted dropout with a Philox mask keyed by (seed, offset); identity when !training or
// p == 0.
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset, bool training = true);

// ---- attention and positions ----
struct AttentionOptions {
  bool causal = false;
  double scale = 0.0;  // 0: 1/sqrt(head_dim)
  Tensor key_mask;     // optional bool [B, Tk], true = attend (padding mask)
  int64_t window = 0;  // causal only, > 0: each query sees the `window` keys ending at itself
};
// q [B, Hq, Tq, D], k and v [B, Hk, Tk, D] with Hq % Hk == 0 (grouped-query attention).
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v,
                 const AttentionOptions& options = {});
// Rotary position embedding on x [B, T, H, D] (Hugging Face LLaMA's rotate-half form).
// inv_freq (f32 [rotary_dim / 2] on x's device), when given, holds the frequencies in place of
// base^(-2i / rotary_dim): scaled rope (models/llama/rope.h).
Tensor rope(const Tensor& x, double base = 10000.0, int64_t position_offset = 0,
            int64_t rotary_dim = 0, const Tensor& inv_freq = Tensor());

// ---- joining, splitting, indexing ----
Tensor concat(const std::vector<Tensor>& tensors, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);  // index i64 [I]
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);        // torch.gather semantics

// ---- mixture of experts (engine/ops/moe.cc; models/mixtral) ----
// Rows of x [M, K] sorted by expert: rows offsets[e] .. offsets[e+1] (offsets [E+1], from 0 to
// M) go through weights[e] [N, K] (Linear layout): y [M, N], group e = x_e @ weights[e]^T. One
// grouped GEMM over all experts; an empty group is valid (its weight gradient is zero).
Tensor grouped_matmul(const Tensor& x, const std::vector<int64_t>& offsets,
                      const std::vector<Tensor>& weights);
// out [tokens, C] with out[rows[m]] += weights[m] * y[m] for m in order (rows i64 [M],
// weights [M]): expert outputs returned to their tokens, scaled by their routing weights;
// differentiable in y and weights.
Tensor moe_combine(const Tensor& y, const Tensor& rows, const Tensor& weights, int64_t tokens);

// ---- non-differentiable helpers ----
// dst <- src (broadcast, cast), in place, under no grad. dst may be a strided view.
void copy_(const Tensor& dst, const Tensor& src);
void fill_(const Tensor& dst, double value);
double max_abs(const Tensor& x);
bool all_finite(const Tensor& x);

}  // namespace mammoth::engine
