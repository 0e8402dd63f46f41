// The kernel inventory: every kernel the registry can hold, declared once.
//
// X(name, inputs -> outputs, params struct). Adding a kernel means one line here, a CPU
// implementation registered in kernels/cpu/, a CUDA one in kernels/cuda/, and a front end in
// engine/ops. kKernelCount is checked at compile time by the registry so an inventory change
// is noticed by every backend's table.
//
// Inputs marked "strided" accept any strides (broadcast = stride 0); all others are contiguous.
// Kernels marked "dx may be dy" accept their output at exactly the address (and strides) of
// their dy input, no other overlap: the engine writes a gradient over its dead incoming
// gradient (engine/ops/common.h, grad_buffer), autograd sums two gradients over one of them
// (add), and cross_entropy_backward writes over the saved logits nothing else holds. The CPU
// kernels are written for it (and store such an output plainly, not streaming); the engine does
// not ask it of the CUDA ones.
#pragma once

#define MAMMOTH_KERNELS(X)                                                                       \
  /* elementwise, strided inputs, contiguous output of the broadcast shape */                    \
  X(add)                /* (a, b) -> (y); y may be a or b */                                     \
  X(sub)                /* (a, b) -> (y) */                                                      \
  X(mul)                /* (a, b) -> (y) */                                                      \
  X(div)                /* (a, b) -> (y) */                                                      \
  X(where)              /* (cond bool, a, b) -> (y) */                                           \
  X(neg)                /* (x) -> (y) */                                                         \
  X(exp)                /* (x) -> (y) */                                                         \
  X(log)                /* (x) -> (y) */                                                         \
  X(sqrt)               /* (x) -> (y) */                                                         \
  X(rsqrt)              /* (x) -> (y) */                                                         \
  X(tanh)               /* (x) -> (y) */                                                         \
  X(relu)               /* (x) -> (y) */                                                         \
  X(gelu)               /* (x) -> (y)  exact erf form */                                         \
  X(gelu_tanh)          /* (x) -> (y)  tanh approximation */                                     \
  X(silu)               /* (x) -> (y) */                                                         \
  X(add_scalar)         /* (x) -> (y)  ScalarParams */                                           \
  X(mul_scalar)         /* (x) -> (y)  ScalarParams */                                           \
  X(pow_scalar)         /* (x) -> (y)  ScalarParams */                                           \
  X(relu_backward)      /* (dy, x) -> (dx); dx may be dy */                                      \
  X(gelu_backward)      /* (dy, x) -> (dx); dx may be dy */                                      \
  X(gelu_tanh_backward) /* (dy, x) -> (dx); dx may be dy */                                      \
  X(silu_backward)      /* (dy, x) -> (dx); dx may be dy */                                      \
  X(copy)               /* (x strided, any dtype) -> (y strided, any dtype): copy and cast */    \
  X(fill)               /* () -> (y) ScalarParams */                                             \
  /* reductions over the last dim of a contiguous [M, R] view */                                 \
  X(sum_last)    /* (x [M,R]) -> (y [M]) */                                                      \
  X(max_last)    /* (x [M,R]) -> (values [M], indices i64 [M]) */                                \
  X(sum_sq_last) /* (x [M,R]) -> (y [M]): the sum of squares, one row of any length on every     \
                    thread */                                                                    \
  /* over the first dim of a contiguous [R, N] view (a bias gradient) */                         \
  X(sum_rows) /* (x [R,N]) -> (y [N]): column sums, the rows added in order */                   \
  /* linear algebra */                                                                           \
  X(matmul) /* (a [B,M,K], b [B,K,N]) -> (c [B,M,N]) MatmulParams; a,b: one unit                 \
               stride in the last two dims (transposed views allowed), batch stride              \
               may be 0 (broadcast) */                                                           \
  /* normalisation and activations over the last dim */                                          \
  X(softmax)                /* (x [M,N]) -> (y) */                                               \
  X(softmax_backward)       /* (dy, y) -> (dx); dx may be dy */                                  \
  X(log_softmax)            /* (x [M,N]) -> (y) */                                               \
  X(log_softmax_backward)   /* (dy, y) -> (dx); dx may be dy */                                  \
  X(layer_norm)             /* (x [M,N], w [N], b [N]) -> (y, mean [M], rstd [M]) NormParams */  \
  X(layer_norm_backward)    /* (dy, x, w, mean, rstd) -> (dx, dw, db); dx may be dy */           \
  X(rms_norm)               /* (x [M,N], w [N]) -> (y, rstd [M]) NormParams */                   \
  X(rms_norm_backward)      /* (dy, x, w, rstd) -> (dx, dw); dx may be dy */                     \
  X(cross_entropy)          /* (logits [M,V], target i64 [M]) -> (loss [M], lse [M]) CE */       \
  X(cross_entropy_backward) /* (dloss [M], logits, target, lse) -> (dlogits) CE; dlogits may be  \
                               logits */                                                         \
  /* indexing */                                                                                 \
  X(index_select) /* (x [A,R,C], idx i64 [I]) -> (y [A,I,C]) */                                  \
  X(index_add)    /* (dy [A,I,C], idx i64 [I]) -> (dx [A,R,C]) accumulates, deterministic */     \
  X(gather)       /* (x [A,R,C], idx i64 [A,I,C]) -> (y [A,I,C]) */                              \
  X(scatter_add)  /* (dy [A,I,C], idx i64 [A,I,C]) -> (dx [A,R,C]) accumulates */                \
  /* mixture of experts (kernels/cpu/moe.cc): rows sorted by expert, offsets i64 [E+1] */        \
  X(grouped_matmul)          /* (x [M,K], offsets, w_0 [N,K] .. w_E-1) -> (y [M,N]) */           \
  X(grouped_matmul_backward) /* (dy, x, offsets, w_0 .. w_E-1) -> (dx, dw_0 .. dw_E-1) */        \
  X(moe_combine)             /* (y [M,C], rows i64 [M], weights [M]) -> (out [T,C]) */           \
  X(moe_combine_backward)    /* (dout [T,C], y, rows, weights) -> (dy, dweights) */              \
  /* randomness, position encodings, attention */                                                \
  X(dropout)            /* (x) -> (y, mask u8) DropoutParams (Philox 4x32-10 by seed, offset) */ \
  X(rope)               /* (x [B,T,H,D][, inv_freq f32]) -> (y) RopeParams; inverse: back */     \
  X(attention)          /* (q [B,Hq,Tq,D], k [B,Hk,Tk,D], v, key_mask bool [B,Tk] or none) ->    \
                           (out [B,Hq,Tq,D], lse f32 [B,Hq,Tq]) AttentionParams */               \
  X(attention_backward) /* (dout, q, k, v, out, lse, key_mask?) -> (dq, dk, dv) */               \
  /* optimizers over flat buffers */                                                             \
  X(adamw) /* (param, grad, m, v[, half copy]) in place, AdamWParams; grad may be bf16/f16 */    \
  X(sgd)   /* (param, grad, momentum_buf) -> in place, SgdParams */

namespace mammoth::kernels {

enum class Kernel : int {
#define MAMMOTH_KERNEL_ENUM(name) name,
  MAMMOTH_KERNELS(MAMMOTH_KERNEL_ENUM)
#undef MAMMOTH_KERNEL_ENUM
};

inline constexpr const char* kKernelNames[] = {
#define MAMMOTH_KERNEL_NAME(name) #name,
    MAMMOTH_KERNELS(MAMMOTH_KERNEL_NAME)
#undef MAMMOTH_KERNEL_NAME
};

inline constexpr int kKernelCount = sizeof(kKernelNames) / sizeof(kKernelNames[0]);

inline const char* kernel_name(Kernel k) { return kKernelNames[static_cast<int>(k)]; }

}  // namespace mammoth::kernels
