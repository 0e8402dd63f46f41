// CPU matmul: batched, with transposes read from strides, over the packed GEMM; f32 can round
// its inputs to bf16 / fp16 first (mixed-precision autocast, MatmulCompute).
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_bf16_f32.h"
#include "kernels/cpu/register.h"
#include "kernels/params.h"

namespace mammoth::kernels::cpu {
namespace {

// A matrix operand [rows, cols] with one unit stride: row-major (ld = row stride) or a
// transposed view of a row-major matrix (ld = column stride).
struct MatrixLayout {
  bool trans;
  int64_t ld;
};

MatrixLayout layout_of(const TensorArg& t) {
  const int64_t rs = t.strides[t.ndim - 2], cs = t.strides[t.ndim - 1];
  const int64_t rows = t.shape[t.ndim - 2], cols = t.shape[t.ndim - 1];
  if (cs == 1 || cols == 1) return {false, std::max<int64_t>(rows == 1 ? cols : rs, 1)};
  MAMMOTH_CHECK(rs == 1 || rows == 1)
      << "[matmul] operand needs a unit stride in its last two dims";
  return {true, std::max<int64_t>(cs, 1)};
}

// The packed GEMM of kernels/cpu/gemm.h for f32 and f64.
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A,
          int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  dgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// ---- f32 matmul with inputs rounded to bf16 / fp16 (MatmulCompute) ----

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

// Lambdas (not function pointers) so the per-element conversion inlines and vectorises.
constexpr auto to_bf16_bits = [](float x) { return float_to_bf16(x).bits; };
constexpr auto round_f16 = [](float x) { return f16_to_float(float_to_f16(x)); };

// (a [B,M,K], b [B,K,N]) -> c [B,M,N] with inputs rounded as `compute` says.
void matmul_rounded(const TensorArg& a, const TensorArg& b, const TensorArg& c,
                    const MatmulParams& p) {
  const int64_t batch = a.shape[0], M = a.shape[1], K = a.shape[2], N = b.shape[2];
  const float alpha = static_cast<float>(p.alpha), beta = static_cast<float>(p.beta);
  if (p.compute == MatmulCompute::kBF16 && gemm_bf16_f32_enabled()) {
    // AVX512_BF16: round while packing, straight from the f32 operands (no bf16 copies).
    const MatrixLayout la = layout_of(a), lb = layout_of(b);
    gemm_bf16_f32_batched(la.trans, lb.trans, M, N, K, alpha, a.ptr<const float>(), la.ld,
                          a.strides[0], b.ptr<const float>(), lb.ld, b.strides[0], beta,
                          c.ptr<float>(), c.strides[1], c.strides[0], batch);
    return;
  }
  if (p.compute == MatmulCompute::kBF16) {
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
      gemm_bf16(la.trans, lb.trans, M, N, K, alpha, ab.data(), la.ld, bb.data(), lb.ld, beta,
                c.ptr<float>() + i * c.strides[0], c.strides[1]);
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
    sgemm(la.trans, lb.trans, M, N, K, alpha, af.data(), la.ld, bf.data(), lb.ld, beta,
          c.ptr<float>() + i * c.strides[0], c.strides[1]);
  }
}

template <typename T>
void matmul_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                   const void* params) {
  const auto* p = static_cast<const MatmulParams*>(params);
  const TensorArg &a = in[0], &b = in[1], &c = out[0];
  if constexpr (std::is_same_v<T, float>) {
    if (p->compute != MatmulCompute::kNative) return matmul_rounded(a, b, c, *p);
  }
  const int64_t batch = a.shape[0], M = a.shape[1], K = a.shape[2], N = b.shape[2];
  const MatrixLayout la = layout_of(a), lb = layout_of(b);
  const T* ap = a.ptr<const T>();
  const T* bp = b.ptr<const T>();
  T* cp = c.ptr<T>();
  for (int64_t i = 0; i < batch; ++i) {
    gemm(la.trans, lb.trans, M, N, K, static_cast<T>(p->alpha), ap + i * a.strides[0], la.ld,
         bp + i * b.strides[0], lb.ld, static_cast<T>(p->beta), cp + i * c.strides[0],
         c.strides[1]);
  }
}

}  // namespace

void register_matmul(Registry& r) {
  add_float_kernels(r, Kernel::matmul, matmul_kernel<float>, matmul_kernel<double>);
}

}  // namespace mammoth::kernels::cpu
