// CPU reductions over the last dim of a contiguous [M, R] view. The engine permutes the
// reduced dims to the end first, so one pair of kernels serves every reduction; sum_rows, over
// the first dim, is the bias gradient's (a column sum of dy, read in place).
#include <limits>
#include <type_traits>

#include "kernels/cpu/fast.h"
#include "kernels/cpu/register.h"

namespace mammoth::kernels::cpu {
namespace {

// Accumulates in double: deterministic, order-fixed, and accurate enough for f64 checks.
template <typename T>
void sum_last_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  const int64_t R = in[0].size(-1);
  const int64_t M = R == 0 ? out[0].numel() : in[0].numel() / R;
  const T* x = in[0].ptr<const T>();
  T* y = out[0].ptr<T>();
  parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(R, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t m = b; m < e; ++m) {
                   double acc = 0.0;
                   const T* row = x + m * R;
                   for (int64_t r = 0; r < R; ++r) acc += row[r];
                   y[m] = static_cast<T>(acc);
                 }
               });
}

// The sum of squares: f32 through the fused kernels (fast.h: blocks of a row on every thread);
// f64 per row in order in double, the reference.
template <typename T>
void sum_sq_last_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                        const void*) {
  const int64_t R = in[0].size(-1);
  const int64_t M = R == 0 ? out[0].numel() : in[0].numel() / R;
  const T* x = in[0].ptr<const T>();
  T* y = out[0].ptr<T>();
  if constexpr (std::is_same_v<T, float>) {
    fast_kernels().sum_sq(x, y, M, R);
  } else {
    parallel_for(0, M, 1, [&](int64_t b, int64_t e) {
      for (int64_t m = b; m < e; ++m) {
        double acc = 0.0;
        const T* row = x + m * R;
        for (int64_t r = 0; r < R; ++r) acc += static_cast<double>(row[r]) * row[r];
        y[m] = static_cast<T>(acc);
      }
    });
  }
}

// Column sums: f32 through the fused kernels (fast.h), f64 in double; the rows in order either way.
template <typename T>
void sum_rows_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  const int64_t N = out[0].numel();
  const int64_t R = N == 0 ? 0 : in[0].numel() / N;
  const T* x = in[0].ptr<const T>();
  T* y = out[0].ptr<T>();
  if constexpr (std::is_same_v<T, float>) {
    fast_kernels().sum_rows(x, y, R, N);
  } else {
    parallel_for(0, N, std::max<int64_t>(1, 16384 / std::max<int64_t>(R, 1)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t j = b; j < e; ++j) {
                     T acc = 0;
                     for (int64_t r = 0; r < R; ++r) acc += x[r * N + j];
                     y[j] = acc;
                   }
                 });
  }
}

// First index of the maximum; NaN propagates (a NaN row reports the first NaN).
template <typename T>
void max_last_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  const int64_t R = in[0].size(-1);
  const int64_t M = in[0].numel() / R;
  const T* x = in[0].ptr<const T>();
  T* y = out[0].ptr<T>();
  int64_t* idx = out[1].ptr<int64_t>();
  parallel_for(0, M, std::max<int64_t>(1, 16384 / R), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const T* row = x + m * R;
      int64_t best = 0;
      for (int64_t r = 0; r < R; ++r) {
        if (row[r] != row[r]) {  // NaN wins, as in PyTorch
          best = r;
          break;
        }
        if (row[r] > row[best]) best = r;
      }
      y[m] = row[best];
      idx[m] = best;
    }
  });
}

}  // namespace

void register_reduce(Registry& r) {
  add_float_kernels(r, Kernel::sum_last, sum_last_kernel<float>, sum_last_kernel<double>);
  add_float_kernels(r, Kernel::max_last, max_last_kernel<float>, max_last_kernel<double>);
  add_float_kernels(r, Kernel::sum_sq_last, sum_sq_last_kernel<float>, sum_sq_last_kernel<double>);
  add_float_kernels(r, Kernel::sum_rows, sum_rows_kernel<float>, sum_rows_kernel<double>);
}

}  // namespace mammoth::kernels::cpu
