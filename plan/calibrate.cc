#include "plan/calibrate.h"

#include <fcntl.h>
#include <mpi.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/thread_pool.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "engine/tensor.h"
#include "kernels/cpu/fma_loop.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa_env.h"
#include "memory/chunks/chunk_manager.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"
#include "plan/time_model.h"

namespace mammoth::plan {
namespace {

using Clock = std::chrono::steady_clock;
using engine::Tensor;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The clock compute figures are read on. With one thread per rank, the calling thread's CPU
// time: on a machine shared with other jobs a neighbour that takes the core away stops this
// clock too, so the figure is the machine's own rate (`mammoth bench plan` normalises training
// steps to the CPU time their processes got for the same reason). With more threads, wall time.
bool g_thread_clock = true;

double now_s() {
  if (g_thread_clock) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
}

// Seconds per call of `fn`: batches of calls long enough to read the clock well (`batch_s`),
// the best of `rounds` batches after one warm-up call.
double time_call(const std::function<void()>& fn, int rounds, double batch_s) {
  fn();
  double t0 = now_s();
  fn();
  const double one = std::max(now_s() - t0, 1e-7);
  const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(batch_s / one));
  std::vector<double> per;
  for (int r = 0; r < rounds; ++r) {
    t0 = now_s();
    for (int64_t i = 0; i < n; ++i) fn();
    per.push_back((now_s() - t0) / static_cast<double>(n));
  }
  return *std::min_element(per.begin(), per.end());
}

json::Value points_json(const std::vector<std::pair<double, double>>& pts) {
  json::Value arr = json::Value::array();
  for (const auto& [x, y] : pts) arr.push_back(json::Value::array().push_back(x).push_back(y));
  return arr;
}

double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// One core's fp32 FMA rate from registers alone, timed by `clock` (seconds): 12 independent
// chains cover the FMA latency times the pipes, so this is the core's peak, not a memory figure.
double fma_rate(double (*clock)(), int64_t iters) {
  const bool zmm = __builtin_cpu_supports("avx512f");
  const double t0 = clock();
  kernels::cpu::run_fma_chains(zmm, iters);
  return kernels::cpu::fma_chain_flops(zmm, iters) / (clock() - t0);
}

double fma_peak_one_core() { return fma_rate(now_s, 2000000); }

}  // namespace

double core_speed_probe(int rounds) {
  double best = 0;
  for (int r = 0; r < rounds; ++r) best = std::max(best, fma_rate(thread_cpu_s, 1000000));
  return best;
}

double memory_speed_probe(int rounds) {
  const size_t bytes = size_t{64} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  const double t = time_call([&] { std::memcpy(b.data(), a.data(), bytes); }, rounds, 0.02);
  return 2.0 * static_cast<double>(bytes) / t;  // read + write
}

namespace {

// Least squares for y = sum_j c_j x_j with every c_j >= 0, relative: each row is divided by
// its y, so that small and large GEMMs count alike. A coefficient that comes out negative is
// dropped (set to 0) and the rest refitted.
std::vector<double> fit_nonnegative(const std::vector<std::vector<double>>& xs,
                                    const std::vector<double>& ys) {
  const size_t n = xs.front().size();
  std::vector<bool> on(n, true);
  std::vector<double> c(n, 0);
  for (size_t pass = 0; pass <= n; ++pass) {
    std::vector<size_t> idx;
    for (size_t j = 0; j < n; ++j)
      if (on[j]) idx.push_back(j);
    const size_t m = idx.size();
    std::vector<std::vector<double>> a(m, std::vector<double>(m + 1, 0));
    for (size_t r = 0; r < xs.size(); ++r) {
      for (size_t i = 0; i < m; ++i) {
        for (size_t j = 0; j < m; ++j) a[i][j] += xs[r][idx[i]] * xs[r][idx[j]] / (ys[r] * ys[r]);
        a[i][m] += xs[r][idx[i]] / ys[r];
      }
    }
    for (size_t i = 0; i < m; ++i) {  // Gauss-Jordan with partial pivoting
      size_t p = i;
      for (size_t r = i + 1; r < m; ++r)
        if (std::fabs(a[r][i]) > std::fabs(a[p][i])) p = r;
      std::swap(a[i], a[p]);
      if (std::fabs(a[i][i]) < 1e-300) continue;
      for (size_t r = 0; r < m; ++r) {
        if (r == i) continue;
        const double f = a[r][i] / a[i][i];
        for (size_t k = i; k <= m; ++k) a[r][k] -= f * a[i][k];
      }
    }
    std::fill(c.begin(), c.end(), 0.0);
    bool negative = false;
    for (size_t i = 0; i < m; ++i) {
      c[idx[i]] = std::fabs(a[i][i]) < 1e-300 ? 0 : a[i][m] / a[i][i];
      if (c[idx[i]] < 0) {
        on[idx[i]] = false;
        negative = true;
      }
    }
    if (!negative) break;
  }
  for (double& v : c) v = std::max(v, 0.0);
  return c;
}

struct GemmFit {
  Cluster::GemmTimeModel model;
  double rate = 0;  // FLOP/s of the largest GEMM measured
  json::Value points;
};

// The engine's sgemm at the GEMMs of transformer blocks: T tokens x linear layers of width w
// (w -> 4w, 4w -> w, w -> 3w; w = 43 makes a ragged 172 as in llama-tiny's MLP), each in the
// orientation engine::linear calls it: the forward (NT: T x out x in, W stored [out, in]), the
// input gradient (NN: T x in x out) and the weight gradient (TN: out x in x T), fitted as
// time = 2M'N'K (a + b / K + c / min(M, N)) + call with M', N' rounded up to the micro-kernel's
// register tile (a 32-wide output fills half of a 64-wide tile and costs as much as a full one).
GemmFit measure_gemm(bool quick) {
  namespace kc = kernels::cpu;
  const std::vector<int64_t> widths =
      quick ? std::vector<int64_t>{16, 64, 128} : std::vector<int64_t>{16, 32, 43, 64, 128, 256};
  const std::vector<int64_t> tokens =
      quick ? std::vector<int64_t>{64, 512} : std::vector<int64_t>{64, 256, 1024};
  GemmFit fit;
  const kc::GemmTile tile = kc::sgemm_tile();
  fit.model.tile_rows = tile.rows;
  fit.model.tile_cols = tile.cols;
  json::Value pts = json::Value::array();
  std::vector<std::vector<double>> xs;
  std::vector<double> ys;
  double largest = 0;
  for (int64_t T : tokens) {
    for (int64_t w : widths) {
      for (const auto& [in, out] :
           {std::pair{w, 4 * w}, std::pair{4 * w, w}, std::pair{w, 3 * w}}) {
        struct G {
          bool ta, tb;
          int64_t m, n, k;
        };
        for (const G& g : {G{false, true, T, out, in}, G{false, false, T, in, out},
                           G{true, false, out, in, T}}) {
          // Operands rotate through copies filling ~8 MiB, past the per-core caches: in a
          // training step a GEMM finds its weights and activations in the shared cache or
          // memory, not in the L1/L2 that a loop over one set of buffers keeps them in.
          const int64_t elems = g.m * g.k + g.k * g.n + g.m * g.n;
          const size_t copies = static_cast<size_t>(
              std::clamp<int64_t>((int64_t{2} << 20) / std::max<int64_t>(elems, 1), 1, 32));
          std::vector<std::vector<float>> a(copies), b(copies), c(copies);
          for (size_t i = 0; i < copies; ++i) {
            a[i].assign(static_cast<size_t>(g.m * g.k), 0.5f);
            b[i].assign(static_cast<size_t>(g.k * g.n), 0.25f);
            c[i].assign(static_cast<size_t>(g.m * g.n), 0.0f);
          }
          const int64_t lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
          size_t next = 0;
          const double t = time_call(
              [&] {
                const size_t i = next++ % copies;
                kc::sgemm(g.ta, g.tb, g.m, g.n, g.k, 1.0f, a[i].data(), lda, b[i].data(), ldb, 0.0f,
                          c[i].data(), g.n);
              },
              3, quick ? 0.002 : 0.003);
          const double flops = 2.0 * static_cast<double>(g.m * g.n * g.k);
          const double mn = static_cast<double>(std::min(g.m, g.n));
          const double padded = fit.model.padded_flops(
              static_cast<double>(g.m), static_cast<double>(g.n), static_cast<double>(g.k));
          xs.push_back({padded, padded / static_cast<double>(g.k), padded / mn, 1.0});
          ys.push_back(t);
          pts.push_back(
              json::Value::array().push_back(g.m).push_back(g.n).push_back(g.k).push_back(t));
          if (flops > largest) {
            largest = flops;
            fit.rate = flops / t;
          }
        }
      }
    }
  }
  const std::vector<double> c = fit_nonnegative(xs, ys);
  fit.model.per_flop = c[0];
  fit.model.per_flop_k = c[1];
  fit.model.per_flop_mn = c[2];
  fit.model.call = c[3];
  if (!fit.model.calibrated()) fit.model.per_flop = 1 / fit.rate;
  fit.points = std::move(pts);
  return fit;
}

struct OpFit {
  double overhead = 0, bandwidth = 0;
  json::Value points;
};

// A chain of `n` scalar multiplies through autograd and its backward: per op, one forward and
// one backward call, each reading and writing the tensor (16 bytes per element in all).
OpFit measure_ops(bool quick) {
  const int n = 40;
  const std::vector<int64_t> rows =
      quick ? std::vector<int64_t>{1, 512} : std::vector<int64_t>{1, 64, 512, 2048};
  std::vector<std::pair<double, double>> pts;
  for (int64_t r : rows) {
    Tensor x = Tensor::randn({r, 128}, 7).requires_grad_();
    const double t = time_call(
        [&] {
          Tensor y = x;
          for (int i = 0; i < n; ++i) y = engine::mul_scalar(y, 1.0001);
          engine::sum(y).backward();
          x.zero_grad();
        },
        quick ? 3 : 5, quick ? 0.004 : 0.01);
    pts.push_back({16.0 * static_cast<double>(r * 128), t / n});
  }
  // The overhead from the smallest tensor (one row: its data costs nanoseconds), the bandwidth
  // from the two largest; a least-squares line lets the large tensors' noise set the intercept.
  const auto& [b1, t1] = pts[pts.size() - 2];
  const auto& [b2, t2] = pts.back();
  const double per_byte = t2 > t1 ? (t2 - t1) / (b2 - b1) : t2 / b2;
  return {pts.front().second / 2, 1.0 / per_byte, points_json(pts)};
}

// Whole training steps of a GPT-2 (forward, backward, gradient norm, AdamW, zeroing, as
// engine/train runs them) at 1 and 5 blocks: the seconds one more block adds. Two widths
// separate the two things the kernel loops above do not see. A narrow block (d_model 64) is
// mostly engine ops, which cost more in a block than in the mul_scalar chain (views, permutes,
// norms, their graph nodes and allocations); a wide one (d_model 256) is mostly GEMMs and
// attention, which run slower between a step's other ops than in a loop of their own (their
// operands are no longer in the core's caches). calibrate_this_machine fits a per-op cost and
// an in-step compute factor to both.
struct BlockSteps {
  models::ModelConfig shallow, deep;
  int64_t batch = 0, seq = 0;
  // The shallow model's median step, and that plus the median of the paired differences.
  double shallow_s = 0, deep_s = 0;
};

BlockSteps measure_block_steps(bool quick, int64_t d_model, int64_t batch, int64_t seq) {
  BlockSteps b;
  b.batch = batch;
  b.seq = seq;
  models::ModelConfig c = models::resolve_config("gpt2-tiny");
  c.name = "calibration-gpt2-" + std::to_string(d_model);
  c.vocab_size = 256;
  c.d_model = d_model;
  c.n_head = 4;
  c.d_ff = 4 * c.d_model;
  c.max_seq = b.seq;
  c.dropout = c.attn_dropout = 0;
  b.shallow = b.deep = c;
  b.shallow.n_layer = 1;
  b.deep.n_layer = 5;
  // The two models step in alternation and the per-pair differences give the median: a machine
  // whose speed drifts moves both sides of a pair alike.
  struct Run {
    std::shared_ptr<models::LanguageModel> model;
    std::unique_ptr<engine::optim::AdamW> opt;
  };
  std::vector<Run> runs;
  for (const models::ModelConfig* cfg : {&b.shallow, &b.deep}) {
    Run r;
    r.model = std::dynamic_pointer_cast<models::LanguageModel>(models::build_model(*cfg, 1));
    MAMMOTH_CHECK(r.model != nullptr) << "[calibrate] " << cfg->name << " is not a language model";
    r.opt = std::make_unique<engine::optim::AdamW>(r.model->named_parameters(),
                                                   engine::optim::AdamWOptions{});
    r.model->train();
    runs.push_back(std::move(r));
  }
  std::vector<int64_t> in, tg;
  for (int64_t i = 0; i < b.batch * b.seq; ++i) {
    in.push_back((i * 37) % c.vocab_size);
    tg.push_back((i * 37 + 11) % c.vocab_size);
  }
  const Tensor x = Tensor::from_ints(in, {b.batch, b.seq});
  const Tensor y = Tensor::from_ints(tg, {b.batch, b.seq});
  auto step = [&](Run& r) {
    const double t0 = now_s();
    r.model->loss(x, y).backward();
    (void)engine::optim::grad_norm(r.model->named_parameters());
    r.opt->step();
    r.opt->zero_grad();
    return now_s() - t0;
  };
  for (Run& r : runs) step(r), step(r);  // warm-up: the allocator's cache, AdamW's states
  const int pairs = quick ? 9 : 31;
  std::vector<double> shallow, added;
  for (int i = 0; i < pairs; ++i) {
    const double s0 = step(runs[0]);
    shallow.push_back(s0);
    added.push_back(step(runs[1]) - s0);
  }
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  b.shallow_s = median(shallow);
  b.deep_s = b.shallow_s + median(added);
  return b;
}

// The time model's added seconds per block split by what it charges them to: the kernels the
// in-step factor scales (GEMMs and attention: `kernels`), the per-op cost (`per_op`: seconds per
// second of op cost) and the rest (memory traffic, the optimizer's bytes: `fixed`). The
// prediction is linear in both the factor and the op cost, so three predictions give the parts.
struct BlockParts {
  double kernels = 0, per_op = 0, fixed = 0, measured = 0;
};

BlockParts block_parts(const BlockSteps& b, Cluster c) {
  ParallelPlan p;
  p.micro_batch = b.batch;
  p.seq_len = b.seq;
  auto added = [&](double factor, double op) {
    c.in_step_compute = factor;
    c.op_overhead = op;
    return predict_time(b.deep, p, c).step_time - predict_time(b.shallow, p, c).step_time;
  };
  BlockParts r;
  const double base = added(0, 0);
  r.kernels = added(1, 0) - base;
  r.per_op = (added(0, 1e-6) - base) / 1e-6;
  r.fixed = base;
  r.measured = b.deep_s - b.shallow_s;
  return r;
}

struct InStepFit {
  double op_overhead = 0, compute_factor = 1;
};

// Solves narrow.measured = f narrow.kernels + op narrow.per_op + narrow.fixed and the same for
// the wide block. The factor is kept in [1, 3] (the loops' figures are the kernels at their
// best) and the op cost at least the chain's; either bound refits the other from the block it
// dominates.
InStepFit fit_in_step(const BlockParts& narrow, const BlockParts& wide, double chain_op) {
  InStepFit f;
  const double det = narrow.kernels * wide.per_op - wide.kernels * narrow.per_op;
  const double rn = narrow.measured - narrow.fixed, rw = wide.measured - wide.fixed;
  if (det != 0) {
    f.compute_factor = (rn * wide.per_op - rw * narrow.per_op) / det;
    f.op_overhead = (narrow.kernels * rw - wide.kernels * rn) / det;
  }
  if (!(f.compute_factor >= 1 && f.compute_factor <= 3)) {
    f.compute_factor = std::clamp(f.compute_factor, 1.0, 3.0);
    if (narrow.per_op > 0) f.op_overhead = (rn - f.compute_factor * narrow.kernels) / narrow.per_op;
  }
  if (!(f.op_overhead >= chain_op)) {
    f.op_overhead = chain_op;
    if (wide.kernels > 0)
      f.compute_factor = std::clamp((rw - chain_op * wide.per_op) / wide.kernels, 1.0, 3.0);
  }
  return f;
}

// A chain of `n` broadcast divides through autograd and its backward, x [8, 4, r, 32] / s
// [8, 4, r, 1] with both requiring grad (ring attention's merge divides its blocks' outputs by
// their softmax sums this way): seconds per element of x per op, forward and backward, beyond
// the two per-call overheads measure_ops found.
double measure_broadcast_ops(bool quick, double op_overhead) {
  const int n = 8;
  const int64_t r = quick ? 16 : 64;
  Tensor x = Tensor::randn({8, 4, r, 32}, 11).requires_grad_();
  Tensor s = Tensor::randn({8, 4, r, 1}, 12, 2.0, 0.1).requires_grad_();  // away from 0
  const double t = time_call(
      [&] {
        Tensor y = x;
        for (int i = 0; i < n; ++i) y = engine::div(y, s);
        engine::sum(y).backward();
        x.zero_grad();
        s.zero_grad();
      },
      quick ? 3 : 5, quick ? 0.004 : 0.01);
  const double per_op = std::max(t / n - 2 * op_overhead, t / n / 2);
  return per_op / static_cast<double>(x.numel());
}

// engine::attention forward and backward, causal, 8 x 4 heads x 64 tokens at head sizes 16-64,
// with the FLOPs the time model counts for it (4 s d per token forward, twice that backward;
// causal masking is not credited): (head size, FLOP/s).
std::vector<std::pair<double, double>> measure_attention(bool quick, double op_overhead,
                                                         json::Value& points) {
  const std::vector<int64_t> dims =
      quick ? std::vector<int64_t>{16, 32} : std::vector<int64_t>{16, 32, 64};
  std::vector<std::pair<double, double>> pts, rates;
  const int64_t B = 8, H = 4, T = 64;
  for (int64_t d : dims) {
    Tensor q = Tensor::randn({B, H, T, d}, 1).requires_grad_();
    Tensor k = Tensor::randn({B, H, T, d}, 2).requires_grad_();
    Tensor v = Tensor::randn({B, H, T, d}, 3).requires_grad_();
    const double t = time_call(
        [&] {
          engine::sum(engine::attention(q, k, v, {.causal = true})).backward();
          q.zero_grad();
          k.zero_grad();
          v.zero_grad();
        },
        quick ? 3 : 5, quick ? 0.003 : 0.005);
    const double flops = 3.0 * 4.0 * static_cast<double>(T * H * d * B * T);
    pts.push_back({flops, t});
    // The attention op and the sum, forward and backward, are op calls the model counts apart.
    rates.push_back({static_cast<double>(d), flops / std::max(t - 4 * op_overhead, t / 2)});
  }
  points = points_json(pts);
  return rates;
}

// The chunk manager's own moves between the CPU backend's emulated device and host memory
// (what `--device-mem` pages), as training sees them: 64 MiB of chunks (past the caches, as a
// model's are between two uses) acquired for writing in a cycle through a device cache of a
// quarter of them, with work between two acquires as kernels do (a pass over 256 KiB), so every
// acquire loads one chunk (prefetched by the copy thread while the work runs, or waited for)
// and writes another back. The work's own time, measured alone, is taken off. Read at two chunk
// sizes as time per move = latency + bytes / bandwidth.
Link measure_paging(bool quick) {
  namespace mc = memory::chunks;
  std::vector<char> scratch(256 << 10);
  auto work = [&scratch] {
    for (size_t i = 0; i < scratch.size(); i += 64) scratch[i] = static_cast<char>(scratch[i] + 1);
  };
  std::vector<std::pair<double, double>> points;  // (bytes per move, seconds per move)
  for (const int64_t chunk : {int64_t{64} << 10, int64_t{1} << 20}) {
    const int chunks = static_cast<int>((int64_t{64} << 20) / chunk);
    mc::ChunkManagerOptions mo;
    mo.chunk_bytes = chunk;
    mo.device_budget = chunks / 4 * chunk;
    mc::ChunkManager m(mo);
    const int list = m.add_list({"params", mc::Tier::kDevice, {mc::Tier::kHost}, "param"});
    for (int k = 0; k < chunks; ++k) m.add_chunk(list, chunk);
    m.finalize();
    auto cycle = [&] {
      for (int k = 0; k < chunks; ++k) {
        m.acquire(k, true);
        work();
      }
      m.end_step();  // the first freezes the trace: prefetch and Belady from then on
    };
    auto alone = [&] {
      for (int k = 0; k < chunks; ++k) work();
    };
    cycle();
    // Every cycle after the first moves the same chunks: count one, then time many.
    const mc::TierStats before = m.stats(mc::Tier::kDevice);
    cycle();
    const mc::TierStats& after = m.stats(mc::Tier::kDevice);
    const double moves =
        static_cast<double>(after.moves_in + after.moves_out - before.moves_in - before.moves_out);
    const double bytes =
        static_cast<double>(after.bytes_in + after.bytes_out - before.bytes_in - before.bytes_out);
    if (moves <= 0) continue;
    const int rounds = quick ? 3 : 8;
    const double t = time_call(cycle, rounds, 0.02) - time_call(alone, rounds, 0.02);
    points.push_back({bytes / moves, std::max(t, 0.0) / moves});
  }
  if (points.size() < 2) return {};
  const auto [b0, t0] = points[0];
  const auto [b1, t1] = points[1];
  const double per_byte = std::max((t1 - t0) / (b1 - b0), 1e-12);
  return {1 / per_byte, std::max(t0 - b0 * per_byte, 0.0)};
}

struct DiskFit {
  double write_bw = 0, read_bw = 0, latency = 0;
};

DiskFit measure_disk(const std::string& dir, bool quick) {
  DiskFit d;
  const std::string path = dir + "/mammoth_calibrate_" + std::to_string(getpid()) + ".bin";
  const size_t bytes = (quick ? 16u : 64u) << 20;
  std::vector<char> buf(bytes, 3);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) return d;
  auto t0 = Clock::now();
  const bool wrote =
      pwrite(fd, buf.data(), bytes, 0) == static_cast<ssize_t>(bytes) && fdatasync(fd) == 0;
  d.write_bw = wrote ? static_cast<double>(bytes) / since(t0) : 0;
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  t0 = Clock::now();
  const bool read_ok = pread(fd, buf.data(), bytes, 0) == static_cast<ssize_t>(bytes);
  d.read_bw = read_ok ? static_cast<double>(bytes) / since(t0) : 0;
  // One small synchronous write: what a single chunk's round trip costs at least.
  t0 = Clock::now();
  const bool small = pwrite(fd, buf.data(), 4096, 0) == 4096 && fdatasync(fd) == 0;
  d.latency = small ? since(t0) : 0;
  close(fd);
  unlink(path.c_str());
  return d;
}

int64_t mem_total_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemTotal:") return kb * 1024;
  }
  return int64_t{8} << 30;
}

std::string scratch(const CalibrateOptions& o) {
  if (!o.scratch_dir.empty()) return o.scratch_dir;
  const char* t = std::getenv("TMPDIR");
  return t && *t ? t : "/var/tmp";
}

// The communication figures from an MPI job of two ranks of this binary
// (`mammoth plan --calibrate-comm --out FILE`), or from this process's own world.
json::Value comm_figures(const CalibrateOptions& o) {
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (world != nullptr && std::atoi(world) >= 2) return calibrate_comm(o.quick);
  if (o.mpirun.empty() || o.mpirun == "none") return json::Value();
  std::error_code ec;
  const std::string exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return json::Value();
  const std::string out = scratch(o) + "/mammoth_calibrate_comm_" + std::to_string(getpid());
  const std::string cmd = o.mpirun + " -np 2 " + exe + " plan --calibrate-comm --out " + out +
                          ".json" + (o.quick ? " --quick" : "") + " > " + out + ".log 2>&1";
  const int rc = std::system(cmd.c_str());
  json::Value v;
  if (rc == 0 && std::filesystem::exists(out + ".json")) {
    v = json::parse_file(out + ".json");
  } else if (o.verbose) {
    std::fprintf(stderr, "[calibrate] '%s' failed (exit %d); see %s.log\n", cmd.c_str(), rc,
                 out.c_str());
  }
  std::filesystem::remove(out + ".json", ec);
  if (rc == 0) std::filesystem::remove(out + ".log", ec);
  return v;
}

json::Value block_steps_json(const BlockSteps& b) {
  return json::Value::object()
      .set("what", "gpt2 steps: fwd+bwd+norm+AdamW+zero, paired medians")
      .set("vocab", b.deep.vocab_size)
      .set("d_model", b.deep.d_model)
      .set("heads", b.deep.n_head)
      .set("batch", b.batch)
      .set("seq", b.seq)
      .set("layers", json::Value::array().push_back(b.shallow.n_layer).push_back(b.deep.n_layer))
      .set("median_s", json::Value::array().push_back(b.shallow_s).push_back(b.deep_s));
}

}  // namespace

json::Value calibrate_comm(bool quick) {
  parallel::mpi_runtime();
  MPI_Comm comm = MPI_COMM_WORLD;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  MAMMOTH_CHECK(size >= 2) << "[calibrate] the communication figures need >= 2 ranks, got " << size;
  std::vector<int64_t> sizes = {8, 512, 4096, 32768, 262144, 1048576};
  if (!quick) sizes.push_back(4194304);
  std::vector<std::pair<double, double>> pts;
  for (int64_t bytes : sizes) {
    const int64_t n = bytes / 4;
    std::vector<float> buf(static_cast<size_t>(n), 1.0f);
    // The same iteration count on every rank: fixed by size, about 5 ms each round.
    const int iters =
        static_cast<int>(std::clamp<int64_t>(1000000 / (bytes + 20000), 3, quick ? 50 : 100));
    std::vector<double> rounds;
    for (int r = 0; r < (quick ? 3 : 7); ++r) {
      MPI_Barrier(comm);
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i)
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm);
      double t = since(t0) / iters;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm);
      rounds.push_back(t);
    }
    std::sort(rounds.begin(), rounds.end());
    pts.push_back({static_cast<double>(bytes), rounds[rounds.size() / 2]});
  }
  // The time model's ring all-reduce on n ranks: 2 (n-1)/n bytes / bw + 2 (n-1) latency. The
  // latency from the smallest message, the bandwidth from the two largest: a least-squares
  // line through all of them lets the large messages' noise decide the intercept. Median
  // rounds, unlike the compute figures' best: a collective waits for its peer, which on a
  // shared machine is at times descheduled, and a training step that makes dozens of them pays
  // that wait on average, where its unsynchronised compute can run at the machine's best.
  const double nn = static_cast<double>(size);
  const double latency = pts.front().second / (2 * (nn - 1));
  const auto& [b1, t1] = pts[pts.size() - 2];
  const auto& [b2, t2] = pts.back();
  const double per_byte = t2 > t1 ? (t2 - t1) / (b2 - b1) : t2 / b2;
  return json::Value::object()
      .set("ranks", size)
      .set("GBps", 2 * (nn - 1) / nn / per_byte / 1e9)
      .set("latency_us", latency * 1e6)
      .set("points", points_json(pts));
}

Cluster calibrate_this_machine(const CalibrateOptions& o) {
  MAMMOTH_CHECK(o.threads_per_rank >= 1)
      << "[calibrate] threads_per_rank must be >= 1, got " << o.threads_per_rank;
  const auto start = Clock::now();
  const int saved_threads = num_threads();
  set_num_threads(o.threads_per_rank);
  g_thread_clock = o.threads_per_rank == 1;
  auto say = [&](const char* what, double value, const char* unit) {
    if (o.verbose) std::fprintf(stderr, "[calibrate] %-34s %10.4g %s\n", what, value, unit);
  };
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int devices = std::max(1, cores / o.threads_per_rank);

  double core_peak = 0;
  for (int r = 0; r < 3; ++r) core_peak = std::max(core_peak, fma_peak_one_core());
  const double peak = core_peak * o.threads_per_rank;
  say("fp32 FMA peak per rank", peak / 1e9, "GFLOP/s");
  const GemmFit gemm = measure_gemm(o.quick);
  say("sgemm rate, largest GEMM", gemm.rate / 1e9, "GFLOP/s");
  say("sgemm asymptotic rate (fit)", 1e-9 / gemm.model.per_flop, "GFLOP/s");
  say("sgemm short-K term (fit)", gemm.model.per_flop_k * 1e9, "ns/FLOP x K");
  say("sgemm thin-output term (fit)", gemm.model.per_flop_mn * 1e9, "ns/FLOP x min(M,N)");
  say("sgemm per call (fit)", gemm.model.call * 1e6, "us");
  const OpFit ops = measure_ops(o.quick);
  say("engine op per-call cost", ops.overhead * 1e6, "us");
  say("engine op bandwidth (in cache)", ops.bandwidth / 1e9, "GB/s");
  const double broadcast = measure_broadcast_ops(o.quick, ops.overhead);
  say("broadcast op per element", broadcast * 1e9, "ns");
  json::Value attn_points;
  const std::vector<std::pair<double, double>> attn =
      measure_attention(o.quick, ops.overhead, attn_points);
  for (const auto& [d, r] : attn) {
    const std::string what = "attention rate, head size " + std::to_string(int(d));
    say(what.c_str(), r / 1e9, "GFLOP/s");
  }

  const BlockSteps narrow = measure_block_steps(o.quick, 64, 2, 32);
  const BlockSteps wide = measure_block_steps(o.quick, 256, 4, 64);
  for (const BlockSteps* b : {&narrow, &wide}) {
    const std::string what = "gpt2 d_model " + std::to_string(b->deep.d_model) + ", 1 / 5 blocks";
    say(what.c_str(), b->shallow_s * 1e3, ("/ " + std::to_string(b->deep_s * 1e3) + " ms").c_str());
  }
  const double copy_bw = memory_speed_probe(o.quick ? 3 : 5);
  say("memcpy bandwidth (64 MiB)", copy_bw / 1e9, "GB/s");
  const Link paging = measure_paging(o.quick);
  say("chunk paging bandwidth (device <-> host)", paging.bandwidth / 1e9, "GB/s");
  say("chunk paging cost per move", paging.latency * 1e6, "us");
  const std::string dir = scratch(o);
  const DiskFit disk = measure_disk(dir, o.quick);
  say("disk write (fsync)", disk.write_bw / 1e9, "GB/s");
  say("disk read (cache dropped)", disk.read_bw / 1e9, "GB/s");
  set_num_threads(saved_threads);
  const json::Value comm = comm_figures(o);
  Link net{copy_bw / 2, 1e-6};
  if (comm.is_object()) {
    net = {comm.at("GBps").as_double() * 1e9, comm.at("latency_us").as_double() * 1e-6};
    say("MPI all-reduce bandwidth (2 ranks)", net.bandwidth / 1e9, "GB/s");
    say("MPI all-reduce latency (2 ranks)", net.latency * 1e6, "us");
  }

  Cluster c;
  c.name = "calibrated_" + std::to_string(cores) + "core";
  c.description = "measured by `mammoth plan --calibrate` on this machine: one rank = " +
                  std::to_string(o.threads_per_rank) + " CPU thread(s), " +
                  std::to_string(devices) + " ranks on " + std::to_string(cores) + " cores, " +
                  kernels::cpu::gemm_isa_name(kernels::cpu::active_gemm_isa()) +
                  " kernels; see \"calibration\"";
  c.devices_per_node = devices;
  c.nodes = 1;
  // The CPU computes every dtype in fp32 FMAs (bf16 GEMMs widen to fp32).
  c.peak_fp32 = c.peak_tf32 = c.peak_bf16 = c.peak_fp16 = peak;
  c.matmul_efficiency = std::clamp(gemm.rate / peak, 1e-3, 1.0);
  c.matmul_efficiency_source = "sgemm at transformer block shapes on this machine (calibrated)";
  const int64_t mem = mem_total_bytes();
  c.host_memory = mem;
  c.device_memory = mem / devices;
  struct statvfs fs {};
  c.nvme_capacity =
      statvfs(dir.c_str(), &fs) == 0 ? static_cast<int64_t>(fs.f_bavail) * fs.f_frsize : 1;
  c.nvme_capacity = std::max<int64_t>(c.nvme_capacity, 1 << 20);
  c.device_memory_bandwidth = ops.bandwidth;
  c.host_memory_bandwidth = copy_bw;
  c.intra_node = c.inter_node = net;
  c.pcie = paging.bandwidth > 0 ? paging : Link{copy_bw / 2, ops.overhead};
  const double disk_bw = disk.write_bw > 0 && disk.read_bw > 0
                             ? 2 / (1 / disk.write_bw + 1 / disk.read_bw)
                             : copy_bw / 10;
  c.nvme = {disk_bw, disk.latency > 0 ? disk.latency : 1e-4};
  c.op_overhead = ops.overhead;
  c.broadcast_op_per_element = broadcast;
  c.gemm_call_overhead = gemm.model.call;
  c.attention_rate = attn.back().second;
  c.attention_rates = attn;
  c.gemm = gemm.model;
  const InStepFit in_step = fit_in_step(block_parts(narrow, c), block_parts(wide, c), ops.overhead);
  c.op_overhead = in_step.op_overhead;
  c.in_step_compute = in_step.compute_factor;
  say("engine op cost in a block", c.op_overhead * 1e6, "us");
  say("GEMM / attention in a step / in a loop", c.in_step_compute, "x");
  // One thread per rank computes and drives MPI, which progresses only inside MPI calls: a
  // collective posted during the backward moves when the rank next waits on it.
  c.overlaps_communication = o.threads_per_rank > 1;
  c.calibration =
      json::Value::object()
          .set("what",
               "fma peak: register FMA loop x threads; sgemm: kernels/cpu sgemm at T x (N, K) "
               "fwd/dx/dw, time = call + flops / rate ([flops, s] points); ops: autograd chain of "
               "mul_scalar fwd+bwd, time per op = 2 overhead + bytes / bw ([bytes, s]); "
               "op overhead and in-step compute factor: whole gpt2 steps at 1 and 5 blocks, "
               "d_model 64 and 256, against the time model; "
               "broadcast op: autograd chain of [8,4,r,32] / [8,4,r,1] fwd+bwd, per element; "
               "attention: engine::attention fwd+bwd ([flops, s]); comm: MPI_Allreduce 2 local "
               "ranks ([bytes, s]); disk: 1 write+fsync, 1 read after fadvise(DONTNEED)")
          .set("quick", o.quick)
          .set("threads_per_rank", o.threads_per_rank)
          .set("cores", cores)
          .set("core_fma_peak_GFLOPs", core_peak / 1e9)
          .set("sgemm_GFLOPs", gemm.rate / 1e9)
          .set("sgemm_points", gemm.points)
          .set("op_points", ops.points)
          .set("op_overhead_chain_us", ops.overhead * 1e6)
          .set("block_steps", json::Value::array()
                                  .push_back(block_steps_json(narrow))
                                  .push_back(block_steps_json(wide)))
          .set("attention_points", attn_points)
          .set("memcpy_GBps", copy_bw / 1e9)
          .set("paging_GBps", paging.bandwidth / 1e9)
          .set("paging_move_us", paging.latency * 1e6)
          .set("disk_write_GBps", disk.write_bw / 1e9)
          .set("disk_read_GBps", disk.read_bw / 1e9)
          .set("comm", comm)
          .set("seconds", since(start));
  say("calibration took", since(start), "s");
  return c;
}

}  // namespace mammoth::plan
