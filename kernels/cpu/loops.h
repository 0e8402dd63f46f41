// Strided iteration shared by the CPU elementwise and copy kernels.
//
// Operands are viewed in the output's shape (broadcast inputs have stride 0). Adjacent dims
// that are contiguous for every operand are merged first, so the common all-contiguous case
// becomes one flat loop the compiler vectorises. The outer dims are split across the pool, or
// the flat run itself when there is only one.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "base/thread_pool.h"
#include "kernels/kernel.h"

namespace mammoth::kernels::cpu {

template <int N>
struct StridedLoop {
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};  // in elements, per operand

  // All operands must have the same ndim and shape as ops[0].
  explicit StridedLoop(const std::array<const TensorArg*, N>& ops) {
    const TensorArg& ref = *ops[0];
    for (int d = 0; d < ref.ndim; ++d) {
      if (ref.shape[d] == 1) continue;  // size-1 dims never move the index
      const bool merge = ndim > 0 && [&] {
        for (int k = 0; k < N; ++k) {
          if (strides[k][ndim - 1] != ops[k]->strides[d] * ref.shape[d]) return false;
        }
        return true;
      }();
      if (merge) {
        shape[ndim - 1] *= ref.shape[d];
        for (int k = 0; k < N; ++k) strides[k][ndim - 1] = ops[k]->strides[d];
      } else {
        shape[ndim] = ref.shape[d];
        for (int k = 0; k < N; ++k) strides[k][ndim] = ops[k]->strides[d];
        ++ndim;
      }
    }
    if (ndim == 0) {  // a scalar or all-ones shape: one element
      shape[0] = 1;
      for (int k = 0; k < N; ++k) strides[k][0] = 0;
      ndim = 1;
    }
  }

  // Calls inner(n, offsets, inner_strides) for runs along the innermost merged dim.
  template <typename F>
  void run(F&& inner) const {
    const int64_t inner_n = shape[ndim - 1];
    int64_t rows = 1;
    for (int d = 0; d < ndim - 1; ++d) rows *= shape[d];
    std::array<int64_t, N> inner_strides;
    for (int k = 0; k < N; ++k) inner_strides[k] = strides[k][ndim - 1];
    if (rows == 1) {  // one long run (the all-contiguous case): split the run itself
      parallel_for(0, inner_n, 32768, [&](int64_t b, int64_t e) {
        std::array<int64_t, N> off;
        for (int k = 0; k < N; ++k) off[k] = b * inner_strides[k];
        inner(e - b, off, inner_strides);
      });
      return;
    }
    const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(inner_n, 1));
    parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
      int64_t idx[kMaxDims] = {};
      int64_t rem = r0;
      for (int d = ndim - 2; d >= 0; --d) {
        idx[d] = rem % shape[d];
        rem /= shape[d];
      }
      for (int64_t r = r0; r < r1; ++r) {
        std::array<int64_t, N> off{};
        for (int k = 0; k < N; ++k) {
          for (int d = 0; d < ndim - 1; ++d) off[k] += idx[d] * strides[k][d];
        }
        inner(inner_n, off, inner_strides);
        for (int d = ndim - 2; d >= 0; --d) {
          if (++idx[d] < shape[d]) break;
          idx[d] = 0;
        }
      }
    });
  }
};

}  // namespace mammoth::kernels::cpu
