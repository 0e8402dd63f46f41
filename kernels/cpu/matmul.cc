// CPU matmul: batched, with transposes read from strides, over the packed GEMM.
#include "base/error.h"
#include "kernels/cpu/gemm.h"
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

template <typename T>
void matmul_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                   const void* params) {
  const auto* p = static_cast<const MatmulParams*>(params);
  const TensorArg &a = in[0], &b = in[1], &c = out[0];
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
