// bf16 GEMM on f32 operands: C = alpha * op(A) op(B) + beta * C where A and B are f32 and are
// rounded to bf16 (round to nearest even) while they are packed into the micro-kernel's panels,
// products accumulate in f32 with AVX512_BF16 (vdpbf16ps) and C is f32.
//
// This is what mixed-precision autocast (kernels::MatmulCompute::kBF16) needs: the f32
// activations and master weights go straight into the packed panels, so no separate bf16 copy
// of either operand is written and read back, and the four transpose combinations are absorbed
// by vectorised convert-and-pack routines (the training step's forward, dX, dW and LM-head
// shapes). The result equals gemm_bf16 (kernels/cpu/gemm.h) on float_to_bf16-rounded inputs up
// to the order of the f32 sums; denormal inputs count as zero, as in vdpbf16ps.
//
// Only for CPUs with AVX512_BF16: callers check gemm_bf16_f32_supported() first (the code is
// compiled with -mavx512bf16 and must not run elsewhere).
#pragma once

#include <cstdint>

namespace mammoth::kernels::cpu {

// True when this CPU has AVX-512 F/BW/VL/DQ and AVX512_BF16. Compiled without AVX-512 flags.
bool gemm_bf16_f32_supported();

// supported, and the GEMM tests have not forced another ISA (set_gemm_isa) or the
// convert-to-f32 bf16 path (set_bf16_dot_allowed(false)): whether autocast should use this.
bool gemm_bf16_f32_enabled();

// Row-major matrices; lda/ldb/ldc are row strides of the matrices as stored, transposes as in
// sgemm. beta == 0 never reads C. Splits over the thread pool like sgemm.
void gemm_bf16_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                   const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                   int64_t ldc);

// `batch` independent products; matrix b of X starts at X + b * stride_x (a stride of 0
// broadcasts one operand).
void gemm_bf16_f32_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                           const float* A, int64_t lda, int64_t stride_a, const float* B,
                           int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
                           int64_t stride_c, int64_t batch);

}  // namespace mammoth::kernels::cpu
