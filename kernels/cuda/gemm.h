// GEMM on the GPU through cuBLASLt: C = alpha * op(A) @ op(B) + beta * C (+ bias, GELU), in
// row-major terms as the rest of Mammoth, strided-batched.
//
// f32 runs in full fp32 unless allow_tf32 is set (PyTorch's default for matmul is also fp32);
// bf16 and f16 accumulate in fp32, also with an f32 C (input_dtype: the matmul kernel's
// autocast compute, MatmulCompute::kBF16 / kF16, rounds f32 operands to them first). Algorithms are
// chosen by cuBLASLt's heuristic once per shape/layout/alignment and cached with their descriptors.
// The matmul registry kernel calls gemm() with the transposes read from the operand strides, as
// kernels/cpu/matmul.cc does.
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace mammoth::kernels::cuda {

enum class Epilogue {
  kNone,
  kBias,          // C[m, n] += bias[n]
  kGeluTanh,      // C = gelu_tanh(C) (cuBLASLt's GELU is the tanh approximation)
  kBiasGeluTanh,  // C = gelu_tanh(C + bias)
};

struct GemmArgs {
  DType dtype = DType::kF32;  // of C and bias (and of A and B unless input_dtype says): f32,
                              // bf16 or f16
  // Mixed precision (autocast): A and B in bf16 or f16 with an f32 C, fp32 accumulation.
  // kF32 (the default) means "the same as dtype".
  DType input_dtype = DType::kF32;
  int64_t M = 0, N = 0, K = 0;
  // op(A) is [M, K]: A row-major [M, K] with leading dim lda, or (trans_a) row-major [K, M].
  const void* A = nullptr;
  int64_t lda = 0;
  bool trans_a = false;
  // op(B) is [K, N]: B row-major [K, N], or (trans_b) row-major [N, K].
  const void* B = nullptr;
  int64_t ldb = 0;
  bool trans_b = false;
  void* C = nullptr;  // row-major [M, N]
  int64_t ldc = 0;
  int64_t batch = 1;  // element strides between batch entries; 0 broadcasts A or B
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  Epilogue epilogue = Epilogue::kNone;
  const void* bias = nullptr;  // [N]
};

// Runs on memory::cuda::current_stream(). Throws mammoth::Error naming the shape when cuBLASLt
// has no algorithm for it.
void gemm(const GemmArgs& args);

// TF32 tensor cores for f32 GEMMs (faster, ~10-bit mantissa products). Off by default.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace mammoth::kernels::cuda
