// CPU kernels of the mixture-of-experts layer (models/mixtral): the grouped GEMM over rows
// sorted by expert, and the weighted scatter-add that returns expert outputs to their tokens.
//
// Expert batches differ in size from step to step (one may be empty), so the grouped GEMM takes
// the group boundaries as an i64 offsets tensor and one weight matrix per group, and runs all
// groups in one sgemm_grouped call (f32) instead of one GEMM per expert. f64 (the gradient
// checks' precision) uses the reference dgemm per group.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/register.h"
#include "kernels/moe_offsets.h"

namespace mammoth::kernels::cpu {
namespace {

constexpr int64_t kColBlock = 256;

// Offsets [E+1] from 0 to M, non-decreasing; names the op and the first bad entry.
std::vector<int64_t> read_offsets(const char* op, const TensorArg& offsets, int64_t groups,
                                  int64_t M) {
  MAMMOTH_CHECK(offsets.dtype == DType::kI64 && offsets.numel() == groups + 1)
      << "[" << op << "] offsets must be i64 [" << groups + 1 << "], got " << offsets.numel()
      << " entries";
  const int64_t* o = offsets.ptr<const int64_t>();
  std::vector<int64_t> v(o, o + groups + 1);
  check_moe_offsets(op, v, groups, M);
  return v;
}

void gemm_groups(const std::vector<GemmGroup>& g, const float*) {
  sgemm_grouped(g.data(), static_cast<int64_t>(g.size()));
}

// The same products in double, one reference GEMM per group (K == 0 writes zeros).
struct DoubleGroup {
  bool trans_a, trans_b;
  int64_t M, N, K;
  const double* A;
  int64_t lda;
  const double* B;
  int64_t ldb;
  double* C;
  int64_t ldc;
};
void gemm_groups(const std::vector<DoubleGroup>& g, const double*) {
  for (const DoubleGroup& d : g) {
    if (d.K == 0) {
      for (int64_t i = 0; i < d.M; ++i) std::fill(d.C + i * d.ldc, d.C + i * d.ldc + d.N, 0.0);
      continue;
    }
    dgemm(d.trans_a, d.trans_b, d.M, d.N, d.K, 1.0, d.A, d.lda, d.B, d.ldb, 0.0, d.C, d.ldc);
  }
}

template <typename T>
using Group = std::conditional_t<std::is_same_v<T, float>, GemmGroup, DoubleGroup>;

template <typename T>
void grouped_matmul_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                           const void*) {
  const TensorArg& x = in[0];
  const int64_t M = x.shape[0], K = x.shape[1], N = out[0].shape[1];
  const int64_t E = static_cast<int64_t>(in.size()) - 2;
  const std::vector<int64_t> o = read_offsets("grouped_matmul", in[1], E, M);
  std::vector<Group<T>> groups;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = o[e], rows = o[e + 1] - o[e];
    groups.push_back({false, true, rows, N, K, x.ptr<const T>() + r0 * K, K,
                      in[2 + e].ptr<const T>(), K, out[0].ptr<T>() + r0 * N, N});
  }
  gemm_groups(groups, static_cast<const T*>(nullptr));
}

template <typename T>
void grouped_matmul_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                                    const void*) {
  const TensorArg &dy = in[0], &x = in[1];
  const int64_t M = x.shape[0], K = x.shape[1], N = dy.shape[1];
  const int64_t E = static_cast<int64_t>(in.size()) - 3;
  const std::vector<int64_t> o = read_offsets("grouped_matmul_backward", in[2], E, M);
  std::vector<Group<T>> groups;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = o[e], rows = o[e + 1] - o[e];
    const T* dy_e = dy.ptr<const T>() + r0 * N;
    // dx_e [rows, K] = dy_e [rows, N] @ w_e [N, K]
    groups.push_back({false, false, rows, K, N, dy_e, N, in[3 + e].ptr<const T>(), K,
                      out[0].ptr<T>() + r0 * K, K});
    // dw_e [N, K] = dy_e^T [N, rows] @ x_e [rows, K]
    groups.push_back(
        {true, false, N, K, rows, dy_e, N, x.ptr<const T>() + r0 * K, K, out[1 + e].ptr<T>(), K});
  }
  gemm_groups(groups, static_cast<const T*>(nullptr));
}

void check_rows(const char* op, const int64_t* rows, int64_t M, int64_t T) {
  for (int64_t m = 0; m < M; ++m) {
    MAMMOTH_CHECK(rows[m] >= 0 && rows[m] < T)
        << "[" << op << "] row " << m << " names token " << rows[m] << " of " << T;
  }
}

template <typename T>
void moe_combine_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                        const void*) {
  const TensorArg& y = in[0];
  const int64_t M = y.shape[0], C = y.shape[1], Tk = out[0].shape[0];
  const int64_t* rows = in[1].ptr<const int64_t>();
  const T* w = in[2].ptr<const T>();
  const T* yp = y.ptr<const T>();
  T* o = out[0].ptr<T>();
  check_rows("moe_combine", rows, M, Tk);
  // Column blocks: each output element is summed by one thread, in m order.
  const int64_t cblocks = (C + kColBlock - 1) / kColBlock;
  parallel_for(0, cblocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t cb = b; cb < e; ++cb) {
      const int64_t c0 = cb * kColBlock, c1 = std::min(C, c0 + kColBlock);
      for (int64_t t = 0; t < Tk; ++t) std::fill(o + t * C + c0, o + t * C + c1, T(0));
      for (int64_t m = 0; m < M; ++m) {
        T* dst = o + rows[m] * C;
        const T* src = yp + m * C;
        const T wm = w[m];
        for (int64_t c = c0; c < c1; ++c) dst[c] += wm * src[c];
      }
    }
  });
}

template <typename T>
void moe_combine_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                                 const void*) {
  const TensorArg &dout = in[0], &y = in[1];
  const int64_t M = y.shape[0], C = y.shape[1], Tk = dout.shape[0];
  const int64_t* rows = in[2].ptr<const int64_t>();
  const T* w = in[3].ptr<const T>();
  const T *d = dout.ptr<const T>(), *yp = y.ptr<const T>();
  T *dy = out[0].ptr<T>(), *dw = out[1].ptr<T>();
  check_rows("moe_combine_backward", rows, M, Tk);
  parallel_for(0, M, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t m = b; m < e; ++m) {
                   const T* g = d + rows[m] * C;
                   const T* ym = yp + m * C;
                   T* dym = dy + m * C;
                   double dot = 0;
                   for (int64_t c = 0; c < C; ++c) {
                     dym[c] = w[m] * g[c];
                     dot += static_cast<double>(g[c]) * ym[c];
                   }
                   dw[m] = static_cast<T>(dot);
                 }
               });
}

}  // namespace

void register_moe(Registry& r) {
  add_float_kernels(r, Kernel::grouped_matmul, grouped_matmul_kernel<float>,
                    grouped_matmul_kernel<double>);
  add_float_kernels(r, Kernel::grouped_matmul_backward, grouped_matmul_backward_kernel<float>,
                    grouped_matmul_backward_kernel<double>);
  add_float_kernels(r, Kernel::moe_combine, moe_combine_kernel<float>, moe_combine_kernel<double>);
  add_float_kernels(r, Kernel::moe_combine_backward, moe_combine_backward_kernel<float>,
                    moe_combine_backward_kernel<double>);
}

}  // namespace mammoth::kernels::cpu
