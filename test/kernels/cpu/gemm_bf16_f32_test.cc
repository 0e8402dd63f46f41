// gemm_bf16_f32 (f32 operands rounded to bf16 while packing) against an f64 reference on the
// float_to_bf16-rounded operands: every transpose combination, edge tiles, several K / M / N
// blocks, padded leading dimensions, alpha/beta, threads, batches with a broadcast operand.
#include "kernels/cpu/gemm_bf16_f32.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "base/thread_pool.h"
#include "catch2/catch.hpp"

namespace mammoth::kernels::cpu {
namespace {

float round_bf16(float x) {
  const uint32_t u = static_cast<uint32_t>(float_to_bf16(x).bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// A rows x cols matrix stored with row stride ld >= cols, filled with N(0, 1).
struct Mat {
  int64_t rows, cols, ld;
  std::vector<float> v;
  Mat(int64_t r, int64_t c, int64_t pad, std::mt19937& rng)
      : rows(r), cols(c), ld(std::max<int64_t>(c + pad, 1)), v(static_cast<size_t>(r * ld + 1)) {
    std::normal_distribution<float> d;
    for (float& x : v) x = d(rng);
  }
  float at(bool trans, int64_t i, int64_t k) const { return trans ? v[k * ld + i] : v[i * ld + k]; }
};

// Counts entries of C outside the f32-accumulation error bound of the f64 result on bf16
// values (or not NaN where the reference is NaN).
int64_t check(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const Mat& A,
              const Mat& B, float beta, const std::vector<float>& c0, const float* C, int64_t ldc) {
  int64_t bad = 0;
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p =
            static_cast<double>(round_bf16(A.at(ta, i, k))) * round_bf16(B.at(tb, k, j));
        s += p;
        mag += std::fabs(p);
      }
      double ref = alpha * s, bound = (K + 4) * 1.2e-7 * std::fabs(alpha) * mag + 1e-30;
      if (beta != 0.0f) {
        ref += beta * static_cast<double>(c0[i * ldc + j]);
        bound += 1.2e-7 * std::fabs(beta * c0[i * ldc + j]);
      }
      const float got = C[i * ldc + j];
      if (std::isnan(ref) ? !std::isnan(got) : !(std::fabs(got - ref) <= bound)) ++bad;
    }
  }
  return bad;
}

TEST_CASE("gemm_bf16_f32 matches an f64 reference on bf16-rounded operands") {
  if (!gemm_bf16_f32_supported()) {
    WARN("no AVX512_BF16 on this CPU: gemm_bf16_f32 is not used here");
    return;
  }
  std::mt19937 rng(7);
  // {M, N, K}: tails of the 6 x 64 tile, odd K, K over one 1536 block, N over one 256 block,
  // M over one 4098 block, and the GPT-2 layouts at reduced size.
  const int64_t shapes[][3] = {{1, 1, 1},       {7, 13, 3},     {6, 64, 32},   {33, 65, 31},
                               {13, 300, 1700}, {50, 70, 3100}, {4100, 3, 5},  {64, 200, 96},
                               {1, 300, 129},   {300, 1, 77},   {97, 130, 257}};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (const auto& s : shapes) {
      const int64_t M = s[0], N = s[1], K = s[2];
      for (int t = 0; t < 8; ++t) {
        const bool ta = t & 1, tb = t & 2, acc = t & 4;
        const float alpha = t == 2 ? -0.5f : 1.0f, beta = acc ? 0.75f : 0.0f;
        const Mat A(ta ? K : M, ta ? M : K, t % 3, rng);
        const Mat B(tb ? N : K, tb ? K : N, (t + 1) % 3, rng);
        const int64_t ldc = N + t % 2;
        std::vector<float> C(static_cast<size_t>(M * ldc));
        std::normal_distribution<float> d;
        for (float& x : C) x = acc ? d(rng) : std::numeric_limits<float>::quiet_NaN();
        const std::vector<float> c0 = C;
        gemm_bf16_f32(ta, tb, M, N, K, alpha, A.v.data(), A.ld, B.v.data(), B.ld, beta, C.data(),
                      ldc);
        INFO("M=" << M << " N=" << N << " K=" << K << " ta=" << ta << " tb=" << tb
                  << " beta=" << beta << " threads=" << threads);
        CHECK(check(ta, tb, M, N, K, alpha, A, B, beta, c0, C.data(), ldc) == 0);
      }
    }
  }
  set_num_threads(0);
}

TEST_CASE("gemm_bf16_f32 rounds to nearest even and propagates NaN and inf") {
  if (!gemm_bf16_f32_supported()) return;
  // 1 + 2^-8 is halfway between two bf16 values and rounds to even (1.0); 1 + 3*2^-8 rounds
  // up to 1 + 2^-6... the reference computes what float_to_bf16 gives, so compare with it.
  const float a[4] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 3.0e38f, -1.5f};
  const float b[4] = {1.0f, 1.0f, 0.0f, 1.0f + 1.0f / 512};
  float c = -1.0f;
  gemm_bf16_f32(false, false, 1, 1, 4, 1.0f, a, 4, b, 1, 0.0f, &c, 1);
  double want = 0;
  for (int k = 0; k < 4; ++k) want += static_cast<double>(round_bf16(a[k])) * round_bf16(b[k]);
  CHECK(c == static_cast<float>(want));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const float an[2] = {nan, 1.0f}, ai[2] = {inf, 1.0f}, bb[2] = {1.0f, 2.0f};
  gemm_bf16_f32(false, false, 1, 1, 2, 1.0f, an, 2, bb, 1, 0.0f, &c, 1);
  CHECK(std::isnan(c));
  gemm_bf16_f32(false, false, 1, 1, 2, 1.0f, ai, 2, bb, 1, 0.0f, &c, 1);
  CHECK(c == inf);
}

TEST_CASE("gemm_bf16_f32_batched: per-matrix strides, broadcast operand, threads") {
  if (!gemm_bf16_f32_supported()) return;
  std::mt19937 rng(11);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (int64_t batch : {1, 3, 12}) {
      const int64_t M = 19, N = 70, K = 33;
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        std::vector<Mat> As, Bs;
        for (int64_t b = 0; b < batch; ++b) As.emplace_back(ta ? K : M, ta ? M : K, 0, rng);
        const Mat Bm(tb ? N : K, tb ? K : N, 0, rng);  // broadcast: stride 0
        std::vector<float> Aall;
        const int64_t sa = static_cast<int64_t>(As[0].v.size());
        for (const Mat& m : As) Aall.insert(Aall.end(), m.v.begin(), m.v.end());
        std::vector<float> C(static_cast<size_t>(batch * M * N), 5.0f);
        const std::vector<float> c0 = C;
        gemm_bf16_f32_batched(ta, tb, M, N, K, 2.0f, Aall.data(), As[0].ld, sa, Bm.v.data(), Bm.ld,
                              0, 1.0f, C.data(), N, M * N, batch);
        for (int64_t b = 0; b < batch; ++b) {
          INFO("batch " << b << "/" << batch << " ta=" << ta << " tb=" << tb
                        << " threads=" << threads);
          const std::vector<float> cb(c0.begin() + b * M * N, c0.begin() + (b + 1) * M * N);
          CHECK(check(ta, tb, M, N, K, 2.0f, As[b], Bm, 1.0f, cb, C.data() + b * M * N, N) == 0);
        }
      }
    }
  }
  set_num_threads(0);
}

}  // namespace
}  // namespace mammoth::kernels::cpu
