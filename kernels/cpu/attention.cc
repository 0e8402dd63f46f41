// CPU scaled dot-product attention, memory-efficient: no T x T matrix is ever stored.
//
// f32 runs the tiled kernels of fast.h (query blocks x key blocks through the packed sgemm,
// online softmax, backward recomputing P per block from the lse). The loops below are the f64
// path and the reference those are tested against.
//
// Forward streams over keys with an online softmax per query row and saves the row's
// log-sum-exp. Backward recomputes probabilities from the lse in two passes: one over query
// rows (dq), one over key rows (dk, dv), so every output is accumulated by one thread only
// and results are deterministic. Grouped-query attention: query head h reads kv head
// h / (Hq / Hk).
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/cpu/fast.h"
#include "kernels/cpu/register.h"
#include "kernels/params.h"

namespace mammoth::kernels::cpu {
namespace {

struct Geometry {
  int64_t B, Hq, Hk, Tq, Tk, D, group;
  double scale;
  bool causal;
  int64_t window;
  const bool* key_mask;  // [B, Tk] or null

  Geometry(std::span<const TensorArg> in, const AttentionParams& p, int mask_input) {
    B = in[0].shape[0];
    Hq = in[0].shape[1];
    Tq = in[0].shape[2];
    D = in[0].shape[3];
    Hk = in[1].shape[1];
    Tk = in[1].shape[2];
    group = Hq / Hk;
    scale = p.scale != 0.0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(D));
    causal = p.causal;
    window = p.window;
    key_mask = p.has_key_mask ? in[mask_input].ptr<const bool>() : nullptr;
  }
  AttnArgs fast_args() const {
    AttnArgs a{};
    a.B = B, a.Hq = Hq, a.Hk = Hk, a.Tq = Tq, a.Tk = Tk, a.D = D;
    a.scale = static_cast<float>(scale);
    a.causal = causal;
    a.window = window;
    a.key_mask = key_mask;
    return a;
  }
  bool visible(int64_t b, int64_t i, int64_t j) const {
    const KeyRange keys = visible_keys(causal, window, i, Tq, Tk);
    if (j < keys.begin || j >= keys.end) return false;
    return key_mask == nullptr || key_mask[b * Tk + j];
  }
  // Offsets of the (b, h) slices.
  int64_t q_off(int64_t b, int64_t h) const { return (b * Hq + h) * Tq * D; }
  int64_t k_off(int64_t b, int64_t h) const { return (b * Hk + h / group) * Tk * D; }
};

template <typename T>
T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

template <typename T>
void attention_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                      const void* params) {
  const Geometry g(in, *static_cast<const AttentionParams*>(params), 3);
  const T* q = in[0].ptr<const T>();
  const T* k = in[1].ptr<const T>();
  const T* v = in[2].ptr<const T>();
  T* o = out[0].ptr<T>();
  float* lse = out[1].ptr<float>();
  if constexpr (std::is_same_v<T, float>) {
    AttnArgs a = g.fast_args();
    a.q = q, a.k = k, a.v = v, a.out = o, a.lse = lse;
    fast_kernels().attention(a);
    return;
  }
  parallel_for(0, g.B * g.Hq * g.Tq, 4, [&](int64_t r0, int64_t r1) {
    std::vector<T> acc(g.D);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r % g.Tq, bh = r / g.Tq, b = bh / g.Hq, h = bh % g.Hq;
      const T* qi = q + g.q_off(b, h) + i * g.D;
      const T* kb = k + g.k_off(b, h);
      const T* vb = v + g.k_off(b, h);
      T mx = -std::numeric_limits<T>::infinity();
      T denom = 0;
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t j = 0; j < g.Tk; ++j) {
        if (!g.visible(b, i, j)) continue;
        const T s = dot(qi, kb + j * g.D, g.D) * static_cast<T>(g.scale);
        if (s > mx) {  // rescale the running sums to the new maximum
          const T c = std::exp(mx - s);
          denom *= c;
          for (int64_t d = 0; d < g.D; ++d) acc[d] *= c;
          mx = s;
        }
        const T pj = std::exp(s - mx);
        denom += pj;
        const T* vj = vb + j * g.D;
        for (int64_t d = 0; d < g.D; ++d) acc[d] += pj * vj[d];
      }
      T* oi = o + g.q_off(b, h) + i * g.D;
      if (denom == T(0)) {  // every key masked: output zeros, lse -inf
        std::fill(oi, oi + g.D, T(0));
        lse[r] = -std::numeric_limits<float>::infinity();
        continue;
      }
      for (int64_t d = 0; d < g.D; ++d) oi[d] = acc[d] / denom;
      lse[r] = static_cast<float>(mx + std::log(denom));
    }
  });
}

// inputs: dout, q, k, v, out, lse, [key_mask]; outputs: dq, dk, dv.
template <typename T>
void attention_backward_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                               const void* params) {
  const std::span<const TensorArg> qkv = in.subspan(1);
  const Geometry g(qkv, *static_cast<const AttentionParams*>(params), 5);
  const T* dout = in[0].ptr<const T>();
  const T* q = in[1].ptr<const T>();
  const T* k = in[2].ptr<const T>();
  const T* v = in[3].ptr<const T>();
  const T* o = in[4].ptr<const T>();
  const float* lse = in[5].ptr<const float>();
  T* dq = out[0].ptr<T>();
  T* dk = out[1].ptr<T>();
  T* dv = out[2].ptr<T>();
  if constexpr (std::is_same_v<T, float>) {
    AttnArgs a = g.fast_args();
    a.q = q, a.k = k, a.v = v, a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv;
    a.out = const_cast<float*>(o);  // read only in the backward
    a.lse = const_cast<float*>(lse);
    fast_kernels().attention_backward(a);
    return;
  }
  const T scale = static_cast<T>(g.scale);
  // delta[r] = dout_r . out_r
  std::vector<T> delta(static_cast<size_t>(g.B * g.Hq * g.Tq));
  parallel_for(0, g.B * g.Hq * g.Tq, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) delta[r] = dot(dout + r * g.D, o + r * g.D, g.D);
  });
  auto prob = [&](int64_t r, T s) { return std::exp(s - static_cast<T>(lse[r])); };
  // Pass 1: dq_i = scale * sum_j p_ij (dout_i . v_j - delta_i) k_j
  parallel_for(0, g.B * g.Hq * g.Tq, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t i = r % g.Tq, bh = r / g.Tq, b = bh / g.Hq, h = bh % g.Hq;
      const T* qi = q + r * g.D;
      const T* doi = dout + r * g.D;
      T* dqi = dq + r * g.D;
      std::fill(dqi, dqi + g.D, T(0));
      if (std::isinf(lse[r])) continue;
      const T* kb = k + g.k_off(b, h);
      const T* vb = v + g.k_off(b, h);
      for (int64_t j = 0; j < g.Tk; ++j) {
        if (!g.visible(b, i, j)) continue;
        const T p = prob(r, dot(qi, kb + j * g.D, g.D) * scale);
        const T ds = p * (dot(doi, vb + j * g.D, g.D) - delta[r]) * scale;
        for (int64_t d = 0; d < g.D; ++d) dqi[d] += ds * kb[j * g.D + d];
      }
    }
  });
  // Pass 2: for each kv head and key j, sum over the query heads of its group and all i.
  parallel_for(0, g.B * g.Hk * g.Tk, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t j = r % g.Tk, bh = r / g.Tk, b = bh / g.Hk, hk = bh % g.Hk;
      const T* kj = k + r * g.D;
      const T* vj = v + r * g.D;
      T* dkj = dk + r * g.D;
      T* dvj = dv + r * g.D;
      std::fill(dkj, dkj + g.D, T(0));
      std::fill(dvj, dvj + g.D, T(0));
      for (int64_t h = hk * g.group; h < (hk + 1) * g.group; ++h) {
        for (int64_t i = 0; i < g.Tq; ++i) {
          if (!g.visible(b, i, j)) continue;
          const int64_t qr = (b * g.Hq + h) * g.Tq + i;
          if (std::isinf(lse[qr])) continue;
          const T* qi = q + qr * g.D;
          const T* doi = dout + qr * g.D;
          const T p = prob(qr, dot(qi, kj, g.D) * scale);
          const T ds = p * (dot(doi, vj, g.D) - delta[qr]) * scale;
          for (int64_t d = 0; d < g.D; ++d) {
            dvj[d] += p * doi[d];
            dkj[d] += ds * qi[d];
          }
        }
      }
    }
  });
}

}  // namespace

void register_attention(Registry& r) {
  add_float_kernels(r, Kernel::attention, attention_kernel<float>, attention_kernel<double>);
  add_float_kernels(r, Kernel::attention_backward, attention_backward_kernel<float>,
                    attention_backward_kernel<double>);
}

}  // namespace mammoth::kernels::cpu
