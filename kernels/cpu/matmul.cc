// CPU matmul: batched, with transposes read from strides, over the packed GEMM.
#include "base/error.h"
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

// Reference blocked GEMM: C = alpha * op(A) op(B) + beta * C, row-major.
template <typename T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  parallel_for(0, M, std::max<int64_t>(1, 4096 / std::max<int64_t>(N * K, 1)),
               [&](int64_t m0, int64_t m1) {
                 std::vector<T> acc(N);
                 for (int64_t m = m0; m < m1; ++m) {
                   std::fill(acc.begin(), acc.end(), T(0));
                   for (int64_t k = 0; k < K; ++k) {
                     const T a = ta ? A[k * lda + m] : A[m * lda + k];
                     if (a == T(0)) continue;
                     if (!tb) {
                       const T* brow = B + k * ldb;
                       for (int64_t n = 0; n < N; ++n) acc[n] += a * brow[n];
                     } else {
                       for (int64_t n = 0; n < N; ++n) acc[n] += a * B[n * ldb + k];
                     }
                   }
                   T* crow = C + m * ldc;
                   if (beta == T(0)) {
                     for (int64_t n = 0; n < N; ++n) crow[n] = alpha * acc[n];
                   } else {
                     for (int64_t n = 0; n < N; ++n) crow[n] = alpha * acc[n] + beta * crow[n];
                   }
                 }
               });
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
    gemm<T>(la.trans, lb.trans, M, N, K, static_cast<T>(p->alpha), ap + i * a.strides[0], la.ld,
            bp + i * b.strides[0], lb.ld, static_cast<T>(p->beta), cp + i * c.strides[0],
            c.strides[1]);
  }
}

}  // namespace

void register_matmul(Registry& r) {
  add_float_kernels(r, Kernel::matmul, matmul_kernel<float>, matmul_kernel<double>);
}

}  // namespace mammoth::kernels::cpu
