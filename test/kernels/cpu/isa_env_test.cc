// MAMMOTH_ISA (kernels/cpu/isa_env.h) forces both kernel families for the whole process. The
// cases read the variable themselves and check what the kernels do with it, so one binary
// covers every value: isa_env_test.sh runs it unset, with each family (the ones this CPU runs
// and the ones it does not) and with bad values; run plainly it checks the unset default.
#include "kernels/cpu/isa_env.h"

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/fast.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/simd.h"
#include "kernels/registry.h"

namespace mammoth::kernels::cpu {
namespace {

const char* env() { return std::getenv(kIsaEnvVar); }

// What the value should select, or why it must fail ("" when it is fine).
std::string expected_failure(const std::string& value) {
  if (value != "" && value != "auto" && value != "avx512" && value != "avx2" &&
      value != "portable") {
    return "[MAMMOTH_ISA] unknown instruction set MAMMOTH_ISA='" + value +
           "': use avx512, avx2, portable or auto";
  }
  if (value == "avx512" && !simd_isa_supported(SimdIsa::kAvx512)) {
    return "MAMMOTH_ISA=avx512, but this CPU cannot run the avx512 fused kernels";
  }
  if (value == "avx512" && !gemm_isa_supported(GemmIsa::kAvx512)) {
    return "MAMMOTH_ISA=avx512, but this CPU cannot run the avx512 GEMM kernels";
  }
  if (value == "avx2" && !simd_isa_supported(SimdIsa::kAvx2)) {
    return "MAMMOTH_ISA=avx2, but this CPU cannot run the avx2 fused kernels";
  }
  return "";
}

SimdIsa best_simd() {
  return simd_isa_supported(SimdIsa::kAvx512) ? SimdIsa::kAvx512
         : simd_isa_supported(SimdIsa::kAvx2) ? SimdIsa::kAvx2
                                              : SimdIsa::kPortable;
}

GemmIsa best_gemm() {
  return gemm_isa_supported(GemmIsa::kAvx512) ? GemmIsa::kAvx512
         : gemm_isa_supported(GemmIsa::kAvx2) ? GemmIsa::kAvx2
                                              : GemmIsa::kPortable;
}

const FastKernels& table_of(SimdIsa isa) {
  switch (isa) {
    case SimdIsa::kAvx512:
      return avx512::fast_kernels();
    case SimdIsa::kAvx2:
      return avx2::fast_kernels();
    default:
      return portable::fast_kernels();
  }
}

}  // namespace

TEST_CASE("parse_isa_request knows the families and names the variable otherwise") {
  CHECK(parse_isa_request(nullptr) == IsaRequest::kAuto);
  CHECK(parse_isa_request("") == IsaRequest::kAuto);
  CHECK(parse_isa_request("auto") == IsaRequest::kAuto);
  CHECK(parse_isa_request("avx512") == IsaRequest::kAvx512);
  CHECK(parse_isa_request("avx2") == IsaRequest::kAvx2);
  CHECK(parse_isa_request("portable") == IsaRequest::kPortable);
  for (const char* bad : {"AVX2", "avx", "sse4", "avx2 ", "native"}) {
    INFO(bad);
    CHECK_THROWS_WITH(parse_isa_request(bad),
                      Catch::Contains(std::string("MAMMOTH_ISA='") + bad + "'") &&
                          Catch::Contains("use avx512, avx2, portable or auto"));
  }
  CHECK(std::string(isa_request_name(IsaRequest::kAvx2)) == "avx2");
}

TEST_CASE("the kernels run the family MAMMOTH_ISA names, or refuse it clearly") {
  const std::string value = env() ? env() : "";
  INFO("MAMMOTH_ISA='" << value << "'");
  const std::string failure = expected_failure(value);
  if (!failure.empty()) {
    // Every way in fails alike: the registry's start-up, either family, the summary.
    CHECK_THROWS_WITH(Registry::instance(), Catch::Contains(failure));
    CHECK_THROWS_WITH(check_isa_setting(), Catch::Contains(failure));
    CHECK_THROWS_AS(kernel_isa_summary(), Error);
    if (failure.find("GEMM") == std::string::npos) {
      CHECK_THROWS_WITH(active_simd_isa(), Catch::Contains(failure));
    }
    if (failure.find("unknown") != std::string::npos) {
      CHECK_THROWS_WITH(isa_request_from_env(), Catch::Contains(failure));
    }
    // A family forced in code still runs (the tests' and benches' own switches).
    set_simd_isa(SimdIsa::kPortable);
    set_gemm_isa(GemmIsa::kPortable);
    CHECK(active_simd_isa() == SimdIsa::kPortable);
    CHECK(active_gemm_isa() == GemmIsa::kPortable);
    set_simd_isa(SimdIsa::kAuto);
    set_gemm_isa(GemmIsa::kAuto);
    return;
  }
  const bool unset = value.empty() || value == "auto";
  const SimdIsa simd = value == "avx512"     ? SimdIsa::kAvx512
                       : value == "avx2"     ? SimdIsa::kAvx2
                       : value == "portable" ? SimdIsa::kPortable
                                             : best_simd();
  const GemmIsa gemm = value == "avx512"     ? GemmIsa::kAvx512
                       : value == "avx2"     ? GemmIsa::kAvx2
                       : value == "portable" ? GemmIsa::kPortable
                                             : best_gemm();
  REQUIRE_NOTHROW(Registry::instance());
  CHECK(active_simd_isa() == simd);
  CHECK(active_gemm_isa() == gemm);
  // The fused kernels really dispatch to that family's table.
  CHECK(&fast_kernels() == &table_of(simd));
  if (unset) {
    const std::string names =
        simd_isa_name(simd) == std::string(gemm_isa_name(gemm))
            ? std::string(simd_isa_name(simd))
            : std::string("fused ") + simd_isa_name(simd) + ", gemm " + gemm_isa_name(gemm);
    CHECK(kernel_isa_summary() == names + " (best on this CPU)");
  } else {
    CHECK(kernel_isa_summary() == value + " (MAMMOTH_ISA=" + value + ")");
  }
  // Forcing another family in code, then kAuto, returns to MAMMOTH_ISA's, not the CPU's best.
  set_simd_isa(SimdIsa::kPortable);
  set_gemm_isa(GemmIsa::kPortable);
  CHECK(&fast_kernels() == &portable::fast_kernels());
  if (simd != SimdIsa::kPortable) CHECK(kernel_isa_summary() == "portable (forced)");
  set_simd_isa(SimdIsa::kAuto);
  set_gemm_isa(GemmIsa::kAuto);
  CHECK(active_simd_isa() == simd);
  CHECK(active_gemm_isa() == gemm);
  // And that family computes: a GEMM through it against the double reference.
  const int64_t M = 13, N = 37, K = 29;
  std::vector<float> a(M * K), b(K * N), c(M * N);
  std::vector<double> ad(M * K), bd(K * N), cd(M * N);
  for (int64_t i = 0; i < M * K; ++i) ad[i] = a[i] = static_cast<float>((i * 7 % 11) - 5) / 8;
  for (int64_t i = 0; i < K * N; ++i) bd[i] = b[i] = static_cast<float>((i * 5 % 13) - 6) / 8;
  sgemm(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N);
  dgemm(false, false, M, N, K, 1.0, ad.data(), K, bd.data(), N, 0.0, cd.data(), N);
  for (int64_t i = 0; i < M * N; ++i) REQUIRE(c[i] == Approx(cd[i]).margin(1e-5));
}

}  // namespace mammoth::kernels::cpu
