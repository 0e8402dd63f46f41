// Benchmarks the CPU backend's non-GEMM kernels, each beside an anchor measured in the same run.
//
// Memory-bound kernels report GB/s: the bytes a kernel must move (each input read once, each
// output written once, as STREAM counts them) over its time. Their anchor is a STREAM-style
// triad a[i] = b[i] + s * c[i] (12 bytes per element) on arrays larger than the L3, run with
// AVX2 loads and both ordinary and streaming stores, the faster taken: the machine's bandwidth
// at its best. The triad runs interleaved with each kernel's runs (a triad, a kernel run, a
// triad, ...), and a row's anchor is the best of the triads interleaved with it: a VM's
// bandwidth can flip between states for seconds at a time (BENCHMARKS.md, "Kernel design
// measurements"), so only samples taken in the same stretch compare like with like. The section
// header also prints the best triad of the whole section. Attention reports GFLOP/s for the matmul
// work of the math (forward 4*T*T*D per head, backward 8*T*T*D; halved when causal; our backward's
// recomputation of P is not counted), and its anchor is the GEMM-bound rate: the same six matmuls
// done as whole batched sgemm calls with the T x T matrices materialised; rows named
// "...@sgemm2048" use the stricter anchor of sgemm's rate on a 2048^3 product. Every time is the
// best of `reps` runs after a warm-up (STREAM's convention), at 1 thread and at all threads.
// Kernels run through the registry exactly as the engine calls them.
//
// The bf16 GEMM rows (our gemm_bf16: bf16 in, fp32 accumulate and out) report GFLOP/s against
// torch.matmul on bf16 tensors of the same shapes at the same thread count (oneDNN; Debian's
// python3-torch), run by tools/bench/kernels/bf16_anchor.py in a Python subprocess: the python
// is --python, else $MAMMOTH_PYTHON, else /usr/bin/python3 (as `mammoth bench train` finds it).
// Without torch (or with --no-torch) those rows have no anchor and say why; no number is made up.
// When our kernels run AVX2 on a CPU with AVX-512 (--isa or MAMMOTH_ISA), the anchor is capped at
// AVX2 too (ONEDNN_MAX_CPU_ISA and friends); oneDNN has no bf16 matmul there, as on an AVX2-only
// CPU, so those rows say that and every other row runs.
//
// --json FILE writes one object per row: {name, shape, threads, ours, anchor, unit, ratio}
// (anchor and ratio null when there is none; bf16 rows add anchor_impl, or anchor_error).
#include "tools/bench/kernels_bench.h"

#include <immintrin.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <new>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "base/json.h"
#include "base/thread_pool.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa_env.h"
#include "kernels/cpu/simd.h"
#include "kernels/params.h"
#include "kernels/registry.h"
#include "memory/allocator.h"
#include "tools/bench/anchor_isa.h"

namespace mammoth::tools {
namespace {

using kernels::Kernel;
using kernels::TensorArg;
namespace kc = kernels::cpu;

struct Options {
  std::string json;
  int reps = 7;
  bool quick = false;
  std::string filter;
  int threads = 0;  // 0: 1 and all
  std::string isa;
  bool torch = true;        // run the bf16 GEMM anchor
  std::string python;       // for it; empty: $MAMMOTH_PYTHON or /usr/bin/python3
  std::string bf16_script;  // tools/bench/kernels/bf16_anchor.py; empty: looked for
  // --row-shape MxN: the shape of the softmax, norm, cross-entropy and activation rows instead
  // of theirs (with a small shape and --warm, what the kernel's arithmetic allows from cache).
  int64_t row_m = 0, row_n = 0;
  bool warm = false;  // --warm: memory rows timed right after an untimed run (cached shapes)
  // --attention-shape BxHxTxD: the attention rows' shape instead of 1x12x1024x64.
  std::array<int64_t, 4> attention = {1, 12, 1024, 64};
};

struct Row {
  std::string name, shape;
  int threads;
  double ours, anchor;
  std::string unit;
  double ratio;
  bool has_anchor = true;
  std::string anchor_impl;   // which library code ran the anchor, where known
  std::string anchor_error;  // why there is no anchor
};

double best_seconds(int reps, const std::function<void()>& f) {
  f();  // warm-up: page faults, pool start, caches
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Buffers from the engine's CpuAllocator, as tensors get them: 64-byte aligned (std::vector's
// 16 would put every row of a row kernel's output off the cache-line grid), and from 2 MiB up
// mapped for transparent huge pages. The triad's arrays come from the same place, so the anchor
// and our kernels read and write the same kind of memory.
template <typename T>
struct EngineAlloc {
  using value_type = T;
  EngineAlloc() = default;
  template <typename U>
  EngineAlloc(const EngineAlloc<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(memory::cpu_allocator().allocate(n * sizeof(T))); }
  void deallocate(T* p, size_t n) { memory::cpu_allocator().deallocate(p, n * sizeof(T)); }
  bool operator==(const EngineAlloc&) const { return true; }
};
using FloatBuf = std::vector<float, EngineAlloc<float>>;
using Bf16Buf = std::vector<uint16_t, EngineAlloc<uint16_t>>;

// Cheap deterministic fill in [lo, hi), in parallel so setup stays short.
void fill(FloatBuf& v, float lo, float hi, uint32_t salt) {
  float* p = v.data();
  parallel_for(0, static_cast<int64_t>(v.size()), 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const uint32_t h = (static_cast<uint32_t>(i) ^ salt) * 2654435761u;
      p[i] = lo + (hi - lo) * static_cast<float>(h >> 8) / 16777216.0f;
    }
  });
}

TensorArg targ(void* p, DType dt, std::vector<int64_t> shape) {
  TensorArg a;
  a.data = p;
  a.dtype = dt;
  a.ndim = static_cast<int>(shape.size());
  int64_t st = 1;
  for (int d = a.ndim - 1; d >= 0; --d) {
    a.shape[d] = shape[d];
    a.strides[d] = st;
    st *= shape[d];
  }
  return a;
}
TensorArg farg(FloatBuf& v, std::vector<int64_t> shape) {
  return targ(v.data(), DType::kF32, std::move(shape));
}

void run(Kernel k, std::vector<TensorArg> in, std::vector<TensorArg> out,
         const void* params = nullptr) {
  kernels::launch(k, DeviceType::kCPU, DType::kF32, in, out, params);
}

// ---- the triad anchor ------------------------------------------------------------------------

template <bool kStream>
__attribute__((target("avx2,fma"))) void triad_range(float* a, const float* b, const float* c,
                                                     float s, int64_t i0, int64_t i1) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) {
    const __m256 r = _mm256_fmadd_ps(sv, _mm256_loadu_ps(c + i), _mm256_loadu_ps(b + i));
    if (kStream) {
      _mm256_stream_ps(a + i, r);
    } else {
      _mm256_storeu_ps(a + i, r);
    }
  }
  for (; i < i1; ++i) a[i] = b[i] + s * c[i];
  if (kStream) _mm_sfence();
}

bool has_avx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

// The triad's arrays, allocated once; run(stream) does one pass over all threads.
class Triad {
 public:
  explicit Triad(int64_t n) : n_(n), a_(n + 16), b_(n + 16), c_(n + 16) {
    fill(b_, -1, 1, 1);
    fill(c_, -1, 1, 2);
    fill(a_, 0, 1, 3);
    // Streaming stores need 32-byte alignment: offset all three arrays alike.
    while (reinterpret_cast<uintptr_t>(a_.data() + off_) % 32 != 0) ++off_;
  }
  double bytes() const { return 12.0 * static_cast<double>(n_); }
  void run(bool stream) {
    float* ap = a_.data() + off_;
    const float* bp = b_.data() + off_;
    const float* cp = c_.data() + off_;
    const int64_t units = n_ / 8;
    parallel_for(0, units, 1 << 13, [&](int64_t lo, int64_t hi) {
      const int64_t i1 = hi == units ? n_ : hi * 8;
      if (!has_avx2()) {
        for (int64_t i = lo * 8; i < i1; ++i) ap[i] = bp[i] + 3.0f * cp[i];
      } else if (stream) {
        triad_range<true>(ap, bp, cp, 3.0f, lo * 8, i1);
      } else {
        triad_range<false>(ap, bp, cp, 3.0f, lo * 8, i1);
      }
    });
  }

 private:
  int64_t n_;
  FloatBuf a_, b_, c_;
  int64_t off_ = 0;
};

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- the bf16 GEMM anchor (torch.matmul in a subprocess) --------------------------------------

// GPT-2 small training GEMMs (B*T = 4096 tokens, C = 768; weights [in, out]: forward NN,
// dX = dY W^T is NT, dW = X^T dY is TN) and a 2048^3 square, in bf16.
struct Bf16Shape {
  const char* name;
  bool ta, tb;
  int64_t M, N, K;
};
constexpr Bf16Shape kBf16Shapes[] = {
    {"qkv_fwd", false, false, 4096, 2304, 768},  {"fc_fwd", false, false, 4096, 3072, 768},
    {"proj_fwd", false, false, 4096, 768, 3072}, {"fc_dx", false, true, 4096, 768, 3072},
    {"proj_dw", true, false, 3072, 768, 4096},   {"square2048", false, false, 2048, 2048, 2048},
};

std::string bf16_row_name(const Bf16Shape& s) {
  return std::string("gemm_bf16_") + s.name + "_" + (s.ta ? "T" : "N") + (s.tb ? "T" : "N");
}

// tools/bench/kernels/bf16_anchor.py: given, under the working directory, in Bazel runfiles,
// or beside a parent of the binary (bazel-bin/... sits in the source tree). Empty if not found.
std::string find_bf16_script(const Options& o) {
  if (!o.bf16_script.empty()) return o.bf16_script;
  const std::string rel = "tools/bench/kernels/bf16_anchor.py";
  std::vector<std::string> candidates = {rel};
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(exe.string() + ".runfiles/mammoth/" + rel);
    for (auto p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path()) {
      candidates.push_back((p / rel).string());
    }
  }
  for (const std::string& c : candidates) {
    if (std::filesystem::exists(c, ec)) return c;
  }
  return "";
}

// Runs the anchor script for `shapes` at `threads`; its last output line is a JSON object.
// On failure returns an object {"error": why}.
json::Value torch_bf16_anchor(const Options& o, int threads,
                              const std::vector<const Bf16Shape*>& shapes) {
  auto failed = [](const std::string& why) {
    json::Value v = json::Value::object();
    v.set("error", json::Value(why));
    return v;
  };
  if (!o.torch) return failed("anchor skipped (--no-torch)");
  const std::string script = find_bf16_script(o);
  if (script.empty()) return failed("tools/bench/kernels/bf16_anchor.py not found");
  std::string python = o.python;
  if (python.empty()) {
    const char* env = std::getenv("MAMMOTH_PYTHON");
    python = env != nullptr && *env != '\0' ? env : "/usr/bin/python3";
  }
  std::string spec;
  for (const Bf16Shape* s : shapes) {
    spec += std::string(spec.empty() ? "" : ",") + s->name + ":" + (s->ta ? "1" : "0") + ":" +
            (s->tb ? "1" : "0") + ":" + std::to_string(s->M) + ":" + std::to_string(s->N) + ":" +
            std::to_string(s->K);
  }
  // An AVX2 run of ours gets an AVX2 anchor: oneDNN, ATen's dispatch and MKL capped at AVX2, so
  // a forced ISA compares like with like (and on such a CPU the bf16 anchor says it cannot run).
  const std::string cap = anchor_capped_at_avx2() ? kAnchorAvx2Env : "";
  const std::string cmd = cap + "'" + python + "' '" + script + "' --threads " +
                          std::to_string(threads) + " --reps " + std::to_string(o.reps) +
                          " --shapes " + spec;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return failed("cannot run " + cmd);
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  const int status = ::pclose(pipe);
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  const size_t nl = out.rfind('\n');
  const std::string last = nl == std::string::npos ? out : out.substr(nl + 1);
  json::Value v;
  try {
    v = json::parse(last, "bf16_anchor.py output");
  } catch (const std::exception&) {
    return failed("the torch anchor failed (exit " + std::to_string(rc) + "): " + cmd);
  }
  if (!v.is_object()) return failed("the torch anchor printed no result: " + cmd);
  if (rc != 0 && !v.contains("error")) {
    return failed("the torch anchor failed (exit " + std::to_string(rc) + ")");
  }
  return v;
}

// ---- rows ------------------------------------------------------------------------------------

struct Bench {
  Options opt;
  std::vector<Row> rows;
  int threads = 1;
  Triad* triad = nullptr;

  bool wanted(const std::string& name) const {
    return opt.filter.empty() || name.find(opt.filter) != std::string::npos;
  }
  // Row `name` or its in-place twin (name + "_inplace", in_place_row): a --filter naming the
  // twin alone still needs the group's buffers and the forward that prepares its inputs.
  bool wanted_or_twin(const std::string& name) const {
    return wanted(name) || wanted(name + "_inplace");
  }
  bool any_wanted(std::initializer_list<const char*> names) const {
    for (const char* n : names) {
      if (wanted_or_twin(n)) return true;
    }
    return false;
  }
  void add(const std::string& name, const std::string& shape, double ours, double anchor,
           const char* unit) {
    rows.push_back({name, shape, threads, ours, anchor, unit, ours / anchor});
  }
  // Runs f (untimed) if row `name` or its in-place twin is wanted: a backward row's saved inputs
  // (softmax's output, layer_norm's mean and rstd, ...) come from its forward kernel, whether or
  // not --filter selected the forward row too (zeros would make a degenerate row: rstd 0, all of
  // dx 0).
  void prepare(const std::string& name, const std::function<void()>& f) {
    if (wanted_or_twin(name)) f();
  }
  // A memory-bound kernel moving `bytes` per call. The triad (both store kinds) runs
  // interleaved with the kernel; its best here is a candidate for the section's anchor.
  // `restore` (untimed) runs before each timed run and the triads that precede it.
  void memory_row(const std::string& name, const std::string& shape, double bytes,
                  const std::function<void()>& f, const std::function<void()>& restore = {}) {
    if (!wanted(name)) return;
    if (restore) restore();
    f();
    triad->run(false);
    triad->run(true);
    // Every timed run starts with no dirty lines in the cache: the plain-store triad leaves up
    // to an L3 of them, and whatever runs next pays for writing them back (a large share of a
    // row kernel's time), so an untimed streaming triad, which leaves none, follows it.
    double t = 1e30, t_plain = 1e30, t_stream = 1e30;
    for (int r = 0; r < opt.reps; ++r) {
      if (restore) restore();
      t_plain = std::min(t_plain, seconds_of([&] { triad->run(false); }));
      triad->run(true);
      t_stream = std::min(t_stream, seconds_of([&] { triad->run(true); }));
      if (opt.warm) f();
      t = std::min(t, seconds_of(f));
    }
    add(name, shape, bytes / t / 1e9, triad->bytes() / std::min(t_plain, t_stream) / 1e9, "GB/s");
  }

  // A backward kernel with dx written over its input dy (or cross_entropy's over its logits), as
  // the engine runs it where nothing else reads that input (engine/ops/common.h, overwritable):
  // f(g) runs it over g, which gets dy's values again before every run (untimed, and before the
  // triads, which leave no line of it cached).
  void in_place_row(const std::string& name, const std::string& shape, double bytes,
                    const FloatBuf& dy, const std::function<void(FloatBuf&)>& f) {
    if (!wanted(name)) return;
    FloatBuf g(dy.size());
    memory_row(
        name, shape, bytes, [&] { f(g); }, [&] { std::copy(dy.begin(), dy.end(), g.begin()); });
  }

  void adamw_rows() {
    const int64_t n = opt.quick ? (int64_t{1} << 22) : (int64_t{1} << 24);
    const std::string shape = std::to_string(n);
    if (!any_wanted({"adamw", "adamw_bf16_grad_param"})) return;
    FloatBuf w(n), g(n), m(n), v(n);
    fill(w, -1, 1, 10);
    fill(g, -1, 1, 11);
    fill(m, -0.1f, 0.1f, 12);
    fill(v, 0, 0.1f, 13);
    kernels::AdamWParams p;
    p.lr = 1e-4;  // small steps: many repetitions keep the values in range
    p.weight_decay = 0.1;
    p.step = 10;
    memory_row("adamw", shape, 28.0 * n, [&] {
      run(Kernel::adamw, {farg(w, {n}), farg(g, {n}), farg(m, {n}), farg(v, {n})}, {}, &p);
    });
    // The optimizer-offload form: bf16 gradients in, a bf16 copy of the parameters out.
    Bf16Buf gh(n), wh(n);
    for (int64_t i = 0; i < n; ++i) gh[i] = float_to_bf16(g[i]).bits;
    memory_row("adamw_bf16_grad_param", shape, 28.0 * n, [&] {
      run(Kernel::adamw,
          {farg(w, {n}), targ(gh.data(), DType::kBF16, {n}), farg(m, {n}), farg(v, {n}),
           targ(wh.data(), DType::kBF16, {n})},
          {}, &p);
    });
  }

  void softmax_rows() {
    const int64_t M = opt.row_m > 0 ? opt.row_m : opt.quick ? 2048 : 8192;
    const int64_t N = opt.row_n > 0 ? opt.row_n : 2048, n = M * N;
    const std::string shape = std::to_string(M) + "x" + std::to_string(N);
    if (!any_wanted({"softmax", "softmax_backward", "log_softmax", "log_softmax_backward"})) return;
    FloatBuf x(n), y(n), dy(n), dx(n);
    fill(x, -4, 4, 20);
    fill(dy, -1, 1, 21);
    memory_row("softmax", shape, 8.0 * n, [&] {
      run(Kernel::softmax, {farg(x, {M, N})}, {farg(y, {M, N})});
    });
    prepare("softmax_backward", [&] {
      run(Kernel::softmax, {farg(x, {M, N})}, {farg(y, {M, N})});
    });
    memory_row("softmax_backward", shape, 12.0 * n, [&] {
      run(Kernel::softmax_backward, {farg(dy, {M, N}), farg(y, {M, N})}, {farg(dx, {M, N})});
    });
    in_place_row("softmax_backward_inplace", shape, 12.0 * n, dy, [&](FloatBuf& g) {
      run(Kernel::softmax_backward, {farg(g, {M, N}), farg(y, {M, N})}, {farg(g, {M, N})});
    });
    memory_row("log_softmax", shape, 8.0 * n, [&] {
      run(Kernel::log_softmax, {farg(x, {M, N})}, {farg(y, {M, N})});
    });
    prepare("log_softmax_backward", [&] {
      run(Kernel::log_softmax, {farg(x, {M, N})}, {farg(y, {M, N})});
    });
    memory_row("log_softmax_backward", shape, 12.0 * n, [&] {
      run(Kernel::log_softmax_backward, {farg(dy, {M, N}), farg(y, {M, N})}, {farg(dx, {M, N})});
    });
    in_place_row("log_softmax_backward_inplace", shape, 12.0 * n, dy, [&](FloatBuf& g) {
      run(Kernel::log_softmax_backward, {farg(g, {M, N}), farg(y, {M, N})}, {farg(g, {M, N})});
    });
  }

  // The norms at the model zoo's widths, unless --row-shape gives one shape: GPT-2 small's (768),
  // GPT-2 medium's, BERT-large's and ViT-L's (1024), GPT-2 XL's (1600, where layer_norm backward
  // takes its grouped long-row form) and LLaMA-7B's (4096, where a row and its weight vectors no
  // longer stay in L1 between passes).
  void norm_rows() {
    if (opt.row_m > 0) return norm_rows(opt.row_m, opt.row_n);
    norm_rows(opt.quick ? 4096 : 16384, 768);
    norm_rows(opt.quick ? 3072 : 12288, 1024);
    norm_rows(opt.quick ? 2048 : 7864, 1600);
    norm_rows(opt.quick ? 1024 : 3072, 4096);
  }
  void norm_rows(int64_t M, int64_t N) {
    const int64_t n = M * N;
    const std::string shape = std::to_string(M) + "x" + std::to_string(N);
    if (!any_wanted({"layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward"})) return;
    FloatBuf x(n), y(n), dy(n), dx(n), w(N), b(N), dw(N), db(N), mean(M), rstd(M);
    fill(x, -2, 3, 30);
    fill(dy, -1, 1, 31);
    fill(w, 0.5f, 1.5f, 32);
    fill(b, -0.5f, 0.5f, 33);
    kernels::NormParams p;
    memory_row("layer_norm", shape, 8.0 * n + 8.0 * M, [&] {
      run(Kernel::layer_norm, {farg(x, {M, N}), farg(w, {N}), farg(b, {N})},
          {farg(y, {M, N}), farg(mean, {M}), farg(rstd, {M})}, &p);
    });
    prepare("layer_norm_backward", [&] {
      run(Kernel::layer_norm, {farg(x, {M, N}), farg(w, {N}), farg(b, {N})},
          {farg(y, {M, N}), farg(mean, {M}), farg(rstd, {M})}, &p);
    });
    memory_row("layer_norm_backward", shape, 12.0 * n + 8.0 * M, [&] {
      run(Kernel::layer_norm_backward,
          {farg(dy, {M, N}), farg(x, {M, N}), farg(w, {N}), farg(mean, {M}), farg(rstd, {M})},
          {farg(dx, {M, N}), farg(dw, {N}), farg(db, {N})});
    });
    in_place_row("layer_norm_backward_inplace", shape, 12.0 * n + 8.0 * M, dy, [&](FloatBuf& g) {
      run(Kernel::layer_norm_backward,
          {farg(g, {M, N}), farg(x, {M, N}), farg(w, {N}), farg(mean, {M}), farg(rstd, {M})},
          {farg(g, {M, N}), farg(dw, {N}), farg(db, {N})});
    });
    memory_row("rms_norm", shape, 8.0 * n + 4.0 * M, [&] {
      run(Kernel::rms_norm, {farg(x, {M, N}), farg(w, {N})}, {farg(y, {M, N}), farg(rstd, {M})},
          &p);
    });
    prepare("rms_norm_backward", [&] {
      run(Kernel::rms_norm, {farg(x, {M, N}), farg(w, {N})}, {farg(y, {M, N}), farg(rstd, {M})},
          &p);
    });
    memory_row("rms_norm_backward", shape, 12.0 * n + 4.0 * M, [&] {
      run(Kernel::rms_norm_backward,
          {farg(dy, {M, N}), farg(x, {M, N}), farg(w, {N}), farg(rstd, {M})},
          {farg(dx, {M, N}), farg(dw, {N})});
    });
    in_place_row("rms_norm_backward_inplace", shape, 12.0 * n + 4.0 * M, dy, [&](FloatBuf& g) {
      run(Kernel::rms_norm_backward,
          {farg(g, {M, N}), farg(x, {M, N}), farg(w, {N}), farg(rstd, {M})},
          {farg(g, {M, N}), farg(dw, {N})});
    });
  }

  void cross_entropy_rows() {
    const int64_t M = opt.row_m > 0 ? opt.row_m : opt.quick ? 64 : 256;
    const int64_t V = opt.row_n > 0 ? opt.row_n : 50257, n = M * V;
    const std::string shape = std::to_string(M) + "x" + std::to_string(V);
    if (!any_wanted({"cross_entropy", "cross_entropy_backward"})) return;
    FloatBuf x(n), dx(n), loss(M), lse(M), dloss(M, 1.0f / M);
    std::vector<int64_t> target(M);
    for (int64_t i = 0; i < M; ++i) target[i] = (i * 7919) % V;
    fill(x, -6, 6, 40);
    kernels::CrossEntropyParams p;
    const TensorArg t = targ(target.data(), DType::kI64, {M});
    memory_row("cross_entropy", shape, 4.0 * n, [&] {
      run(Kernel::cross_entropy, {farg(x, {M, V}), t}, {farg(loss, {M}), farg(lse, {M})}, &p);
    });
    prepare("cross_entropy_backward", [&] {
      run(Kernel::cross_entropy, {farg(x, {M, V}), t}, {farg(loss, {M}), farg(lse, {M})}, &p);
    });
    memory_row("cross_entropy_backward", shape, 8.0 * n, [&] {
      run(Kernel::cross_entropy_backward, {farg(dloss, {M}), farg(x, {M, V}), t, farg(lse, {M})},
          {farg(dx, {M, V})}, &p);
    });
    // Over the logits, as the engine runs it where nothing else holds them.
    in_place_row("cross_entropy_backward_inplace", shape, 8.0 * n, x, [&](FloatBuf& g) {
      run(Kernel::cross_entropy_backward, {farg(dloss, {M}), farg(g, {M, V}), t, farg(lse, {M})},
          {farg(g, {M, V})}, &p);
    });
  }

  void gelu_rows() {
    const int64_t M = opt.row_m > 0 ? opt.row_m : opt.quick ? 1024 : 4096;
    const int64_t N = opt.row_n > 0 ? opt.row_n : 3072, n = M * N;
    const std::string shape = std::to_string(M) + "x" + std::to_string(N);
    if (!any_wanted({"gelu_tanh", "gelu_tanh_backward", "gelu", "gelu_backward", "silu",
                     "silu_backward"})) {
      return;
    }
    FloatBuf x(n), y(n), dy(n), dx(n);
    fill(x, -4, 4, 50);
    fill(dy, -1, 1, 51);
    memory_row("gelu_tanh", shape, 8.0 * n, [&] {
      run(Kernel::gelu_tanh, {farg(x, {M, N})}, {farg(y, {M, N})});
    });
    memory_row("gelu_tanh_backward", shape, 12.0 * n, [&] {
      run(Kernel::gelu_tanh_backward, {farg(dy, {M, N}), farg(x, {M, N})}, {farg(dx, {M, N})});
    });
    memory_row("gelu", shape, 8.0 * n, [&] {
      run(Kernel::gelu, {farg(x, {M, N})}, {farg(y, {M, N})});
    });
    memory_row("gelu_backward", shape, 12.0 * n, [&] {
      run(Kernel::gelu_backward, {farg(dy, {M, N}), farg(x, {M, N})}, {farg(dx, {M, N})});
    });
    memory_row("silu", shape, 8.0 * n, [&] {
      run(Kernel::silu, {farg(x, {M, N})}, {farg(y, {M, N})});
    });
    memory_row("silu_backward", shape, 12.0 * n, [&] {
      run(Kernel::silu_backward, {farg(dy, {M, N}), farg(x, {M, N})}, {farg(dx, {M, N})});
    });
  }

  void attention_rows() {
    const auto [B, H, T, D] = opt.attention;
    const int64_t BH = B * H;
    const std::string shape = "B" + std::to_string(B) + " H" + std::to_string(H) + " T" +
                              std::to_string(T) + " D" + std::to_string(D);
    if (!any_wanted({"attention_fwd", "attention_fwd_bwd", "attention_fwd_causal",
                     "attention_fwd_bwd_causal"})) {
      return;
    }
    const int64_t nq = BH * T * D;
    FloatBuf q(nq), k(nq), v(nq), o(nq), lse(BH * T), dout(nq), dq(nq), dk(nq), dv(nq);
    fill(q, -1, 1, 60);
    fill(k, -1, 1, 61);
    fill(v, -1, 1, 62);
    fill(dout, -1, 1, 63);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const std::vector<int64_t> s4 = {B, H, T, D};
    // The GEMM-bound anchor: the same matmuls as whole batched sgemms (T x T materialised).
    FloatBuf S(BH * T * T), dP(BH * T * T);
    fill(S, 0, 1.0f / T, 64);
    auto bgemm = [&](bool ta, bool tb, int64_t m, int64_t n, int64_t kk, float alpha,
                     const float* A, int64_t lda, int64_t sa, const float* Bm, int64_t ldb,
                     int64_t sb, float* C, int64_t ldc, int64_t sc) {
      kc::sgemm_strided_batched(ta, tb, m, n, kk, alpha, A, lda, sa, Bm, ldb, sb, 0.0f, C, ldc, sc,
                                BH);
    };
    const int64_t TD = T * D, TT = T * T;
    auto anchor_fwd = [&] {
      bgemm(false, true, T, T, D, scale, q.data(), D, TD, k.data(), D, TD, S.data(), T, TT);
      bgemm(false, false, T, D, T, 1, S.data(), T, TT, v.data(), D, TD, o.data(), D, TD);
    };
    auto anchor_bwd = [&] {
      bgemm(true, false, T, D, T, 1, S.data(), T, TT, dout.data(), D, TD, dv.data(), D, TD);
      bgemm(false, true, T, T, D, 1, dout.data(), D, TD, v.data(), D, TD, dP.data(), T, TT);
      bgemm(false, false, T, D, T, 1, S.data(), T, TT, k.data(), D, TD, dq.data(), D, TD);
      bgemm(true, false, T, D, T, 1, S.data(), T, TT, q.data(), D, TD, dk.data(), D, TD);
    };
    const double flops_fwd = 4.0 * T * T * D * BH, flops_all = 12.0 * T * T * D * BH;
    const double t_anchor_fwd = best_seconds(opt.reps, anchor_fwd);
    const double t_anchor_all = best_seconds(opt.reps, [&] {
      anchor_fwd();
      anchor_bwd();
    });
    const double rate_fwd = flops_fwd / t_anchor_fwd / 1e9;
    const double rate_all = flops_all / t_anchor_all / 1e9;
    // A stricter anchor: sgemm's rate on a large square problem, where it is most efficient.
    const int64_t sq = opt.quick ? 1024 : 2048;
    FloatBuf A(sq * sq), Bsq(sq * sq), Csq(sq * sq);
    fill(A, -1, 1, 65);
    fill(Bsq, -1, 1, 66);
    const double t_sq = best_seconds(std::min(opt.reps, 3), [&] {
      kc::sgemm(false, false, sq, sq, sq, 1.0f, A.data(), sq, Bsq.data(), sq, 0.0f, Csq.data(), sq);
    });
    const double rate_peak = 2.0 * sq * sq * sq / t_sq / 1e9;
    for (bool causal : {false, true}) {
      kernels::AttentionParams p;
      p.causal = causal;
      const double frac = causal ? 0.5 : 1.0;
      auto fwd = [&] {
        run(Kernel::attention, {farg(q, s4), farg(k, s4), farg(v, s4)},
            {farg(o, s4), farg(lse, {B, H, T})}, &p);
      };
      auto bwd = [&] {
        run(Kernel::attention_backward,
            {farg(dout, s4), farg(q, s4), farg(k, s4), farg(v, s4), farg(o, s4),
             farg(lse, {B, H, T})},
            {farg(dq, s4), farg(dk, s4), farg(dv, s4)}, &p);
      };
      const std::string suffix = causal ? "_causal" : "";
      if (wanted("attention_fwd" + suffix)) {
        const double t = best_seconds(opt.reps, fwd);
        add("attention_fwd" + suffix, shape, frac * flops_fwd / t / 1e9, rate_fwd, "GFLOP/s");
      }
      if (wanted("attention_fwd_bwd" + suffix)) {
        const double t = best_seconds(opt.reps, [&] {
          fwd();
          bwd();
        });
        add("attention_fwd_bwd" + suffix, shape, frac * flops_all / t / 1e9, rate_all, "GFLOP/s");
        add("attention_fwd_bwd" + suffix + "@sgemm" + std::to_string(sq), shape,
            frac * flops_all / t / 1e9, rate_peak, "GFLOP/s");
      }
    }
  }

  // Our gemm_bf16 on each shape, then torch.matmul on all of them in one subprocess.
  void bf16_gemm_rows() {
    std::vector<const Bf16Shape*> shapes;
    for (const Bf16Shape& s : kBf16Shapes) {
      if (opt.quick && s.M * s.N * s.K > int64_t{4096} * 2304 * 768) continue;
      if (wanted(bf16_row_name(s))) shapes.push_back(&s);
    }
    if (shapes.empty()) return;
    const size_t first = rows.size();
    for (const Bf16Shape* s : shapes) {
      const int64_t a_cols = s->ta ? s->M : s->K, b_cols = s->tb ? s->K : s->N;
      FloatBuf af(s->M * s->K), bf(s->K * s->N), c(s->M * s->N);
      fill(af, -1, 1, 70);
      fill(bf, -1, 1, 71);
      Bf16Buf a(af.size()), b(bf.size());
      for (size_t i = 0; i < af.size(); ++i) a[i] = float_to_bf16(af[i]).bits;
      for (size_t i = 0; i < bf.size(); ++i) b[i] = float_to_bf16(bf[i]).bits;
      const double t = best_seconds(opt.reps, [&] {
        kc::gemm_bf16(s->ta, s->tb, s->M, s->N, s->K, 1.0f, a.data(), a_cols, b.data(), b_cols,
                      0.0f, c.data(), s->N);
      });
      const std::string shape =
          std::to_string(s->M) + "x" + std::to_string(s->N) + "x" + std::to_string(s->K);
      add(bf16_row_name(*s), shape, 2.0 * s->M * s->N * s->K / t / 1e9, 0, "GFLOP/s");
    }
    const json::Value v = torch_bf16_anchor(opt, threads, shapes);
    for (size_t i = first; i < rows.size(); ++i) {
      Row& r = rows[i];
      r.has_anchor = false;
      if (v.contains("error")) {
        r.anchor_error = v.at("error").as_string();
        continue;
      }
      if (v.at("threads").as_int() != threads) {
        r.anchor_error = "torch ran " + std::to_string(v.at("threads").as_int()) + " threads";
        continue;
      }
      const json::Value& t = v.at("rows")[i - first];
      r.has_anchor = true;
      r.anchor = t.at("gflops").as_double();
      r.ratio = r.ours / r.anchor;
      r.anchor_impl = "torch " + v.at("torch").as_string() + " matmul, " + t.at("impl").as_string();
    }
  }

  // Runs every row at the current thread count, then prints them. The GB/s anchor of a row is
  // the best of the `reps` triads interleaved with its own runs (see the top of the file).
  void run_all() {
    const size_t first = rows.size();
    adamw_rows();
    softmax_rows();
    norm_rows();
    cross_entropy_rows();
    gelu_rows();
    attention_rows();
    bf16_gemm_rows();
    double best_triad = 0;
    for (size_t i = first; i < rows.size(); ++i) {
      if (rows[i].unit == "GB/s") best_triad = std::max(best_triad, rows[i].anchor);
    }
    std::printf("-- %d thread%s", threads, threads == 1 ? "" : "s");
    if (best_triad > 0) std::printf(": best triad of the section %.1f GB/s", best_triad);
    std::printf("\n");
    for (size_t i = first; i < rows.size(); ++i) {
      Row& r = rows[i];
      if (!r.has_anchor) {
        std::printf("%-26s %-22s %7d %10.1f %10s %-7s %6s  (%s)\n", r.name.c_str(), r.shape.c_str(),
                    r.threads, r.ours, "-", r.unit.c_str(), "-", r.anchor_error.c_str());
        continue;
      }
      std::printf("%-26s %-22s %7d %10.1f %10.1f %-7s %6.2f\n", r.name.c_str(), r.shape.c_str(),
                  r.threads, r.ours, r.anchor, r.unit.c_str(), r.ratio);
    }
    // Which code ran the anchors that name it (the bf16 rows: the oneDNN primitive).
    std::vector<std::string> impls;
    for (size_t i = first; i < rows.size(); ++i) {
      const std::string& im = rows[i].anchor_impl;
      if (!im.empty() && std::find(impls.begin(), impls.end(), im) == impls.end()) {
        impls.push_back(im);
        std::printf("bf16 anchor: %s\n", im.c_str());
      }
    }
    std::fflush(stdout);
  }
};

void write_json(const std::string& path, const std::vector<Row>& rows) {
  std::ofstream f(path);
  MAMMOTH_CHECK(f.good()) << "[bench kernels] cannot write " << path;
  f << "[\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    json::Value o = json::Value::object();
    o.set("name", json::Value(r.name));
    o.set("shape", json::Value(r.shape));
    o.set("threads", json::Value(r.threads));
    o.set("ours", json::Value(r.ours));
    o.set("anchor", r.has_anchor ? json::Value(r.anchor) : json::Value());
    o.set("unit", json::Value(r.unit));
    o.set("ratio", r.has_anchor ? json::Value(r.ratio) : json::Value());
    if (!r.anchor_impl.empty()) o.set("anchor_impl", json::Value(r.anchor_impl));
    if (!r.anchor_error.empty()) o.set("anchor_error", json::Value(r.anchor_error));
    f << "  " << json::dump(o) << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  f << "]\n";
}

}  // namespace

int run_kernels_bench(const std::vector<std::string>& args) {
  Bench bench;
  Options& opt = bench.opt;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      MAMMOTH_CHECK(i + 1 < args.size()) << "[bench kernels] " << a << " needs a value";
      return args[++i];
    };
    if (a == "--json") {
      opt.json = value();
    } else if (a == "--reps") {
      opt.reps = std::max(1, std::stoi(value()));
    } else if (a == "--quick") {
      opt.quick = true;
      opt.reps = std::min(opt.reps, 3);
    } else if (a == "--filter") {
      opt.filter = value();
    } else if (a == "--threads") {
      opt.threads = std::stoi(value());
    } else if (a == "--isa") {
      opt.isa = value();
    } else if (a == "--no-torch") {
      opt.torch = false;
    } else if (a == "--python") {
      opt.python = value();
    } else if (a == "--row-shape") {
      const std::string v = value();
      const size_t x = v.find('x');
      MAMMOTH_CHECK(x != std::string::npos) << "[bench kernels] --row-shape wants MxN, got " << v;
      opt.row_m = std::stoll(v.substr(0, x));
      opt.row_n = std::stoll(v.substr(x + 1));
    } else if (a == "--attention-shape") {
      const std::string v = value();
      std::array<int64_t, 4> d{};
      char tail = 0;
      MAMMOTH_CHECK(std::sscanf(v.c_str(), "%" SCNd64 "x%" SCNd64 "x%" SCNd64 "x%" SCNd64 "%c",
                                &d[0], &d[1], &d[2], &d[3], &tail) == 4 &&
                    d[0] > 0 && d[1] > 0 && d[2] > 0 && d[3] > 0)
          << "[bench kernels] --attention-shape wants BxHxTxD (positive), got " << v;
      opt.attention = d;
    } else if (a == "--warm") {
      opt.warm = true;
    } else if (a == "--bf16-anchor-script") {
      opt.bf16_script = value();
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: mammoth bench kernels [--json FILE] [--reps N] [--quick] [--filter NAME]\n"
          "                             [--threads N] [--isa avx512|avx2|portable]\n"
          "                             [--no-torch] [--python PATH] [--bf16-anchor-script PATH]\n"
          "                             [--row-shape MxN] [--attention-shape BxHxTxD] [--warm]\n"
          "bf16 GEMM rows are anchored on torch.matmul (bf16, oneDNN) run by PATH (default\n"
          "$MAMMOTH_PYTHON, else /usr/bin/python3); --no-torch leaves them without an anchor.\n");
      return 0;
    } else {
      MAMMOTH_THROW() << "[bench kernels] unknown flag '" << a << "'";
    }
  }
  if (!opt.isa.empty()) {
    const kc::SimdIsa isa = opt.isa == "avx512"     ? kc::SimdIsa::kAvx512
                            : opt.isa == "avx2"     ? kc::SimdIsa::kAvx2
                            : opt.isa == "portable" ? kc::SimdIsa::kPortable
                                                    : kc::SimdIsa::kAuto;
    MAMMOTH_CHECK(isa != kc::SimdIsa::kAuto)
        << "[bench kernels] unknown --isa '" << opt.isa << "': use avx512, avx2 or portable";
    // A clear refusal rather than an illegal instruction in the first kernel.
    MAMMOTH_CHECK(kc::simd_isa_supported(isa))
        << "[bench kernels] --isa " << opt.isa << ": this CPU cannot run the " << opt.isa
        << " fused kernels (" << (isa == kc::SimdIsa::kAvx512 ? "AVX-512 F" : "AVX2, FMA, F16C")
        << " missing); it runs "
        << (kc::simd_isa_supported(kc::SimdIsa::kAvx2) ? "avx2 and portable" : "portable");
    kc::set_simd_isa(isa);
  }
  const int64_t triad_n = opt.quick ? (int64_t{1} << 23) : (int64_t{1} << 24);
  Triad triad(triad_n);
  bench.triad = &triad;
  const int all = num_threads();
  std::vector<int> thread_counts;
  if (opt.threads > 0) {
    thread_counts = {opt.threads};
  } else {
    thread_counts = {1};
    if (all > 1) thread_counts.push_back(all);
  }
  // Who chose: --isa (the fused kernels only), else MAMMOTH_ISA (both), else the CPU's best.
  const std::string isa_source =
      !opt.isa.empty() ? "--isa " + opt.isa + " for the fused kernels" : kc::isa_request_source();
  std::printf("mammoth bench kernels: fused kernels %s, sgemm %s (%s); best of %d runs\n",
              kc::simd_isa_name(kc::active_simd_isa()), kc::gemm_isa_name(kc::active_gemm_isa()),
              isa_source.c_str(), opt.reps);
  if (anchor_capped_at_avx2()) {
    std::printf("bf16 anchor capped at AVX2 to match ours: %s\n", kAnchorAvx2Env);
  }
  std::printf(
      "STREAM triad anchor: %lld floats per array, AVX2 loads, best of plain and "
      "streaming stores, sampled between every kernel's runs; each row's anchor: the best triad "
      "among its own samples\n",
      static_cast<long long>(triad_n));
  {
    std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string mode;
    std::getline(thp, mode);
    std::printf(
        "buffers: the engine's CPU allocator, huge pages for blocks >= 2 MiB %s (THP: %s)\n",
        memory::cpu_allocator().huge_pages() ? "on" : "off (MAMMOTH_CPU_HUGE_PAGES=0)",
        mode.empty() ? "not reported" : mode.c_str());
    std::printf("row kernels stream outputs over %lld MiB (the last-level cache)\n",
                static_cast<long long>(kc::last_level_cache_bytes() >> 20));
  }
  {
    std::ifstream la("/proc/loadavg");
    std::string l1;
    if (la >> l1)
      std::printf("load average at start: %s (on %d hardware threads)\n", l1.c_str(), all);
  }
  std::printf("%-26s %-22s %7s %10s %10s %-7s %6s\n", "kernel", "shape", "threads", "ours",
              "anchor", "unit", "ratio");
  for (int t : thread_counts) {
    set_num_threads(t);
    bench.threads = t;
    bench.run_all();
  }
  set_num_threads(all);
  if (!opt.json.empty()) {
    write_json(opt.json, bench.rows);
    std::printf("wrote %s\n", opt.json.c_str());
  }
  return 0;
}

}  // namespace mammoth::tools
