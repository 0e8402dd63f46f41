// GPU benchmark of Mammoth's CUDA kernels: GEMM TFLOP/s (cuBLASLt; f32, tf32, bf16, f16),
// attention forward/backward TFLOP/s, layer_norm and AdamW GB/s. Timed with CUDA events after
// warm-up. gpu_bench.py runs this binary and measures PyTorch's kernels on the same shapes in
// the same run, then prints the ratios (see tools/gpu_check.sh).
//
//   gpu_bench [--json] [--quick]
//
// Output: one line per figure, "name value unit", or (--json) one JSON object per line:
//   {"name": "gemm_bf16_4096x4096x4096", "value": 612.3, "unit": "TFLOP/s"}
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/optim.h"
#include "kernels/params.h"
#include "kernels/registry.h"
#include "memory/cuda/caching_allocator.h"
#include "memory/cuda/cuda_check.h"
#include "memory/cuda/device.h"

namespace mammoth::bench {
namespace {

using kernels::Kernel;
using kernels::TensorArg;
using memory::cuda::DeviceBuffer;

bool g_json = false;

void report(const std::string& name, double value, const char* unit) {
  if (g_json) {
    std::printf("{\"name\": \"%s\", \"value\": %.4f, \"unit\": \"%s\"}\n", name.c_str(), value,
                unit);
  } else {
    std::printf("%-44s %12.2f %s\n", name.c_str(), value, unit);
  }
  std::fflush(stdout);
}

// Milliseconds per call of fn: `warmup` untimed calls, then `iters` timed back to back.
double time_ms(const std::function<void()>& fn, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) fn();
  memory::cuda::Event start(true), stop(true);
  start.record(memory::cuda::current_stream());
  for (int i = 0; i < iters; ++i) fn();
  stop.record(memory::cuda::current_stream());
  stop.synchronize();
  return stop.elapsed_ms(start) / iters;
}

// A device buffer of n elements of t with values from N(0, scale).
DeviceBuffer random_buffer(int64_t n, DType t, double scale, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, static_cast<float>(scale));
  std::vector<char> host(n * dtype_size(t));
  for (int64_t i = 0; i < n; ++i) {
    const float v = d(g);
    if (t == DType::kF32) std::memcpy(host.data() + 4 * i, &v, 4);
    if (t == DType::kBF16) {
      const bf16 h = float_to_bf16(v);
      std::memcpy(host.data() + 2 * i, &h, 2);
    }
    if (t == DType::kF16) {
      const f16 h = float_to_f16(v);
      std::memcpy(host.data() + 2 * i, &h, 2);
    }
  }
  DeviceBuffer b(host.size());
  CUDA_CHECK(cudaMemcpy(b.get(), host.data(), host.size(), cudaMemcpyHostToDevice));
  return b;
}

TensorArg arg(const DeviceBuffer& b, DType t, std::vector<int64_t> shape) {
  TensorArg a;
  a.data = b.get();
  a.dtype = t;
  a.ndim = static_cast<int>(shape.size());
  int64_t s = 1;
  for (int i = a.ndim - 1; i >= 0; --i) {
    a.shape[i] = shape[i];
    a.strides[i] = s;
    s *= shape[i];
  }
  return a;
}

void bench_gemm(bool quick) {
  struct G {
    DType t;
    bool tf32;
    int64_t M, N, K;
    const char* tag;
  };
  const int64_t S = quick ? 2048 : 4096;
  const std::vector<G> cases = {
      {DType::kBF16, false, S, S, S, "bf16"},         {DType::kF16, false, S, S, S, "f16"},
      {DType::kF32, true, S, S, S, "tf32"},           {DType::kF32, false, S, S, S, "f32"},
      {DType::kBF16, false, 8192, 3072, 768, "bf16"},  // GPT-2 MLP up-projection, 8k tokens
  };
  for (const G& c : cases) {
    DeviceBuffer a = random_buffer(c.M * c.K, c.t, 1.0, 1),
                 b = random_buffer(c.K * c.N, c.t, 1.0, 2);
    DeviceBuffer out(c.M * c.N * dtype_size(c.t));
    kernels::cuda::set_allow_tf32(c.tf32);
    kernels::cuda::GemmArgs g;
    g.dtype = c.t;
    g.M = c.M;
    g.N = c.N;
    g.K = c.K;
    g.A = a.get();
    g.lda = c.K;
    g.B = b.get();
    g.ldb = c.N;
    g.C = out.get();
    g.ldc = c.N;
    const double ms = time_ms([&] { kernels::cuda::gemm(g); }, 3, quick ? 5 : 20);
    kernels::cuda::set_allow_tf32(false);
    report("gemm_" + std::string(c.tag) + "_" + std::to_string(c.M) + "x" + std::to_string(c.N) +
               "x" + std::to_string(c.K),
           2.0 * c.M * c.N * c.K / (ms * 1e-3) / 1e12, "TFLOP/s");
  }
}

void bench_attention(bool quick) {
  struct A {
    int64_t B, H, T, D;
    bool causal;
  };
  const std::vector<A> cases = {
      {4, 16, 2048, 64, true}, {4, 16, 2048, 128, true}, {4, 16, 2048, 128, false}};
  for (const A& c : cases) {
    const DType t = DType::kBF16;
    const int64_t n = c.B * c.H * c.T * c.D;
    DeviceBuffer q = random_buffer(n, t, 1.0, 3), k = random_buffer(n, t, 1.0, 4),
                 v = random_buffer(n, t, 1.0, 5), o(n * 2), dout = random_buffer(n, t, 1.0, 6),
                 lse(c.B * c.H * c.T * 4), dq(n * 2), dk(n * 2), dv(n * 2);
    const std::vector<int64_t> shp = {c.B, c.H, c.T, c.D};
    kernels::AttentionParams p{0.0, c.causal, false};
    const std::vector<TensorArg> fin = {arg(q, t, shp), arg(k, t, shp), arg(v, t, shp)};
    const std::vector<TensorArg> fout = {arg(o, t, shp), arg(lse, DType::kF32, {c.B, c.H, c.T})};
    const kernels::KernelFn fwd =
        kernels::Registry::instance().get(Kernel::attention, DeviceType::kCUDA, t);
    const kernels::KernelFn bwd =
        kernels::Registry::instance().get(Kernel::attention_backward, DeviceType::kCUDA, t);
    // FLOPs as FlashAttention counts them: 4*B*H*T*T*D forward (halved when causal), 2.5x backward.
    const double flops = 4.0 * c.B * c.H * c.T * c.T * c.D / (c.causal ? 2.0 : 1.0);
    const std::string tag = "attn_bf16_B" + std::to_string(c.B) + "_H" + std::to_string(c.H) +
                            "_T" + std::to_string(c.T) + "_D" + std::to_string(c.D) +
                            (c.causal ? "_causal" : "");
    const double fms = time_ms([&] { fwd(fin, fout, &p); }, 2, quick ? 3 : 10);
    report(tag + "_fwd", flops / (fms * 1e-3) / 1e12, "TFLOP/s");
    const std::vector<TensorArg> bin = {arg(dout, t, shp), fin[0], fin[1], fin[2],
                                        fout[0],           fout[1]};
    const std::vector<TensorArg> bout = {arg(dq, t, shp), arg(dk, t, shp), arg(dv, t, shp)};
    const double bms = time_ms([&] { bwd(bin, bout, &p); }, 1, quick ? 1 : 3);
    report(tag + "_bwd", 2.5 * flops / (bms * 1e-3) / 1e12, "TFLOP/s");
  }
}

void bench_layer_norm(bool quick) {
  for (DType t : {DType::kBF16, DType::kF32}) {
    const int64_t M = quick ? 4096 : 16384, N = 4096;
    DeviceBuffer x = random_buffer(M * N, t, 1.0, 7), w = random_buffer(N, t, 1.0, 8),
                 b = random_buffer(N, t, 1.0, 9), y(M * N * dtype_size(t)), mean(M * 4),
                 rstd(M * 4);
    const std::vector<TensorArg> in = {arg(x, t, {M, N}), arg(w, t, {N}), arg(b, t, {N})};
    const std::vector<TensorArg> out = {arg(y, t, {M, N}), arg(mean, DType::kF32, {M}),
                                        arg(rstd, DType::kF32, {M})};
    kernels::NormParams p{1e-5};
    const kernels::KernelFn fn =
        kernels::Registry::instance().get(Kernel::layer_norm, DeviceType::kCUDA, t);
    const double ms = time_ms([&] { fn(in, out, &p); }, 3, 20);
    const double bytes = 2.0 * M * N * dtype_size(t);  // read x, write y
    report(std::string("layer_norm_fwd_") + dtype_name(t) + "_" + std::to_string(M) + "x" +
               std::to_string(N),
           bytes / (ms * 1e-3) / 1e9, "GB/s");
  }
}

void bench_adamw(bool quick) {
  // 64 tensors, ~100M parameters in all (quick: ~25M).
  const int64_t per = quick ? 400000 : 1600000;
  const int count = 64;
  std::vector<DeviceBuffer> bufs;
  std::vector<kernels::cuda::AdamWTensor> ts;
  int64_t total = 0;
  for (int i = 0; i < count; ++i) {
    const int64_t n = per + 1024 * i;
    for (int k = 0; k < 4; ++k) {
      bufs.emplace_back(n * 4);
      CUDA_CHECK(cudaMemsetAsync(bufs.back().get(), 0, n * 4, memory::cuda::current_stream()));
    }
    const size_t b = bufs.size() - 4;
    ts.push_back({bufs[b].as<float>(), bufs[b + 1].as<float>(), bufs[b + 2].as<float>(),
                  bufs[b + 3].as<float>(), n});
    total += n;
  }
  kernels::AdamWParams p{1e-3, 0.9, 0.999, 1e-8, 0.01, 1, 1.0};
  const double ms = time_ms([&] { kernels::cuda::adamw_multi_tensor(ts, p); }, 3, 20);
  const double bytes = 7.0 * 4.0 * total;  // read p, g, m, v; write p, m, v
  report("adamw_f32_" + std::to_string(total) + "_params_" + std::to_string(count) + "_tensors",
         bytes / (ms * 1e-3) / 1e9, "GB/s");
}

int run(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0)
      g_json = true;
    else if (std::strcmp(argv[i], "--quick") == 0)
      quick = true;
    else {
      std::fprintf(stderr, "[gpu_bench] unknown option %s (use --json, --quick)\n", argv[i]);
      return 2;
    }
  }
  std::string reason;
  if (!memory::cuda::cuda_available(&reason)) {
    std::fprintf(stderr, "[gpu_bench] no CUDA device (%s)\n", reason.c_str());
    return 1;
  }
  memory::cuda::select_device();
  kernels::Registry& r = kernels::Registry::instance();
  if (r.find(Kernel::attention, DeviceType::kCUDA, DType::kBF16) == nullptr) {
    kernels::cuda::register_kernels(r);
  }
  bench_gemm(quick);
  bench_layer_norm(quick);
  bench_adamw(quick);
  bench_attention(quick);
  return 0;
}

}  // namespace
}  // namespace mammoth::bench

int main(int argc, char** argv) {
  try {
    return mammoth::bench::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[gpu_bench] %s\n", e.what());
    return 1;
  }
}
