// Internal to the CPU backend: the table of fused, vectorised f32 kernels, one instance per
// instruction set (fast_avx512.cc, fast_avx2.cc, fast_portable.cc, all compiled from
// fast_impl.h), picked at run time by simd.h's setting.
//
// The op files (nn.cc, attention.cc, optim.cc) route f32 through fast_kernels() and keep their
// plain loops for f64, which stay the reference. Every entry threads over base's pool itself
// and keeps each output's arithmetic independent of the thread count (rows are never split;
// cross-row sums go through fixed blocks added in a fixed order).
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "kernels/cpu/simd.h"
#include "kernels/params.h"

namespace mammoth::kernels::cpu {

// Scalar constants of one AdamW step, precomputed by the caller from AdamWParams.
struct AdamWConsts {
  float b1, b2, decay, step_size, inv_sqrt_bc2, eps, grad_scale;
};

// One attention call; geometry as kernels/op_list.h's attention. key_mask is [B, Tk] or null.
struct AttnArgs {
  int64_t B, Hq, Hk, Tq, Tk, D;
  float scale;
  bool causal;
  int64_t window;  // params.h's AttentionParams::window
  const bool* key_mask;
  const float* q;
  const float* k;
  const float* v;
  float* out;         // forward output; backward: the saved output (read only)
  float* lse;         // forward output; backward: the saved lse (read only)
  const float* dout;  // backward only
  float* dq;
  float* dk;
  float* dv;
};

struct FastKernels {
  // Over the last dim of contiguous [rows, n].
  void (*softmax)(const float* x, float* y, int64_t rows, int64_t n);
  void (*log_softmax)(const float* x, float* y, int64_t rows, int64_t n);
  void (*softmax_backward)(const float* dy, const float* y, float* dx, int64_t rows, int64_t n);
  void (*log_softmax_backward)(const float* dy, const float* y, float* dx, int64_t rows, int64_t n);
  void (*layer_norm)(const float* x, const float* w, const float* b, float* y, float* mean,
                     float* rstd, int64_t rows, int64_t n, double eps);
  void (*layer_norm_backward)(const float* dy, const float* x, const float* w, const float* mean,
                              const float* rstd, float* dx, float* dw, float* db, int64_t rows,
                              int64_t n);
  void (*rms_norm)(const float* x, const float* w, float* y, float* rstd, int64_t rows, int64_t n,
                   double eps);
  void (*rms_norm_backward)(const float* dy, const float* x, const float* w, const float* rstd,
                            float* dx, float* dw, int64_t rows, int64_t n);
  // y[m] = the sum of x[m, :]^2 over contiguous [rows, n] (a gradient's squared norm).
  void (*sum_sq)(const float* x, float* y, int64_t rows, int64_t n);
  // y[j] = the sum of x[:, j] over contiguous [rows, n] (a bias gradient), rows added in order.
  void (*sum_rows)(const float* x, float* y, int64_t rows, int64_t n);
  void (*cross_entropy)(const float* x, const int64_t* target, float* loss, float* lse,
                        int64_t rows, int64_t v, int64_t ignore_index, double smoothing);
  void (*cross_entropy_backward)(const float* dloss, const float* x, const int64_t* target,
                                 const float* lse, float* dx, int64_t rows, int64_t v,
                                 int64_t ignore_index, double smoothing);
  // Flat AdamW: grad g is f32, bf16 or f16 (gdt); w16 (bf16/f16 per w16dt, or null) receives a
  // rounded copy of the updated parameters in the same pass.
  void (*adamw)(float* w, const void* g, DType gdt, float* m, float* v, void* w16, DType w16dt,
                int64_t n, const AdamWConsts& c);
  void (*attention)(const AttnArgs& a);
  void (*attention_backward)(const AttnArgs& a);
  // Contiguous runs, not threaded (elementwise.cc's StridedLoop splits the work); `stream`
  // writes the output with non-temporal stores (see stream_output).
  void (*gelu_tanh)(const float* x, float* y, int64_t n, bool stream);
  void (*gelu_tanh_backward)(const float* dy, const float* x, float* dx, int64_t n, bool stream);
  void (*gelu)(const float* x, float* y, int64_t n, bool stream);  // erf form, Phi to ~1.5e-7
  void (*gelu_backward)(const float* dy, const float* x, float* dx, int64_t n, bool stream);
  void (*silu)(const float* x, float* y, int64_t n, bool stream);
  void (*silu_backward)(const float* dy, const float* x, float* dx, int64_t n, bool stream);
  // y = e^x over a contiguous run with the vector exp the kernels above use (the exp_nonpos
  // variant when `nonpos`: arguments known to be <= 88, as softmax's x - max); for tests of its
  // accuracy over the whole float range.
  void (*exp)(const float* x, float* y, int64_t n, bool nonpos);
};

// True when an output of this many bytes should bypass the caches (non-temporal stores): it is
// larger than the last-level cache, so plain stores would only add a read-for-ownership of
// every line before it is evicted unread.
bool stream_output(int64_t bytes);

// The table for the active ISA (simd.h).
const FastKernels& fast_kernels();

namespace avx512 {
const FastKernels& fast_kernels();
}
namespace avx2 {
const FastKernels& fast_kernels();
}
namespace portable {
const FastKernels& fast_kernels();
}

}  // namespace mammoth::kernels::cpu
