// Benchmarks Mammoth's sgemm (and gemm_bf16) against OpenBLAS on GPT-2 small training shapes.
//
// For every shape x transpose x {1 thread, all threads} it prints our GFLOP/s, OpenBLAS's
// GFLOP/s (the anchor, measured in the same run) and the ratio; each number is the median of
// a few timed runs after a warm-up, ours and OpenBLAS alternating. --json FILE writes the
// rows as a JSON array, one object per row: {name, shape, threads, ours, anchor, unit, ratio}.
//
// Debian's OpenBLAS 0.3.21 does not know Zen 4; unless OPENBLAS_CORETYPE is already set, the
// binary sets it to the core that matches this CPU and re-executes itself, because OpenBLAS
// reads it when the library is loaded: SkylakeX (the AVX-512 kernels) where the CPU has
// AVX-512 F, BW, VL, DQ and CD, Haswell (AVX2 + FMA) where it has those, else nothing (OpenBLAS
// picks; forcing SkylakeX on an AVX2-only CPU kills OpenBLAS with an illegal instruction).
// A core the user set is kept, with a warning when this CPU cannot run it. The settings lines
// say which core was chosen and why, and which Mammoth GEMM ISA runs (--isa, else MAMMOTH_ISA,
// else the best this CPU runs: kernels/cpu/isa_env.h). It sets OPENBLAS_THREAD_TIMEOUT=4 the
// same way: by default OpenBLAS's worker threads spin for about 2^28 cycles after each call, on
// the core that our next timed run (alternating with OpenBLAS's) needs. With two threads on two
// cores that lowers our figure on some shapes of most runs, while OpenBLAS's own rate is the same
// either way (BENCHMARKS.md, "Kernel design measurements").
//
// Usage: gemm_bench [--json FILE] [--reps N] [--quick] [--filter NAME] [--threads N]
//                   [--isa avx512|avx2|portable]
#include "tools/bench/gemm_bench.h"

#include <cblas.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/fma_loop.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa_env.h"

extern "C" char* openblas_get_corename();
extern "C" char* openblas_get_config();

namespace {

namespace kc = mammoth::kernels::cpu;

struct Shape {
  const char* name;
  bool trans_a, trans_b;
  int64_t M, N, K;
  bool bf16 = false;  // our gemm_bf16 against OpenBLAS sgemm (OpenBLAS here has no sbgemm)
};

// GPT-2 small, B*T = 4096 tokens, C = 768. Linear weights stored [in, out] for NN forward;
// the backward passes are dX = dY @ W^T (NT) and dW = X^T @ dY (TN).
const Shape kShapes[] = {
    {"qkv_fwd", false, false, 4096, 2304, 768},
    {"fc_fwd", false, false, 4096, 3072, 768},
    {"proj_fwd", false, false, 4096, 768, 3072},
    {"qkv_dx", false, true, 4096, 768, 2304},
    {"fc_dx", false, true, 4096, 768, 3072},
    {"qkv_fwd_wT", false, true, 4096, 2304, 768},
    {"qkv_dw", true, false, 768, 2304, 4096},
    {"proj_dw", true, false, 3072, 768, 4096},
    // The tied LM head (wte [50257, 768]) on 1024 tokens, to keep the run short: logits =
    // x @ wte^T (NT), dX = dlogits @ wte (NN), dwte = dlogits^T @ x (TN). N = 50257 has a
    // ragged edge.
    {"lmhead_fwd", false, true, 1024, 50257, 768},
    {"lmhead_dx", false, false, 1024, 768, 50257},
    {"lmhead_dw", true, false, 50257, 768, 1024},
    {"square2048", false, false, 2048, 2048, 2048},
    {"square2048_tt", true, true, 2048, 2048, 2048},
    {"fc_fwd_bf16", false, false, 4096, 3072, 768, true},
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Times ours and the anchor alternately (a warm-up each, then `reps` pairs) so a neighbour's
// load on a shared machine hits both sides alike; returns the median seconds of each.
template <typename F, typename G>
std::pair<double, double> time_pair(int reps, const F& ours, const G& anchor) {
  std::vector<double> t_ours, t_anchor;
  for (int r = 0; r <= reps; ++r) {  // r == 0 is the warm-up: page faults, scratch, threads
    auto start = std::chrono::steady_clock::now();
    ours();
    if (r > 0) t_ours.push_back(seconds_since(start));
    start = std::chrono::steady_clock::now();
    anchor();
    if (r > 0) t_anchor.push_back(seconds_since(start));
    // OpenBLAS's workers spin for a while after a call; let them sleep before we time ours.
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  return {median(t_ours), median(t_anchor)};
}

// Single-core fp32 FMA peak (kernels/cpu/fma_loop.h), GFLOP/s.
double fma_peak_gflops(bool zmm) {
  const int64_t iters = 10000000;
  auto start = std::chrono::steady_clock::now();
  mammoth::kernels::cpu::run_fma_chains(zmm, iters);
  return mammoth::kernels::cpu::fma_chain_flops(zmm, iters) / seconds_since(start) / 1e9;
}

// The OpenBLAS core for this CPU's instruction sets (nullptr: leave it to OpenBLAS), and why.
struct OpenblasCore {
  const char* core;
  const char* why;
};

OpenblasCore openblas_core_for_cpu() {
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("fma")) {
    return {"SkylakeX", "the CPU has AVX-512 F, BW, VL, DQ, CD and FMA"};
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return {"Haswell", "the CPU has AVX2 and FMA but not all of AVX-512 F, BW, VL, DQ and CD"};
  }
  return {nullptr, "the CPU has no AVX2 + FMA: OpenBLAS chooses"};
}

// Which cores need what: a core the user forces that this CPU cannot run dies of SIGILL.
// (OpenBLAS compares the names without case.)
bool cpu_runs_openblas_core(const char* core) {
  const OpenblasCore best = openblas_core_for_cpu();
  for (const char* avx512 : {"SkylakeX", "Cooperlake", "SapphireRapids"}) {
    if (!strcasecmp(core, avx512))
      return best.core != nullptr && !std::strcmp(best.core, "SkylakeX");
  }
  if (!strcasecmp(core, "Haswell") || !strcasecmp(core, "Zen")) return best.core != nullptr;
  return true;  // older cores (Sandybridge, Nehalem, ...) or names we do not judge
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace

namespace mammoth::tools {

int run_gemm_bench(const std::vector<std::string>& args_in) {
  // OpenBLAS reads its settings when it is loaded, so they need a fresh process: re-exec this
  // one with the same command line (once: afterwards both are set, or there is no core to set).
  const OpenblasCore cpu_core = openblas_core_for_cpu();
  if ((std::getenv("OPENBLAS_CORETYPE") == nullptr && cpu_core.core != nullptr) ||
      std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) {
    if (cpu_core.core != nullptr) setenv("OPENBLAS_CORETYPE", cpu_core.core, 0);
    setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0);
    std::ifstream cmdline("/proc/self/cmdline", std::ios::binary);
    std::vector<std::string> words;
    for (std::string w; std::getline(cmdline, w, '\0');) words.push_back(w);
    std::vector<char*> exec_argv;
    for (std::string& w : words) exec_argv.push_back(w.data());
    exec_argv.push_back(nullptr);
    execv("/proc/self/exe", exec_argv.data());
    std::perror("[gemm_bench] re-exec with the OpenBLAS settings failed; continuing");
  }
  std::vector<std::string> arg_store{"gemm_bench"};
  arg_store.insert(arg_store.end(), args_in.begin(), args_in.end());
  std::vector<char*> argv_vec;
  for (std::string& a : arg_store) argv_vec.push_back(a.data());
  const int argc = static_cast<int>(argv_vec.size());
  char** argv = argv_vec.data();
  std::string json_path;
  int reps = 5;
  bool quick = false;
  std::string filter;    // run only shapes whose name contains this
  int only_threads = 0;  // 0: 1 thread and all threads
  std::string isa_flag;  // --isa, when given
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else if (!std::strcmp(argv[i], "--filter") && i + 1 < argc) {
      filter = argv[++i];
    } else if (!std::strcmp(argv[i], "--isa") && i + 1 < argc) {
      isa_flag = argv[++i];
      const kc::GemmIsa isa = isa_flag == "avx512"     ? kc::GemmIsa::kAvx512
                              : isa_flag == "avx2"     ? kc::GemmIsa::kAvx2
                              : isa_flag == "portable" ? kc::GemmIsa::kPortable
                                                       : kc::GemmIsa::kAuto;
      if (isa == kc::GemmIsa::kAuto) {
        std::fprintf(stderr, "[gemm_bench] unknown --isa '%s': use avx512, avx2 or portable\n",
                     isa_flag.c_str());
        return 2;
      }
      // A clear refusal rather than an illegal instruction in the first timed run.
      if (!kc::gemm_isa_supported(isa)) {
        std::fprintf(stderr,
                     "[gemm_bench] --isa %s: this CPU cannot run the %s GEMM kernels (%s); "
                     "it runs %s\n",
                     isa_flag.c_str(), isa_flag.c_str(),
                     isa == kc::GemmIsa::kAvx512 ? "they need AVX-512 F, BW, VL, DQ and FMA"
                                                 : "they need AVX2 and FMA",
                     kc::gemm_isa_supported(kc::GemmIsa::kAvx2) ? "avx2 and portable" : "portable");
        return 2;
      }
      kc::set_gemm_isa(isa);
    } else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) {
      only_threads = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--json FILE] [--reps N] [--quick] [--filter NAME] [--threads N]\n   "
                   "             [--isa avx512|avx2|portable]\n",
                   argv[0]);
      return 2;
    }
  }
  const char* env_core = std::getenv("OPENBLAS_CORETYPE");
  const char* env_l2 = std::getenv("OPENBLAS_L2_SIZE");
  const char* env_nt = std::getenv("OPENBLAS_NUM_THREADS");
  const char* env_to = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  std::printf(
      "OPENBLAS_CORETYPE=%s OPENBLAS_L2_SIZE=%s OPENBLAS_NUM_THREADS=%s "
      "OPENBLAS_THREAD_TIMEOUT=%s\n",
      env_core ? env_core : "(unset)", env_l2 ? env_l2 : "(unset)", env_nt ? env_nt : "(unset)",
      env_to ? env_to : "(unset)");
  if (env_core == nullptr) {
    std::printf("OpenBLAS core choice: OpenBLAS's own (%s)\n", cpu_core.why);
  } else if (cpu_core.core != nullptr && !strcasecmp(env_core, cpu_core.core)) {
    std::printf("OpenBLAS core choice: %s for this CPU (%s)\n", env_core, cpu_core.why);
  } else {
    std::printf("OpenBLAS core choice: %s from OPENBLAS_CORETYPE, kept (this CPU's: %s; %s)\n",
                env_core, cpu_core.core ? cpu_core.core : "OpenBLAS's own", cpu_core.why);
    if (!cpu_runs_openblas_core(env_core)) {
      std::printf(
          "warning: OPENBLAS_CORETYPE=%s needs instructions this CPU lacks; OpenBLAS may die of "
          "an illegal instruction (unset it to let the bench choose)\n",
          env_core);
    }
  }
  std::fflush(stdout);
  std::printf("OpenBLAS core: %s; config: %s\n", openblas_get_corename(), openblas_get_config());
  {
    // Where the ISA came from; a bad MAMMOTH_ISA is a clear error here, before any timing.
    const std::string source = !isa_flag.empty() ? "--isa " + isa_flag : kc::isa_request_source();
    const char* isa = kc::gemm_isa_name(kc::active_gemm_isa());
    std::printf("Mammoth gemm ISA: %s (%s)\n", isa, source.c_str());
  }
  double peak = 0;
  if (__builtin_cpu_supports("fma")) {
    // Best of a few short runs: a busy machine only ever lowers the number.
    double p256 = 0, p512 = 0;
    for (int r = 0; r < 5; ++r) {
      p256 = std::max(p256, fma_peak_gflops(false));
      if (__builtin_cpu_supports("avx512f")) p512 = std::max(p512, fma_peak_gflops(true));
    }
    // %peak is against the registers the running kernels use: an AVX2 GEMM (forced, or on a
    // CPU without AVX-512) can never reach the zmm figure.
    const bool zmm = kc::active_gemm_isa() == kc::GemmIsa::kAvx512;
    peak = zmm ? std::max(p256, p512) : p256;
    std::printf(
        "fp32 FMA peak, one core: %.1f GFLOP/s with ymm, %.1f with zmm; %%peak against %s\n", p256,
        p512, zmm ? "zmm" : "ymm");
  }
  const int max_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  FILE* json = nullptr;
  if (!json_path.empty()) {
    json = std::fopen(json_path.c_str(), "w");
    if (!json) {
      std::perror(json_path.c_str());
      return 1;
    }
    std::fprintf(json, "[\n");
  }
  bool first_row = true;
  std::printf("%-14s %-4s %-22s %3s %9s %9s %6s %6s %9s\n", "name", "op", "MxNxK", "thr", "ours",
              "openblas", "ratio", "%peak", "max_rel");
  for (const Shape& s : kShapes) {
    if (quick && s.M * s.N * s.K > 4096LL * 2304 * 768) continue;
    if (!filter.empty() && std::string(s.name).find(filter) == std::string::npos) continue;
    const int64_t a_rows = s.trans_a ? s.K : s.M, a_cols = s.trans_a ? s.M : s.K;
    const int64_t b_rows = s.trans_b ? s.N : s.K, b_cols = s.trans_b ? s.K : s.N;
    std::vector<float> A(a_rows * a_cols), B(b_rows * b_cols), C1(s.M * s.N), C2(s.M * s.N);
    for (float& x : A) x = dist(rng);
    for (float& x : B) x = dist(rng);
    std::vector<uint16_t> Ab, Bb;
    if (s.bf16) {
      for (float& x : A) Ab.push_back(to_bf16(x));
      for (float& x : B) Bb.push_back(to_bf16(x));
    }
    const double flops = 2.0 * s.M * s.N * s.K;
    char op[4] = {s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', 0, 0};
    char shape[64];
    std::snprintf(shape, sizeof(shape), "%ldx%ldx%ld", static_cast<long>(s.M),
                  static_cast<long>(s.N), static_cast<long>(s.K));
    for (int threads : {1, max_threads}) {
      if (only_threads > 0 && threads != only_threads) continue;
      mammoth::set_num_threads(threads);
      openblas_set_num_threads(threads);
      const auto [ours, anchor] = time_pair(
          reps,
          [&] {
            if (s.bf16) {
              kc::gemm_bf16(s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f, Ab.data(), a_cols, Bb.data(),
                            b_cols, 0.0f, C1.data(), s.N);
            } else {
              kc::sgemm(s.trans_a, s.trans_b, s.M, s.N, s.K, 1.0f, A.data(), a_cols, B.data(),
                        b_cols, 0.0f, C1.data(), s.N);
            }
          },
          [&] {
            cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans,
                        s.trans_b ? CblasTrans : CblasNoTrans, s.M, s.N, s.K, 1.0f, A.data(),
                        a_cols, B.data(), b_cols, 0.0f, C2.data(), s.N);
          });
      double max_rel = 0, scale = 0;
      for (size_t i = 0; i < C1.size(); ++i) scale = std::max(scale, std::fabs((double)C2[i]));
      for (size_t i = 0; i < C1.size(); ++i) {
        max_rel = std::max(max_rel, std::fabs((double)C1[i] - C2[i]) / std::max(scale, 1e-30));
      }
      const double g_ours = flops / ours / 1e9, g_anchor = flops / anchor / 1e9;
      // Percent of the measured single-core peak times the thread count.
      const double pct = peak > 0 ? 100.0 * g_ours / (peak * threads) : 0.0;
      std::printf("%-14s %-4s %-22s %3d %9.1f %9.1f %6.3f %6.1f %9.2e\n", s.name, op, shape,
                  threads, g_ours, g_anchor, g_ours / g_anchor, pct, max_rel);
      std::fflush(stdout);
      if (json) {
        std::fprintf(json,
                     "%s  {\"name\": \"%s_%s%s\", \"shape\": \"%s\", \"threads\": %d, \"ours\": "
                     "%.2f, \"anchor\": %.2f, \"unit\": \"GFLOP/s\", \"ratio\": %.4f}",
                     first_row ? "" : ",\n", s.name, op, s.bf16 ? "_vs_openblas_sgemm" : "", shape,
                     threads, g_ours, g_anchor, g_ours / g_anchor);
      }
      first_row = false;
      if (max_threads == 1) break;
    }
  }
  if (json) {
    std::fprintf(json, "\n]\n");
    std::fclose(json);
  }
  return 0;
}

}  // namespace mammoth::tools
