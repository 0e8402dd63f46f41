// Tests for kernels/cpu/gemm: every ISA path this CPU supports, on 1 and 2 threads, against a
// naive double-accumulating reference, on awkward sizes, all transposes, padded strides,
// alpha/beta variants (beta = 0 over NaN), batches, bf16 inputs, the fused epilogue and dgemm.
#include "kernels/cpu/gemm.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "kernels/cpu/gemm_internal.h"

namespace mammoth::kernels::cpu {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 12345.0f;

std::vector<GemmIsa> supported_isas() {
  std::vector<GemmIsa> isas = {GemmIsa::kPortable};
  if (gemm_isa_supported(GemmIsa::kAvx2)) isas.push_back(GemmIsa::kAvx2);
  if (gemm_isa_supported(GemmIsa::kAvx512)) isas.push_back(GemmIsa::kAvx512);
  return isas;
}

// Restores the automatic ISA and the default pool when a test ends, even on failure.
struct IsaGuard {
  ~IsaGuard() {
    set_gemm_isa(GemmIsa::kAuto);
    set_num_threads(0);
  }
};

// A stored matrix with a padded row stride, padding filled with a sentinel.
struct Mat {
  int64_t rows, cols, ld;
  std::vector<float> v;
  Mat(int64_t r, int64_t c, int64_t pad, std::mt19937& rng) : rows(r), cols(c), ld(c + pad) {
    v.assign(static_cast<size_t>(std::max<int64_t>(1, r * ld)), kSentinel);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < c; ++j) v[i * ld + j] = d(rng);
    }
  }
};

struct Case {
  bool ta, tb;
  int64_t M, N, K;
  float alpha, beta;
  int64_t pad;
};

std::string describe(const Case& c, GemmIsa isa, int threads) {
  std::ostringstream s;
  s << (c.ta ? 'T' : 'N') << (c.tb ? 'T' : 'N') << " M=" << c.M << " N=" << c.N << " K=" << c.K
    << " alpha=" << c.alpha << " beta=" << c.beta << " pad=" << c.pad
    << " isa=" << gemm_isa_name(isa) << " threads=" << threads;
  return s.str();
}

// Reference: out = alpha * op(A) op(B) + beta * C0 in double, and the bound on the rounding
// error of an fp32 computation: ~ (K + 2) ulp-scale of sum |alpha a b| + |beta c|.
void reference(const Case& c, const float* A, int64_t lda, const float* B, int64_t ldb,
               const float* C0, int64_t ldc, std::vector<double>& out, std::vector<double>& bound) {
  out.assign(c.M * c.N, 0.0);
  bound.assign(c.M * c.N, 0.0);
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double a = c.ta ? A[k * lda + i] : A[i * lda + k];
        const double b = c.tb ? B[j * ldb + k] : B[k * ldb + j];
        s += a * b;
        mag += std::fabs(a * b);
      }
      double r = c.alpha * s;
      double m = std::fabs(c.alpha) * mag;
      if (c.beta != 0.0f) {
        r += static_cast<double>(c.beta) * C0[i * ldc + j];
        m += std::fabs(c.beta * C0[i * ldc + j]);
      }
      out[i * c.N + j] = r;
      bound[i * c.N + j] = 2.0 * (c.K + 2) * 1.2e-7 * m + 1e-30;
    }
  }
}

// Runs one case through sgemm on the current ISA/threads and checks every element and that
// C's row padding is untouched.
void check_sgemm(const Case& c, GemmIsa isa, int threads, std::mt19937& rng) {
  Mat A(c.ta ? c.K : c.M, c.ta ? c.M : c.K, c.pad, rng);
  Mat B(c.tb ? c.N : c.K, c.tb ? c.K : c.N, c.pad, rng);
  Mat C(c.M, c.N, c.pad, rng);
  if (c.beta == 0.0f) {
    for (int64_t i = 0; i < c.M; ++i) {
      for (int64_t j = 0; j < c.N; ++j) C.v[i * C.ld + j] = kNaN;
    }
  }
  std::vector<double> ref, bound;
  reference(c, A.v.data(), A.ld, B.v.data(), B.ld, C.v.data(), C.ld, ref, bound);
  sgemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.v.data(), A.ld, B.v.data(), B.ld, c.beta, C.v.data(),
        C.ld);
  int64_t bad = 0;
  std::string first;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < C.ld; ++j) {
      const float got = C.v[i * C.ld + j];
      bool ok;
      double want;
      if (j < c.N) {
        want = ref[i * c.N + j];
        ok = std::fabs(got - want) <= bound[i * c.N + j];  // false for NaN
      } else {
        want = kSentinel;
        ok = got == kSentinel;
      }
      if (!ok && bad++ == 0) {
        std::ostringstream s;
        s << "C[" << i << "," << j << "] = " << got << ", want " << want;
        first = s.str();
      }
    }
  }
  INFO(describe(c, isa, threads) << ": " << bad << " bad elements, first " << first);
  CHECK(bad == 0);
}

const int64_t kSizes[] = {1, 2, 3, 7, 13, 31, 33, 65, 127, 257};

TEST_CASE("sgemm matches the reference on awkward sizes, every ISA, 1 and 2 threads") {
  IsaGuard guard;
  std::mt19937 rng(1);
  // Mixed shapes (the parallel path starts at 4 MFLOP): GEMV-like, K beyond one K block, M beyond
  // one M block, N beyond one N block.
  const int64_t mixed[][3] = {
      {1, 257, 33},
      {257, 1, 65},
      {13, 127, 7},
      {33, 65, 257},
      {1, 700, 1000},
      {700, 1, 500},
      {31, 45, 1000},
      {4200, 17, 5},
      {5, 1100, 9},
      {130, 200, 400},
      {64, 64, 64},
      // Big enough (> 4 MFLOP) to be split over threads: by columns (few rows), and by rows.
      {5, 1100, 500},
      {2, 3000, 700},
      {700, 5, 1500}};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (GemmIsa isa : supported_isas()) {
      set_gemm_isa(isa);
      REQUIRE(active_gemm_isa() == isa);
      std::vector<Case> cases;
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        for (int64_t s : kSizes) cases.push_back({ta, tb, s, s, s, 1.0f, 0.0f, 3});
        for (const auto& m : mixed) cases.push_back({ta, tb, m[0], m[1], m[2], 1.0f, 0.0f, 1});
        cases.push_back({ta, tb, 65, 33, 31, 0.5f, -1.25f, 5});
        cases.push_back({ta, tb, 127, 257, 13, -2.0f, 1.0f, 0});
        cases.push_back({ta, tb, 33, 127, 300, 1.5f, 0.0f, 2});
        cases.push_back({ta, tb, 257, 65, 129, 1.0f, 0.25f, 7});
      }
      for (const Case& c : cases) check_sgemm(c, isa, threads, rng);
    }
  }
}

TEST_CASE("sgemm with K == 0 or alpha == 0 gives beta * C and never reads C when beta == 0") {
  IsaGuard guard;
  for (GemmIsa isa : supported_isas()) {
    set_gemm_isa(isa);
    std::vector<float> C = {kNaN, kNaN, kNaN, kNaN, kNaN, kNaN};
    sgemm(false, false, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 0.0f, C.data(), 3);
    for (float x : C) CHECK(x == 0.0f);
    C = {1, 2, 3, 4, 5, 6};
    sgemm(true, true, 2, 3, 0, 1.0f, nullptr, 2, nullptr, 1, 2.0f, C.data(), 3);
    CHECK(C == std::vector<float>{2, 4, 6, 8, 10, 12});
    // alpha == 0: A and B are not needed (BLAS semantics), even if they hold NaN.
    std::vector<float> A(6, kNaN), B(9, kNaN);
    sgemm(false, false, 2, 3, 3, 0.0f, A.data(), 3, B.data(), 3, -1.0f, C.data(), 3);
    CHECK(C == std::vector<float>{-2, -4, -6, -8, -10, -12});
    // M == 0 and N == 0 touch nothing.
    sgemm(false, false, 0, 3, 3, 1.0f, A.data(), 3, B.data(), 3, 0.0f, C.data(), 3);
    sgemm(false, false, 2, 0, 3, 1.0f, A.data(), 3, B.data(), 1, 0.0f, C.data(), 1);
    CHECK(C == std::vector<float>{-2, -4, -6, -8, -10, -12});
  }
}

TEST_CASE("sgemm rejects bad sizes and strides; set_gemm_isa names ISAs") {
  std::vector<float> X(64);
  CHECK_THROWS_AS(sgemm(false, false, -1, 2, 2, 1.0f, X.data(), 2, X.data(), 2, 0.0f, X.data(), 2),
                  Error);
  // lda shorter than a row of A (K = 4).
  CHECK_THROWS_AS(sgemm(false, false, 2, 2, 4, 1.0f, X.data(), 3, X.data(), 2, 0.0f, X.data(), 2),
                  Error);
  // trans_b: B is N x K, so ldb must be >= K.
  CHECK_THROWS_AS(sgemm(false, true, 2, 2, 4, 1.0f, X.data(), 4, X.data(), 2, 0.0f, X.data(), 2),
                  Error);
  CHECK_THROWS_AS(sgemm(false, false, 2, 5, 4, 1.0f, X.data(), 4, X.data(), 5, 0.0f, X.data(), 4),
                  Error);
  CHECK(std::string(gemm_isa_name(GemmIsa::kAvx512)) == "avx512");
  CHECK(std::string(gemm_isa_name(GemmIsa::kAvx2)) == "avx2");
  CHECK(std::string(gemm_isa_name(GemmIsa::kPortable)) == "portable");
  CHECK(active_gemm_isa() != GemmIsa::kAuto);
  for (GemmIsa isa : {GemmIsa::kAvx512, GemmIsa::kAvx2}) {
    if (!gemm_isa_supported(isa)) CHECK_THROWS_AS(set_gemm_isa(isa), Error);
  }
}

TEST_CASE("sgemm_strided_batched matches per-matrix references") {
  IsaGuard guard;
  std::mt19937 rng(2);
  struct BatchCase {
    int64_t M, N, K, batch;
  };
  // Many small (one GEMM per thread), few large (each GEMM split across threads).
  const BatchCase shapes[] = {{33, 20, 17, 5}, {16, 16, 64, 16}, {130, 70, 90, 2}, {7, 3, 0, 3}};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (GemmIsa isa : supported_isas()) {
      set_gemm_isa(isa);
      for (const BatchCase& s : shapes) {
        for (int t = 0; t < 4; ++t) {
          const bool ta = t & 1, tb = t & 2;
          const float alpha = 0.75f, beta = t == 3 ? 0.5f : 0.0f;
          const int64_t lda = (ta ? s.M : s.K) + 2, ldb = (tb ? s.K : s.N) + 1, ldc = s.N + 3;
          const int64_t sa = (ta ? s.K : s.M) * lda + 5, sb = (tb ? s.N : s.K) * ldb + 3,
                        sc = s.M * ldc + 4;
          std::uniform_real_distribution<float> d(-1, 1);
          std::vector<float> A(sa * s.batch + 1), B(sb * s.batch + 1), C(sc * s.batch, kNaN);
          for (float& x : A) x = d(rng);
          for (float& x : B) x = d(rng);
          if (beta != 0.0f) {
            for (float& x : C) x = d(rng);
          }
          const std::vector<float> C0 = C;
          sgemm_strided_batched(ta, tb, s.M, s.N, s.K, alpha, A.data(), lda, sa, B.data(), ldb, sb,
                                beta, C.data(), ldc, sc, s.batch);
          int64_t bad = 0;
          for (int64_t b = 0; b < s.batch; ++b) {
            const Case c{ta, tb, s.M, s.N, s.K, alpha, beta, 0};
            std::vector<double> ref, bound;
            reference(c, A.data() + b * sa, lda, B.data() + b * sb, ldb, C0.data() + b * sc, ldc,
                      ref, bound);
            for (int64_t i = 0; i < s.M; ++i) {
              for (int64_t j = 0; j < s.N; ++j) {
                const float got = C[b * sc + i * ldc + j];
                if (!(std::fabs(got - ref[i * s.N + j]) <= bound[i * s.N + j])) ++bad;
              }
            }
          }
          INFO("batched " << describe({ta, tb, s.M, s.N, s.K, alpha, beta, 0}, isa, threads)
                          << " batch=" << s.batch);
          CHECK(bad == 0);
        }
      }
    }
  }
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Expert-sized groups of unequal sizes (one empty, one K == 0 that must write zeros over NaN),
// all transposes, padded strides: each group against its own reference, on every ISA and on
// 1 and 2 threads, with results identical across thread counts.
TEST_CASE("sgemm_grouped matches per-group references and is thread-count invariant") {
  IsaGuard guard;
  std::mt19937 rng(7);
  for (GemmIsa isa : supported_isas()) {
    set_gemm_isa(isa);
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        const std::vector<Case> cases = {{ta, tb, 37, 65, 33, 1, 0, 3},
                                         {ta, tb, 0, 65, 33, 1, 0, 0},
                                         {ta, tb, 5, 17, 0, 1, 0, 1},
                                         {ta, tb, 130, 31, 64, 1, 0, 2},
                                         {ta, tb, 1, 7, 257, 1, 0, 0}};
        std::vector<Mat> A, B, C;
        for (const Case& c : cases) {
          A.emplace_back(ta ? c.K : c.M, ta ? c.M : c.K, c.pad, rng);
          B.emplace_back(tb ? c.N : c.K, tb ? c.K : c.N, c.pad, rng);
          C.emplace_back(c.M, c.N, c.pad, rng);
          for (int64_t i = 0; i < c.M; ++i)
            for (int64_t j = 0; j < c.N; ++j) C.back().v[i * C.back().ld + j] = kNaN;
        }
        std::vector<GemmGroup> groups;
        for (size_t g = 0; g < cases.size(); ++g) {
          const Case& c = cases[g];
          groups.push_back({ta, tb, c.M, c.N, c.K, A[g].v.data(), A[g].ld, B[g].v.data(), B[g].ld,
                            C[g].v.data(), C[g].ld});
        }
        std::vector<std::vector<float>> first;
        for (int threads : {1, 2}) {
          set_num_threads(threads);
          sgemm_grouped(groups.data(), static_cast<int64_t>(groups.size()));
          std::vector<std::vector<float>> got;
          for (size_t g = 0; g < cases.size(); ++g) {
            const Case& c = cases[g];
            std::vector<double> ref, bound;
            reference(c, A[g].v.data(), A[g].ld, B[g].v.data(), B[g].ld, C[g].v.data(), C[g].ld,
                      ref, bound);
            int64_t bad = 0;
            for (int64_t i = 0; i < c.M; ++i) {
              for (int64_t j = 0; j < C[g].ld; ++j) {
                const float v = C[g].v[i * C[g].ld + j];
                if (j < c.N ? !(std::fabs(v - ref[i * c.N + j]) <= bound[i * c.N + j])
                            : v != kSentinel)
                  ++bad;
              }
            }
            INFO("group " << g << " " << describe(c, isa, threads));
            CHECK(bad == 0);
            got.push_back(C[g].v);
          }
          if (threads == 1) first = got;
          CHECK(got == first);
        }
      }
    }
  }
}

TEST_CASE("gemm_bf16 matches an fp32 reference on the bf16 values") {
  IsaGuard guard;
  std::mt19937 rng(3);
  const int64_t shapes[][3] = {{1, 1, 1},      {7, 13, 3},     {33, 65, 31},  {127, 31, 257},
                               {13, 40, 1700}, {257, 257, 65}, {1, 300, 129}, {300, 1, 77}};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (GemmIsa isa : supported_isas()) {
      set_gemm_isa(isa);
      // AVX-512 has two bf16 paths: vdpbf16ps (when the CPU has AVX512_BF16) and convert.
      for (bool dot : {true, false}) {
        if (!dot && isa != GemmIsa::kAvx512) continue;
        internal::set_bf16_dot_allowed(dot);
        for (const auto& s : shapes) {
          for (int t = 0; t < 4; ++t) {
            const Case c{static_cast<bool>(t & 1), static_cast<bool>(t & 2), s[0], s[1], s[2],
                         t == 2 ? -0.5f : 1.0f,    t == 1 ? 0.5f : 0.0f,     2};
            // Round the operands to bf16, then keep them as floats for the reference.
            Mat A(c.ta ? c.K : c.M, c.ta ? c.M : c.K, c.pad, rng);
            Mat B(c.tb ? c.N : c.K, c.tb ? c.K : c.N, c.pad, rng);
            Mat C(c.M, c.N, c.pad, rng);
            std::vector<uint16_t> Ab(A.v.size()), Bb(B.v.size());
            for (size_t i = 0; i < A.v.size(); ++i) A.v[i] = from_bf16(Ab[i] = to_bf16(A.v[i]));
            for (size_t i = 0; i < B.v.size(); ++i) B.v[i] = from_bf16(Bb[i] = to_bf16(B.v[i]));
            if (c.beta == 0.0f) {
              for (float& x : C.v) x = kNaN;
            }
            std::vector<double> ref, bound;
            reference(c, A.v.data(), A.ld, B.v.data(), B.ld, C.v.data(), C.ld, ref, bound);
            gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, c.alpha, Ab.data(), A.ld, Bb.data(), B.ld, c.beta,
                      C.v.data(), C.ld);
            int64_t bad = 0;
            for (int64_t i = 0; i < c.M; ++i) {
              for (int64_t j = 0; j < c.N; ++j) {
                const float got = C.v[i * C.ld + j];
                if (!(std::fabs(got - ref[i * c.N + j]) <= bound[i * c.N + j])) ++bad;
              }
            }
            INFO("bf16 " << describe(c, isa, threads) << " dot=" << dot);
            CHECK(bad == 0);
          }
        }
      }
      internal::set_bf16_dot_allowed(true);
    }
  }
}

TEST_CASE("sgemm_fused adds the bias and applies GELU (tanh)") {
  IsaGuard guard;
  std::mt19937 rng(4);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (GemmIsa isa : supported_isas()) {
      set_gemm_isa(isa);
      for (GemmActivation act : {GemmActivation::kNone, GemmActivation::kGeluTanh}) {
        // K = 900 spans two K blocks: the epilogue must run once, after the last one.
        for (const Case& c : {Case{false, true, 67, 129, 900, 1.0f, 0.0f, 1},
                              Case{true, false, 300, 40, 33, 0.5f, 1.0f, 0},
                              // Split by columns over 2 threads: the bias must follow the slab.
                              Case{true, true, 4, 700, 800, 1.0f, 0.0f, 3}}) {
          Mat A(c.ta ? c.K : c.M, c.ta ? c.M : c.K, c.pad, rng);
          Mat B(c.tb ? c.N : c.K, c.tb ? c.K : c.N, c.pad, rng);
          Mat C(c.M, c.N, c.pad, rng);
          Mat bias(1, c.N, 0, rng);
          std::vector<double> ref, bound;
          reference(c, A.v.data(), A.ld, B.v.data(), B.ld, C.v.data(), C.ld, ref, bound);
          sgemm_fused(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.v.data(), A.ld, B.v.data(), B.ld,
                      c.beta, C.v.data(), C.ld, GemmEpilogue{bias.v.data(), act});
          int64_t bad = 0;
          for (int64_t i = 0; i < c.M; ++i) {
            for (int64_t j = 0; j < c.N; ++j) {
              double x = ref[i * c.N + j] + bias.v[j];
              double tol = bound[i * c.N + j] + 1e-6 * std::fabs(x);
              if (act == GemmActivation::kGeluTanh) {
                const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
                x = 0.5 * x * (1.0 + std::tanh(u));
                tol = tol * 1.2 + 2e-6 * (1.0 + std::fabs(x));
              }
              if (!(std::fabs(C.v[i * C.ld + j] - x) <= tol)) ++bad;
            }
          }
          INFO("fused act=" << static_cast<int>(act) << " " << describe(c, isa, threads));
          CHECK(bad == 0);
        }
      }
    }
  }
}

TEST_CASE("dgemm matches the reference to double precision") {
  IsaGuard guard;
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> d(-1, 1);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      for (const auto& s : {std::vector<int64_t>{1, 1, 1}, {7, 13, 31}, {65, 33, 127}, {3, 5, 0}}) {
        const int64_t M = s[0], N = s[1], K = s[2];
        const int64_t lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 2, ldc = N + 1;
        std::vector<double> A((ta ? K : M) * lda + 1), B((tb ? N : K) * ldb + 1), C(M * ldc);
        for (double& x : A) x = d(rng);
        for (double& x : B) x = d(rng);
        for (double& x : C) x = t == 1 ? d(rng) : std::numeric_limits<double>::quiet_NaN();
        const double alpha = 1.25, beta = t == 1 ? -0.5 : 0.0;
        const std::vector<double> C0 = C;
        dgemm(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        int64_t bad = 0;
        for (int64_t i = 0; i < M; ++i) {
          for (int64_t j = 0; j < N; ++j) {
            long double s2 = 0;
            for (int64_t k = 0; k < K; ++k) {
              s2 += static_cast<long double>(ta ? A[k * lda + i] : A[i * lda + k]) *
                    (tb ? B[j * ldb + k] : B[k * ldb + j]);
            }
            long double want = alpha * s2;
            if (beta != 0.0) want += beta * C0[i * ldc + j];
            if (!(std::fabs(static_cast<double>(C[i * ldc + j] - want)) <= 1e-13 * (K + 2))) ++bad;
          }
        }
        INFO("dgemm t=" << t << " M=" << M << " N=" << N << " K=" << K << " threads=" << threads);
        CHECK(bad == 0);
      }
    }
  }
}

}  // namespace
}  // namespace mammoth::kernels::cpu
