// CPU kernels over the last dim of [M, N] rows: softmax, log_softmax, layer_norm, rms_norm,
// fused cross-entropy, plus dropout and rotary embedding.
//
// f32 goes to the fused, vectorised kernels of fast.h (one per instruction set); the plain
// loops below are the f64 path and the reference those are tested against. Row statistics of
// the f64 loops accumulate in double; weight gradients are summed over fixed blocks of rows,
// then the blocks in order, so results never depend on the thread count.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "base/philox.h"
#include "kernels/cpu/fast.h"
#include "kernels/cpu/register.h"
#include "kernels/params.h"

namespace mammoth::kernels::cpu {
namespace {

constexpr int64_t kRowBlock = 64;  // rows per partial sum of weight gradients

int64_t rows_of(const TensorArg& t) {
  const int64_t n = t.size(-1);
  return n == 0 ? 0 : t.numel() / n;
}

int64_t row_grain(int64_t n) { return std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1)); }

// The two softmax forward kernels: f32 through the fused kernel `fast`; otherwise, per row, the
// maximum mx, sum = sum(exp(x - mx)) in double, and y = out(x, mx, sum) element by element.
template <typename T, typename Out>
void softmax_family_forward(std::span<const TensorArg> in, std::span<const TensorArg> out,
                            decltype(FastKernels::softmax) fast, Out y_of) {
  const int64_t N = in[0].size(-1), M = rows_of(in[0]);
  if constexpr (std::is_same_v<T, float>) {
    fast(in[0].ptr<const float>(), out[0].ptr<float>(), M, N);
    return;
  }
  const T* x = in[0].ptr<const T>();
  T* y = out[0].ptr<T>();
  parallel_for(0, M, row_grain(N), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const T* xr = x + m * N;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t n = 0; n < N; ++n) mx = std::max(mx, xr[n]);
      double sum = 0;
      for (int64_t n = 0; n < N; ++n) sum += std::exp(static_cast<double>(xr[n] - mx));
      for (int64_t n = 0; n < N; ++n) y[m * N + n] = y_of(xr[n], mx, sum);
    }
  });
}

template <typename T>
void softmax_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  softmax_family_forward<T>(in, out, fast_kernels().softmax, [](T x, T mx, double sum) {
    return static_cast<T>(std::exp(static_cast<double>(x - mx)) / sum);
  });
}

template <typename T>
void log_softmax_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                        const void*) {
  softmax_family_forward<T>(in, out, fast_kernels().log_softmax, [](T x, T mx, double sum) {
    return x - (mx + static_cast<T>(std::log(sum)));
  });
}

// The two softmax backward kernels: f32 through the fused kernel `fast`; otherwise, per row, a
// reduction r = reduce(dy, y) in double and then dx = out(dy, y, r).
template <typename T, typename Reduce, typename Out>
void softmax_family_backward(std::span<const TensorArg> in, std::span<const TensorArg> out,
                             decltype(FastKernels::softmax_backward) fast, Reduce reduce,
                             Out dx_of) {
  const int64_t N = in[0].size(-1), M = rows_of(in[0]);
  if constexpr (std::is_same_v<T, float>) {
    fast(in[0].ptr<const float>(), in[1].ptr<const float>(), out[0].ptr<float>(), M, N);
    return;
  }
  const T* dy = in[0].ptr<const T>();
  const T* y = in[1].ptr<const T>();
  T* dx = out[0].ptr<T>();
  parallel_for(0, M, row_grain(N), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      double r = 0;
      for (int64_t n = 0; n < N; ++n) r += reduce(dy[m * N + n], y[m * N + n]);
      for (int64_t n = 0; n < N; ++n) {
        dx[m * N + n] = dx_of(dy[m * N + n], y[m * N + n], static_cast<T>(r));
      }
    }
  });
}

// dx = y * (dy - sum(dy * y))
template <typename T>
void softmax_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                             const void*) {
  softmax_family_backward<T>(
      in, out, fast_kernels().softmax_backward, [](T g, T p) { return g * p; },
      [](T g, T p, T dot) { return p * (g - dot); });
}

// dx = dy - exp(y) * sum(dy)
template <typename T>
void log_softmax_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                                 const void*) {
  softmax_family_backward<T>(
      in, out, fast_kernels().log_softmax_backward, [](T g, T) { return g; },
      [](T g, T ly, T sum) { return g - std::exp(ly) * sum; });
}

template <typename T>
void layer_norm_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                       const void* params) {
  if constexpr (std::is_same_v<T, float>) {
    fast_kernels().layer_norm(in[0].ptr<const float>(), in[1].ptr<const float>(),
                              in[2].ptr<const float>(), out[0].ptr<float>(), out[1].ptr<float>(),
                              out[2].ptr<float>(), rows_of(in[0]), in[0].size(-1),
                              static_cast<const NormParams*>(params)->eps);
    return;
  }
  const double eps = static_cast<const NormParams*>(params)->eps;
  const int64_t N = in[0].size(-1), M = rows_of(in[0]);
  const T* x = in[0].ptr<const T>();
  const T* w = in[1].ptr<const T>();
  const T* bias = in[2].ptr<const T>();
  T* y = out[0].ptr<T>();
  T* mean = out[1].ptr<T>();
  T* rstd = out[2].ptr<T>();
  parallel_for(0, M, row_grain(N), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const T* xr = x + m * N;
      double s = 0;
      for (int64_t n = 0; n < N; ++n) s += xr[n];
      const double mu = s / N;
      double v = 0;
      for (int64_t n = 0; n < N; ++n) v += (xr[n] - mu) * (xr[n] - mu);
      const double rs = 1.0 / std::sqrt(v / N + eps);
      mean[m] = static_cast<T>(mu);
      rstd[m] = static_cast<T>(rs);
      for (int64_t n = 0; n < N; ++n) {
        y[m * N + n] = static_cast<T>((xr[n] - mu) * rs) * w[n] + bias[n];
      }
    }
  });
}

// Sums per-row-block partials of weight gradients in a fixed order.
template <typename T, typename RowFn>
void reduce_weight_grads(int64_t M, int64_t N, int num_grads, T* const* grads, RowFn row_fn) {
  const int64_t blocks = (M + kRowBlock - 1) / kRowBlock;
  std::vector<double> partial(static_cast<size_t>(blocks * num_grads * N), 0.0);
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      double* p = partial.data() + blk * num_grads * N;
      for (int64_t m = blk * kRowBlock; m < std::min(M, (blk + 1) * kRowBlock); ++m) row_fn(m, p);
    }
  });
  for (int g = 0; g < num_grads; ++g) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0;
      for (int64_t blk = 0; blk < blocks; ++blk) s += partial[(blk * num_grads + g) * N + n];
      grads[g][n] = static_cast<T>(s);
    }
  }
}

template <typename T>
void layer_norm_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                                const void*) {
  if constexpr (std::is_same_v<T, float>) {
    fast_kernels().layer_norm_backward(
        in[0].ptr<const float>(), in[1].ptr<const float>(), in[2].ptr<const float>(),
        in[3].ptr<const float>(), in[4].ptr<const float>(), out[0].ptr<float>(),
        out[1].ptr<float>(), out[2].ptr<float>(), rows_of(in[0]), in[0].size(-1));
    return;
  }
  const int64_t N = in[0].size(-1), M = rows_of(in[0]);
  const T* dy = in[0].ptr<const T>();
  const T* x = in[1].ptr<const T>();
  const T* w = in[2].ptr<const T>();
  const T* mean = in[3].ptr<const T>();
  const T* rstd = in[4].ptr<const T>();
  // The weight gradients first: dx may be dy (kernels/op_list.h).
  T* grads[2] = {out[1].ptr<T>(), out[2].ptr<T>()};
  reduce_weight_grads<T>(M, N, 2, grads, [&](int64_t m, double* p) {
    for (int64_t n = 0; n < N; ++n) {
      const double xhat = (x[m * N + n] - mean[m]) * rstd[m];
      p[n] += dy[m * N + n] * xhat;
      p[N + n] += dy[m * N + n];
    }
  });
  T* dx = out[0].ptr<T>();
  parallel_for(0, M, row_grain(N), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const T* xr = x + m * N;
      const T* dyr = dy + m * N;
      double s1 = 0, s2 = 0;  // sum(dxhat), sum(dxhat * xhat)
      for (int64_t n = 0; n < N; ++n) {
        const double xhat = (xr[n] - mean[m]) * rstd[m];
        const double dxhat = dyr[n] * w[n];
        s1 += dxhat;
        s2 += dxhat * xhat;
      }
      s1 /= N;
      s2 /= N;
      for (int64_t n = 0; n < N; ++n) {
        const double xhat = (xr[n] - mean[m]) * rstd[m];
        dx[m * N + n] = static_cast<T>(rstd[m] * (dyr[n] * w[n] - s1 - xhat * s2));
      }
    }
  });
}

template <typename T>
void rms_norm_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                     const void* params) {
  if constexpr (std::is_same_v<T, float>) {
    fast_kernels().rms_norm(in[0].ptr<const float>(), in[1].ptr<const float>(), out[0].ptr<float>(),
                            out[1].ptr<float>(), rows_of(in[0]), in[0].size(-1),
                            static_cast<const NormParams*>(params)->eps);
    return;
  }
  const double eps = static_cast<const NormParams*>(params)->eps;
  const int64_t N = in[0].size(-1), M = rows_of(in[0]);
  const T* x = in[0].ptr<const T>();
  const T* w = in[1].ptr<const T>();
  T* y = out[0].ptr<T>();
  T* rstd = out[1].ptr<T>();
  parallel_for(0, M, row_grain(N), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const T* xr = x + m * N;
      double ss = 0;
      for (int64_t n = 0; n < N; ++n) ss += static_cast<double>(xr[n]) * xr[n];
      const double rs = 1.0 / std::sqrt(ss / N + eps);
      rstd[m] = static_cast<T>(rs);
      for (int64_t n = 0; n < N; ++n) y[m * N + n] = static_cast<T>(xr[n] * rs) * w[n];
    }
  });
}

template <typename T>
void rms_norm_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                              const void*) {
  if constexpr (std::is_same_v<T, float>) {
    fast_kernels().rms_norm_backward(in[0].ptr<const float>(), in[1].ptr<const float>(),
                                     in[2].ptr<const float>(), in[3].ptr<const float>(),
                                     out[0].ptr<float>(), out[1].ptr<float>(), rows_of(in[0]),
                                     in[0].size(-1));
    return;
  }
  const int64_t N = in[0].size(-1), M = rows_of(in[0]);
  const T* dy = in[0].ptr<const T>();
  const T* x = in[1].ptr<const T>();
  const T* w = in[2].ptr<const T>();
  const T* rstd = in[3].ptr<const T>();
  // The weight gradient first: dx may be dy (kernels/op_list.h).
  T* grads[1] = {out[1].ptr<T>()};
  reduce_weight_grads<T>(M, N, 1, grads, [&](int64_t m, double* p) {
    for (int64_t n = 0; n < N; ++n) {
      p[n] += static_cast<double>(dy[m * N + n]) * x[m * N + n] * rstd[m];
    }
  });
  T* dx = out[0].ptr<T>();
  parallel_for(0, M, row_grain(N), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      double s = 0;  // mean(dxhat * xhat)
      for (int64_t n = 0; n < N; ++n) {
        s += static_cast<double>(dy[m * N + n]) * w[n] * x[m * N + n] * rstd[m];
      }
      s /= N;
      for (int64_t n = 0; n < N; ++n) {
        const double xhat = static_cast<double>(x[m * N + n]) * rstd[m];
        dx[m * N + n] = static_cast<T>(rstd[m] * (dy[m * N + n] * w[n] - xhat * s));
      }
    }
  });
}

void check_target(int64_t t, int64_t V, int64_t row) {
  MAMMOTH_CHECK(t >= 0 && t < V) << "[cross_entropy] target " << t << " at row " << row
                                 << " is out of range for " << V << " classes";
}

// loss = (1-s) * (lse - x[t]) + s * (lse - mean(x))
template <typename T>
void cross_entropy_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                          const void* params) {
  if constexpr (std::is_same_v<T, float>) {
    const auto* p = static_cast<const CrossEntropyParams*>(params);
    fast_kernels().cross_entropy(in[0].ptr<const float>(), in[1].ptr<const int64_t>(),
                                 out[0].ptr<float>(), out[1].ptr<float>(), rows_of(in[0]),
                                 in[0].size(-1), p->ignore_index, p->label_smoothing);
    return;
  }
  const auto* p = static_cast<const CrossEntropyParams*>(params);
  const int64_t V = in[0].size(-1), M = rows_of(in[0]);
  const T* x = in[0].ptr<const T>();
  const int64_t* target = in[1].ptr<const int64_t>();
  T* loss = out[0].ptr<T>();
  T* lse_out = out[1].ptr<T>();
  parallel_for(0, M, row_grain(V), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const T* xr = x + m * V;
      T mx = -std::numeric_limits<T>::infinity();
      double sum_x = 0;
      for (int64_t v = 0; v < V; ++v) {
        mx = std::max(mx, xr[v]);
        sum_x += xr[v];
      }
      double se = 0;
      for (int64_t v = 0; v < V; ++v) se += std::exp(static_cast<double>(xr[v] - mx));
      const double lse = mx + std::log(se);
      lse_out[m] = static_cast<T>(lse);
      const int64_t t = target[m];
      if (t == p->ignore_index) {
        loss[m] = T(0);
        continue;
      }
      check_target(t, V, m);
      const double s = p->label_smoothing;
      loss[m] = static_cast<T>((1 - s) * (lse - xr[t]) + s * (lse - sum_x / V));
    }
  });
}

// dlogits = dloss * (softmax - (1-s) * onehot - s / V)
template <typename T>
void cross_entropy_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                                   const void* params) {
  if constexpr (std::is_same_v<T, float>) {
    const auto* p = static_cast<const CrossEntropyParams*>(params);
    fast_kernels().cross_entropy_backward(in[0].ptr<const float>(), in[1].ptr<const float>(),
                                          in[2].ptr<const int64_t>(), in[3].ptr<const float>(),
                                          out[0].ptr<float>(), rows_of(in[1]), in[1].size(-1),
                                          p->ignore_index, p->label_smoothing);
    return;
  }
  const auto* p = static_cast<const CrossEntropyParams*>(params);
  const T* dloss = in[0].ptr<const T>();
  const int64_t V = in[1].size(-1), M = rows_of(in[1]);
  const T* x = in[1].ptr<const T>();
  const int64_t* target = in[2].ptr<const int64_t>();
  const T* lse = in[3].ptr<const T>();
  T* dx = out[0].ptr<T>();
  parallel_for(0, M, row_grain(V), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      T* dr = dx + m * V;
      const int64_t t = target[m];
      if (t == p->ignore_index) {
        std::fill(dr, dr + V, T(0));
        continue;
      }
      check_target(t, V, m);
      const T g = dloss[m];
      const T smooth = static_cast<T>(p->label_smoothing / V);
      for (int64_t v = 0; v < V; ++v) dr[v] = g * (std::exp(x[m * V + v] - lse[m]) - smooth);
      dr[t] -= g * static_cast<T>(1 - p->label_smoothing);
    }
  });
}

template <typename T>
void dropout_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                    const void* params) {
  const auto* p = static_cast<const DropoutParams*>(params);
  const int64_t n = in[0].numel();
  const T* x = in[0].ptr<const T>();
  T* y = out[0].ptr<T>();
  uint8_t* mask = out[1].ptr<uint8_t>();
  const T scale = p->p < 1.0 ? static_cast<T>(1.0 / (1.0 - p->p)) : T(0);
  const float threshold = static_cast<float>(p->p);
  // Chunks start at multiples of 4 so each Philox call serves four consecutive elements.
  parallel_for(0, (n + 3) / 4, 4096, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const PhiloxOut r = philox4x32(p->offset + static_cast<uint64_t>(c), 0, p->seed);
      for (int lane = 0; lane < 4; ++lane) {
        const int64_t i = c * 4 + lane;
        if (i >= n) break;
        const bool keep = philox_uniform(r.v[lane]) >= threshold;
        mask[i] = keep;
        y[i] = keep ? x[i] * scale : T(0);
      }
    }
  });
}

template <typename T>
void rope_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                 const void* params) {
  const auto* p = static_cast<const RopeParams*>(params);
  const TensorArg& xa = in[0];
  const int64_t B = xa.shape[0], Tn = xa.shape[1], H = xa.shape[2], D = xa.shape[3];
  const int64_t rot = p->rotary_dim > 0 ? p->rotary_dim : D;
  MAMMOTH_CHECK(rot % 2 == 0 && rot <= D)
      << "[rope] rotary dim " << rot << " must be even and at most the head dim " << D;
  const int64_t half = rot / 2;
  const T* x = xa.ptr<const T>();
  T* y = out[0].ptr<T>();
  const double sign = p->inverse ? -1.0 : 1.0;
  // cos/sin depend on (t, i) only: one table for all batches and heads.
  std::vector<T> cs(static_cast<size_t>(Tn * half)), sn(cs.size());
  std::vector<double> inv_freq(static_cast<size_t>(half));
  // An explicit table (in[1], f32 [rot / 2]: scaled rope, models/llama/rope.h) replaces base.
  const float* table = in.size() > 1 && in[1].data != nullptr ? in[1].ptr<const float>() : nullptr;
  MAMMOTH_CHECK(table == nullptr || in[1].numel() == half)
      << "[rope] inv_freq has " << in[1].numel() << " entries, need rotary dim / 2 = " << half;
  for (int64_t i = 0; i < half; ++i) {
    // inv_freq rounded to float as Hugging Face computes it, for bitwise-close parity
    inv_freq[i] =
        table != nullptr
            ? table[i]
            : static_cast<float>(1.0 / std::pow(p->base, static_cast<double>(2 * i) / rot));
  }
  parallel_for(0, Tn, std::max<int64_t>(1, 256 / std::max<int64_t>(half, 1)),
               [&](int64_t t0, int64_t t1) {
                 for (int64_t t = t0; t < t1; ++t) {
                   const double pos = static_cast<double>(p->position_offset + t);
                   for (int64_t i = 0; i < half; ++i) {
                     const double ang = pos * inv_freq[i];
                     cs[t * half + i] = static_cast<T>(std::cos(ang));
                     sn[t * half + i] = static_cast<T>(sign * std::sin(ang));
                   }
                 }
               });
  parallel_for(0, B * Tn, std::max<int64_t>(1, 4096 / std::max<int64_t>(H * D, 1)),
               [&](int64_t b0, int64_t b1) {
                 for (int64_t bt = b0; bt < b1; ++bt) {
                   const T* c = cs.data() + (bt % Tn) * half;
                   const T* s = sn.data() + (bt % Tn) * half;
                   for (int64_t h = 0; h < H; ++h) {
                     const T* xr = x + (bt * H + h) * D;
                     T* yr = y + (bt * H + h) * D;
                     for (int64_t i = 0; i < half; ++i) {
                       const T a = xr[i], b = xr[i + half];
                       yr[i] = a * c[i] - b * s[i];
                       yr[i + half] = b * c[i] + a * s[i];
                     }
                     for (int64_t i = rot; i < D; ++i) yr[i] = xr[i];
                   }
                 }
               });
}

}  // namespace

void register_nn(Registry& r) {
#define MAMMOTH_REG(NAME) \
  add_float_kernels(r, Kernel::NAME, NAME##_kernel<float>, NAME##_kernel<double>);
  MAMMOTH_REG(softmax)
  MAMMOTH_REG(softmax_backward)
  MAMMOTH_REG(log_softmax)
  MAMMOTH_REG(log_softmax_backward)
  MAMMOTH_REG(layer_norm)
  MAMMOTH_REG(layer_norm_backward)
  MAMMOTH_REG(rms_norm)
  MAMMOTH_REG(rms_norm_backward)
  MAMMOTH_REG(cross_entropy)
  MAMMOTH_REG(cross_entropy_backward)
  MAMMOTH_REG(dropout)
  MAMMOTH_REG(rope)
#undef MAMMOTH_REG
}

}  // namespace mammoth::kernels::cpu
