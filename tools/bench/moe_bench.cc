#include "tools/bench/moe_bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>

#include "base/error.h"
#include "base/thread_pool.h"
#include "engine/nn/module.h"
#include "engine/ops.h"
#include "kernels/cpu/gemm.h"
#include "models/mixtral/mixtral.h"
#include "models/registry.h"

namespace mammoth::tools {
namespace {

using kernels::cpu::GemmGroup;

struct Shape {
  const char* name;
  int64_t experts, rows, d, f;  // rows: routed (token, expert) pairs per forward
};

// Uneven expert batches (a router's load is never flat): expert e gets a share ~ 1 + e/E.
std::vector<int64_t> batches(const Shape& s) {
  std::vector<int64_t> n(static_cast<size_t>(s.experts));
  double total = 0;
  for (int64_t e = 0; e < s.experts; ++e) total += 1.0 + static_cast<double>(e) / s.experts;
  int64_t used = 0;
  for (int64_t e = 0; e < s.experts; ++e) {
    n[e] = static_cast<int64_t>(s.rows * (1.0 + static_cast<double>(e) / s.experts) / total);
    used += n[e];
  }
  n.back() += s.rows - used;
  return n;
}

double seconds(const std::function<void()>& f, int reps) {
  f();  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// The MoE layer (models/mixtral's block: router, top-k, dispatch, grouped GEMMs, combine) against
// a dense SwiGLU MLP of width k * f, which has the same FLOPs per token as the k experts a token
// runs through (3 projections of d x f each). Forward + backward of sum(y), seconds per step.
struct LayerShape {
  const char* name;
  int64_t experts, top_k, d, f, tokens;
};

void layer_rows() {
  const LayerShape shapes[] = {{"mixtral-tiny layer (E 4, k 2)", 4, 2, 64, 96, 256},
                               {"E 8, k 2, d 512, f 1024", 8, 2, 512, 1024, 512}};
  std::printf("\n%-32s %12s %12s %8s   (forward + backward, %d threads)\n", "MoE layer vs dense",
              "MoE ms", "dense ms", "ratio", num_threads());
  for (const LayerShape& s : shapes) {
    models::ModelConfig c = models::resolve_config("mixtral-tiny");
    c.moe_experts = s.experts;
    c.moe_top_k = s.top_k;
    c.d_model = s.d;
    c.d_ff = s.f;
    models::MixtralSparseMoeBlock moe(c);
    moe.init(1);
    engine::nn::Linear w1(s.d, s.top_k * s.f, false), w3(s.d, s.top_k * s.f, false),
        w2(s.top_k * s.f, s.d, false);
    w1.init(2);
    w2.init(3);
    w3.init(4);
    const engine::Tensor x = engine::Tensor::randn({1, s.tokens, s.d}, 5);
    const double flops = 6.0 * 2.0 * s.tokens * s.d * s.f * s.top_k;  // fwd + 2x bwd, 3 proj
    const int reps = static_cast<int>(std::max(3.0, 1e9 / flops));
    const double t_moe = seconds(
        [&] {
          moe.zero_grad();
          engine::sum(moe.forward(x)).backward();
        },
        reps);
    const double t_dense = seconds(
        [&] {
          w1.zero_grad();
          w2.zero_grad();
          w3.zero_grad();
          engine::sum(w2.forward(engine::silu(w1.forward(x)) * w3.forward(x))).backward();
        },
        reps);
    std::printf("%-32s %12.3f %12.3f %7.2fx   (%lld tokens; MoE / dense)\n", s.name, t_moe * 1e3,
                t_dense * 1e3, t_moe / t_dense, static_cast<long long>(s.tokens));
  }
}

}  // namespace

int run_moe_bench(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.empty()) << "[bench moe] takes no flags";
  const Shape shapes[] = {{"mixtral-tiny (4 experts)", 4, 256, 64, 96},
                          {"8 experts, d 512, f 1024", 8, 2048, 512, 1024},
                          {"64 small experts, d 512, f 256", 64, 2048, 512, 256}};
  std::printf("%-32s %12s %12s %8s   (w1 forward: x_e [n_e, d] @ w_e^T, %d threads)\n", "shape",
              "grouped ms", "loop ms", "ratio", num_threads());
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const Shape& s : shapes) {
    const std::vector<int64_t> n = batches(s);
    std::vector<float> x(static_cast<size_t>(s.rows * s.d)), y(static_cast<size_t>(s.rows * s.f));
    std::vector<float> w(static_cast<size_t>(s.experts * s.f * s.d));
    for (float& v : x) v = u(rng);
    for (float& v : w) v = u(rng);
    std::vector<GemmGroup> groups;
    int64_t r0 = 0;
    for (int64_t e = 0; e < s.experts; ++e) {
      groups.push_back({false, true, n[e], s.f, s.d, x.data() + r0 * s.d, s.d,
                        w.data() + e * s.f * s.d, s.d, y.data() + r0 * s.f, s.f});
      r0 += n[e];
    }
    const double flops = 2.0 * s.rows * s.f * s.d;
    const int reps = static_cast<int>(std::max(3.0, 2e9 / flops));
    const double grouped = seconds(
        [&] { kernels::cpu::sgemm_grouped(groups.data(), static_cast<int64_t>(groups.size())); },
        reps);
    const double loop = seconds(
        [&] {
          for (const GemmGroup& g : groups)
            kernels::cpu::sgemm(g.trans_a, g.trans_b, g.M, g.N, g.K, 1.0f, g.A, g.lda, g.B, g.ldb,
                                0.0f, g.C, g.ldc);
        },
        reps);
    std::printf("%-32s %12.3f %12.3f %7.2fx   (%.1f vs %.1f GFLOP/s)\n", s.name, grouped * 1e3,
                loop * 1e3, loop / grouped, flops / grouped * 1e-9, flops / loop * 1e-9);
  }
  layer_rows();
  return 0;
}

}  // namespace mammoth::tools
