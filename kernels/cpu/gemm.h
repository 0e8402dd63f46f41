// CPU matrix multiplication: sgemm, batched sgemm, bf16-input gemm and a double reference gemm.
//
// All matrices are row-major. A call computes
//   C[M,N] = act(alpha * op(A)[M,K] @ op(B)[K,N] + beta * C + bias[n])
// where op(X) = X^T when trans_x is set, and lda/ldb/ldc are the row strides of the matrices
// as stored (so a submatrix of a larger matrix is passed by pointer + the larger row stride).
// beta == 0 never reads C (it may hold NaN garbage); M, N or K == 0 are valid (K == 0 gives
// C = beta * C).
//
// The fp32 and bf16 paths are GotoBLAS/BLIS-style: op(A) is packed into MR-row panels and
// op(B) into NR-column panels (the packing absorbs the four transpose combinations, so each
// ISA needs one register-blocked micro-kernel), with cache blocking sized for Zen 4. Each ISA
// lives in its own translation unit compiled with its own -m flags; the best one the CPU
// supports is picked at run time, unless MAMMOTH_ISA names another (isa_env.h), and tests may
// force any path with set_gemm_isa. Work is
// split over the base thread pool (parallel_for) into independent row or column slabs.
#pragma once

#include <cstdint>

namespace mammoth::kernels::cpu {

enum class GemmIsa { kAuto, kAvx512, kAvx2, kPortable };

// Forces a micro-kernel family (tests, benchmarks). kAuto returns to the default: the family
// MAMMOTH_ISA names when it is set (isa_env.h), else the best the CPU supports.
// Throws mammoth::Error if the CPU lacks the requested ISA.
void set_gemm_isa(GemmIsa isa);
// The family sgemm uses now (never kAuto). Throws mammoth::Error, naming the variable, while
// nothing is forced and MAMMOTH_ISA is unknown or names a family this CPU cannot run.
GemmIsa active_gemm_isa();
const char* gemm_isa_name(GemmIsa isa);
// True if this CPU can run the given family (kAuto and kPortable are always supported).
bool gemm_isa_supported(GemmIsa isa);

// The register tile of the active fp32 micro-kernel: sgemm computes C in blocks of
// rows x cols, so an M x N product costs as much as ceil(M / rows) rows x ceil(N / cols) cols
// (the planner's GEMM time model pads by it).
struct GemmTile {
  int rows = 1, cols = 1;
};
GemmTile sgemm_tile();

// Elementwise function applied after alpha*AB + beta*C + bias.
enum class GemmActivation { kNone, kGeluTanh };

// Optional fused epilogue for Linear layers: bias has N entries (nullptr for none).
struct GemmEpilogue {
  const float* bias = nullptr;
  GemmActivation activation = GemmActivation::kNone;
};

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// sgemm with a fused bias / activation epilogue.
void sgemm_fused(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                 int64_t ldc, const GemmEpilogue& epilogue);

// batch independent sgemms; matrix b of X starts at X + b * stride_x.
void sgemm_strided_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                           const float* A, int64_t lda, int64_t stride_a, const float* B,
                           int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
                           int64_t stride_c, int64_t batch);

// One product of a grouped GEMM: C[M,N] = op(A) @ op(B), overwriting C (K == 0 writes zeros).
struct GemmGroup {
  bool trans_a = false, trans_b = false;
  int64_t M = 0, N = 0, K = 0;
  const float* A = nullptr;
  int64_t lda = 0;
  const float* B = nullptr;
  int64_t ldb = 0;
  float* C = nullptr;
  int64_t ldc = 0;
};

// Independent GEMMs of different sizes (mixture-of-experts batches, one per expert) in one
// call: every group is cut into row slabs of whole micro-tiles and all slabs of all groups are
// shared by one parallel_for, so many small experts keep every thread busy where a loop of
// sgemm calls would run each small one alone. Each C element is computed by one thread, in
// the serial kernel's order: the result does not depend on the thread count.
void sgemm_grouped(const GemmGroup* groups, int64_t count);

// bf16 inputs (raw 16-bit patterns), fp32 accumulation and output. Uses AVX512_BF16
// (vdpbf16ps) where the CPU has it; other paths convert to fp32 while packing. vdpbf16ps
// accumulates each pair of products with round-to-nearest-even and treats denormal inputs
// as zero, so results differ from the converting path in the last bits.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C,
               int64_t ldc);

// Double precision, simple blocked loops: the reference for f64 gradient checks, not fast.
void dgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
           const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
           int64_t ldc);

}  // namespace mammoth::kernels::cpu
