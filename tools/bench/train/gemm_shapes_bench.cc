// The GEMMs of one GPT-2 training step (B*T rows), timed one shape at a time through the matmul
// op under each autocast mode, so a step's time can be split into GEMM (by role) and the rest.
//   bazel-bin/tools/bench/train/gemm_shapes_bench [d_model n_layer vocab rows threads reps
//                                                  [role-substring [fp32|bf16]]]
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "base/cpu_time.h"
#include "base/thread_pool.h"
#include "engine/amp/amp.h"
#include "engine/autograd.h"
#include "engine/ops.h"

namespace {

using mammoth::engine::Tensor;
namespace amp = mammoth::engine::amp;

struct Shape3 {
  const char* role;
  int64_t M, N, K;
  bool ta, tb;
  int count;  // per step
};

// C[M,N] = op(A) op(B) with A stored [M,K] (or [K,M] when ta) and B stored [K,N] (or [N,K]).
// Median wall ms; `cpu` gets the median process CPU ms (all threads), which load from other
// processes inflates much less than wall time. Each rep takes the next of enough operand copies
// to exceed the last-level cache, so operands come from memory as in a step (every weight and
// activation is touched once per pass), not from a cache that a repeated product keeps warm.
double time_one(const Shape3& s, int reps, double* cpu) {
  constexpr double kColdBytes = 128.0 * (1 << 20);
  const double bytes = 4.0 * (s.M * s.K + s.K * s.N);
  const int copies = static_cast<int>(std::clamp(kColdBytes / bytes, 1.0, 64.0));
  std::vector<Tensor> as, bs;
  for (int i = 0; i < copies; ++i) {
    as.push_back(s.ta ? Tensor::randn({s.K, s.M}, 1 + 2 * i).transpose(0, 1)
                      : Tensor::randn({s.M, s.K}, 1 + 2 * i));
    bs.push_back(s.tb ? Tensor::randn({s.N, s.K}, 2 + 2 * i).transpose(0, 1)
                      : Tensor::randn({s.K, s.N}, 2 + 2 * i));
  }
  mammoth::engine::NoGradGuard ng;
  Tensor c = mammoth::engine::matmul(as[0], bs[0]);  // warm
  std::vector<double> t, tc;
  for (int r = 0; r < reps; ++r) {
    const int i = (r + 1) % copies;
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = mammoth::process_cpu_seconds() * 1e3;
    c = mammoth::engine::matmul(as[i], bs[i]);
    tc.push_back(mammoth::process_cpu_seconds() * 1e3 - c0);
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  std::sort(tc.begin(), tc.end());
  *cpu = tc[tc.size() / 2];
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, int64_t d) { return argc > i ? std::atoll(argv[i]) : d; };
  const int64_t C = arg(1, 768), L = arg(2, 12), V = arg(3, 50257), M = arg(4, 256);
  mammoth::set_num_threads(static_cast<int>(arg(5, 2)));
  const int reps = static_cast<int>(arg(6, 3));
  const int n = static_cast<int>(L);
  const std::vector<Shape3> shapes = {
      {"fwd qkv", M, 3 * C, C, false, true, n},    {"fwd proj", M, C, C, false, true, n},
      {"fwd fc", M, 4 * C, C, false, true, n},     {"fwd fcproj", M, C, 4 * C, false, true, n},
      {"fwd head", M, V, C, false, true, 1},       {"dX qkv", M, C, 3 * C, false, false, n},
      {"dX proj", M, C, C, false, false, n},       {"dX fc", M, C, 4 * C, false, false, n},
      {"dX fcproj", M, 4 * C, C, false, false, n}, {"dX head", M, C, V, false, false, 1},
      {"dW qkv", 3 * C, C, M, true, false, n},     {"dW proj", C, C, M, true, false, n},
      {"dW fc", 4 * C, C, M, true, false, n},      {"dW fcproj", C, 4 * C, M, true, false, n},
      {"dW head", V, C, M, true, false, 1},
  };
  const std::string filter = argc > 7 ? argv[7] : "";
  for (const char* mode : {"fp32", "bf16"}) {
    if (argc > 8 && std::string(argv[8]) != mode) continue;
    amp::AutocastGuard guard(amp::parse_precision(mode));
    double total = 0, total_cpu = 0;
    std::printf("%s\n", mode);
    for (const Shape3& s : shapes) {
      if (std::string(s.role).find(filter) == std::string::npos) continue;
      double cpu = 0;
      const double ms = time_one(s, reps, &cpu);
      total += ms * s.count;
      total_cpu += cpu * s.count;
      std::printf(
          "  %-10s M=%-6ld N=%-6ld K=%-6ld x%-3d %8.2f ms %6.1f GFLOP/s | cpu %8.2f ms %6.1f "
          "GFLOP/cpu-s | step %7.1f ms\n",
          s.role, s.M, s.N, s.K, s.count, ms, 2.0 * s.M * s.N * s.K / ms / 1e6, cpu,
          2.0 * s.M * s.N * s.K / cpu / 1e6, ms * s.count);
    }
    std::printf("  total GEMM per step (excl. attention) %.1f ms wall, %.1f ms cpu\n", total,
                total_cpu);
  }
  return 0;
}
