// CUDA-vs-CPU kernel tests: for every kernel in kernels/op_list.h, the CUDA kernel and the CPU
// kernel (the reference) run on the same random inputs of awkward sizes (odd extents, broadcast
// and transposed operands, duplicate indices, masked rows) and must agree within per-dtype
// tolerances. bf16/f16 inputs are rounded to the dtype first and the CPU computes on those
// values in f32, so the tolerance covers only the CUDA kernel's own rounding.
//
// Needs a GPU: without one the binary prints "no CUDA device (...)" and exits with status 1
// (it is tagged "gpu"; tools/gpu_check.sh runs it on a lent machine). Run with no arguments it
// also fails if some kernel in the inventory has no test case here.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <set>
#include <sstream>
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
#include "memory/cuda/pinned_allocator.h"
#include "test/testing/catch_args.h"

namespace mammoth::kernels {
namespace {

using Shape = std::vector<int64_t>;
std::set<int> g_tested;

// ---- host encoding of values ----------------------------------------------------------------
void encode(double v, DType t, char* dst) {
  switch (t) {
    case DType::kF32: {
      const float f = static_cast<float>(v);
      std::memcpy(dst, &f, 4);
      return;
    }
    case DType::kF64:
      std::memcpy(dst, &v, 8);
      return;
    case DType::kBF16: {
      const bf16 h = float_to_bf16(static_cast<float>(v));
      std::memcpy(dst, &h, 2);
      return;
    }
    case DType::kF16: {
      const f16 h = float_to_f16(static_cast<float>(v));
      std::memcpy(dst, &h, 2);
      return;
    }
    case DType::kI32: {
      const int32_t i = static_cast<int32_t>(v);
      std::memcpy(dst, &i, 4);
      return;
    }
    case DType::kI64: {
      const int64_t i = static_cast<int64_t>(v);
      std::memcpy(dst, &i, 8);
      return;
    }
    case DType::kU8: {
      const uint8_t i = static_cast<uint8_t>(v);
      std::memcpy(dst, &i, 1);
      return;
    }
    case DType::kBool: {
      const bool b = v != 0.0;
      std::memcpy(dst, &b, 1);
      return;
    }
  }
}

double decode(const char* src, DType t) {
  switch (t) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, src, 4);
      return f;
    }
    case DType::kF64: {
      double d;
      std::memcpy(&d, src, 8);
      return d;
    }
    case DType::kBF16: {
      bf16 h;
      std::memcpy(&h, src, 2);
      return bf16_to_float(h);
    }
    case DType::kF16: {
      f16 h;
      std::memcpy(&h, src, 2);
      return f16_to_float(h);
    }
    case DType::kI32: {
      int32_t i;
      std::memcpy(&i, src, 4);
      return i;
    }
    case DType::kI64: {
      int64_t i;
      std::memcpy(&i, src, 8);
      return static_cast<double>(i);
    }
    case DType::kU8: {
      uint8_t i;
      std::memcpy(&i, src, 1);
      return i;
    }
    case DType::kBool: {
      bool b;
      std::memcpy(&b, src, 1);
      return b ? 1.0 : 0.0;
    }
  }
  return 0.0;
}

double quantize(double v, DType t) {
  char buf[8];
  encode(v, t, buf);
  return decode(buf, t);
}

// ---- test arguments -------------------------------------------------------------------------
struct Arg {
  Shape shape;
  std::vector<double> values;  // the whole storage
  Shape strides;               // empty: contiguous
  bool follows = true;         // a float buffer in the dtype under test (f32 on the CPU side)
  DType dtype = DType::kF32;   // when !follows
  bool compare = false;        // inputs updated in place (optimizers) are compared too
};

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::mt19937_64& rng() {
  static std::mt19937_64 g(20240607);
  return g;
}

std::vector<double> randn(int64_t n, double scale = 1.0) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng());
  return v;
}
std::vector<double> uniform(int64_t n, double lo, double hi) {
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = d(rng());
  return v;
}
std::vector<double> ints(int64_t n, int64_t lo, int64_t hi) {  // [lo, hi)
  std::uniform_int_distribution<int64_t> d(lo, hi - 1);
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<double>(d(rng()));
  return v;
}

Arg F(Shape shape, std::vector<double> values) { return {shape, std::move(values)}; }
Arg Fr(Shape shape, double scale = 1.0) {
  const int64_t n = numel(shape);
  return {shape, randn(n, scale)};
}
Arg Fixed(DType t, Shape shape, std::vector<double> values) {
  Arg a{shape, std::move(values)};
  a.follows = false;
  a.dtype = t;
  return a;
}
Arg Out(Shape shape) { return {shape, std::vector<double>(numel(shape), 0.0)}; }
Arg OutFixed(DType t, Shape shape) {
  return Fixed(t, shape, std::vector<double>(numel(shape), 0.0));
}
// A view with explicit strides over `storage` elements of random values.
Arg Strided(Shape shape, Shape strides, int64_t storage) {
  Arg a{shape, randn(storage)};
  a.strides = strides;
  return a;
}

DType dtype_of(const Arg& a, DType t) { return a.follows ? t : a.dtype; }

Shape contiguous(const Shape& s) {
  Shape st(s.size());
  int64_t e = 1;
  for (int i = static_cast<int>(s.size()) - 1; i >= 0; --i) {
    st[i] = e;
    e *= s[i];
  }
  return st;
}

TensorArg make_arg(const Arg& a, DType t, void* data) {
  TensorArg r;
  r.data = data;
  r.dtype = dtype_of(a, t);
  r.ndim = static_cast<int>(a.shape.size());
  const Shape st = a.strides.empty() ? contiguous(a.shape) : a.strides;
  for (int i = 0; i < r.ndim; ++i) {
    r.shape[i] = a.shape[i];
    r.strides[i] = st[i];
  }
  return r;
}

std::vector<char> host_bytes(const Arg& a, DType t) {
  const DType dt = dtype_of(a, t);
  std::vector<char> b(std::max<size_t>(1, a.values.size()) * dtype_size(dt));
  for (size_t i = 0; i < a.values.size(); ++i)
    encode(a.values[i], dt, b.data() + i * dtype_size(dt));
  return b;
}

std::vector<double> decode_all(const std::vector<char>& b, size_t n, DType t) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = decode(b.data() + i * dtype_size(t), t);
  return v;
}

// Runs kernel k on `dev` with float buffers in `t`. Returns the storage of every output, then of
// every input marked compare.
std::vector<std::vector<double>> run(Kernel k, DeviceType dev, DType t, const std::vector<Arg>& in,
                                     const std::vector<Arg>& out, const void* params) {
  std::vector<const Arg*> all;
  for (const Arg& a : in) all.push_back(&a);
  for (const Arg& a : out) all.push_back(&a);
  std::vector<std::vector<char>> host;
  for (const Arg* a : all) host.push_back(host_bytes(*a, t));
  std::vector<memory::cuda::DeviceBuffer> device;
  std::vector<void*> ptrs;
  for (auto& h : host) {
    if (dev == DeviceType::kCPU) {
      ptrs.push_back(h.data());
    } else {
      device.emplace_back(h.size());
      CUDA_CHECK(cudaMemcpy(device.back().get(), h.data(), h.size(), cudaMemcpyHostToDevice));
      ptrs.push_back(device.back().get());
    }
  }
  std::vector<TensorArg> ins, outs;
  for (size_t i = 0; i < in.size(); ++i) ins.push_back(make_arg(in[i], t, ptrs[i]));
  for (size_t i = 0; i < out.size(); ++i) outs.push_back(make_arg(out[i], t, ptrs[in.size() + i]));
  const DType key = (k == Kernel::copy || k == Kernel::fill) ? outs[0].dtype : ins[0].dtype;
  const KernelFn fn = Registry::instance().find(k, dev, key);
  if (fn == nullptr) {
    FAIL("no " << (dev == DeviceType::kCPU ? "cpu" : "cuda") << " kernel " << kernel_name(k)
               << " for " << dtype_name(key));
  }
  fn(ins, outs, params);
  if (dev == DeviceType::kCUDA) {
    CUDA_CHECK(cudaDeviceSynchronize());
    for (size_t i = 0; i < host.size(); ++i) {
      CUDA_CHECK(cudaMemcpy(host[i].data(), ptrs[i], host[i].size(), cudaMemcpyDeviceToHost));
    }
  }
  std::vector<std::vector<double>> result;
  for (size_t i = 0; i < out.size(); ++i) {
    const size_t j = in.size() + i;
    result.push_back(decode_all(host[j], all[j]->values.size(), dtype_of(*all[j], t)));
  }
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].compare)
      result.push_back(decode_all(host[i], in[i].values.size(), dtype_of(in[i], t)));
  }
  return result;
}

struct Tolerance {
  double atol, rtol;
};

Tolerance tolerance(DType t, double scale) {
  switch (t) {
    case DType::kBF16:
      return {1e-2 * scale, 1.6e-2 * scale};
    case DType::kF16:
      return {2e-3 * scale, 2e-3 * scale};
    default:
      return {2e-5 * scale, 1e-4 * scale};
  }
}

struct Case {
  std::string name;
  Kernel kernel;
  std::vector<Arg> in, out;
  const void* params = nullptr;
  double tol_scale = 1.0;
  std::vector<DType> dtypes = {DType::kF32, DType::kBF16, DType::kF16};
  // Called with the dtype and the (already rounded) inputs: fills inputs that depend on others.
  std::function<void(DType, std::vector<Arg>&)> prepare;
};

void check(const Case& c) {
  g_tested.insert(static_cast<int>(c.kernel));
  for (DType t : c.dtypes) {
    INFO(c.name << " [" << kernel_name(c.kernel) << ", " << dtype_name(t) << "]");
    std::vector<Arg> in = c.in, out = c.out;
    for (auto* v : {&in, &out}) {
      for (Arg& a : *v) {
        for (double& x : a.values) x = quantize(x, dtype_of(a, t));
      }
    }
    if (c.prepare) c.prepare(t, in);
    const auto want = run(c.kernel, DeviceType::kCPU, DType::kF32, in, out, c.params);
    const auto got = run(c.kernel, DeviceType::kCUDA, t, in, out, c.params);
    REQUIRE(want.size() == got.size());
    std::vector<const Arg*> compared;
    for (const Arg& a : out) compared.push_back(&a);
    for (const Arg& a : in) {
      if (a.compare) compared.push_back(&a);
    }
    for (size_t o = 0; o < want.size(); ++o) {
      const DType dt = dtype_of(*compared[o], t);
      const bool exact = !is_floating(dt) || c.tol_scale == 0.0;
      const Tolerance tol = tolerance(dt, c.tol_scale);
      int64_t bad = 0;
      std::ostringstream first;
      for (size_t i = 0; i < want[o].size(); ++i) {
        const double w = want[o][i], g = got[o][i];
        bool ok;
        if (std::isnan(w) || std::isnan(g)) {
          ok = std::isnan(w) && std::isnan(g);
        } else if (std::isinf(w) || std::isinf(g)) {
          ok = w == g;
        } else {
          ok = exact ? w == g : std::fabs(g - w) <= tol.atol + tol.rtol * std::fabs(w);
        }
        if (!ok && bad++ < 5) first << "  [" << i << "] cuda " << g << " cpu " << w << "\n";
      }
      INFO("output " << o << ": " << bad << " of " << want[o].size() << " elements differ\n"
                     << first.str());
      CHECK(bad == 0);
    }
  }
}

// ---- elementwise ----------------------------------------------------------------------------
TEST_CASE("binary ops: contiguous, broadcast and transposed operands") {
  for (Kernel k : {Kernel::add, Kernel::sub, Kernel::mul, Kernel::div}) {
    auto denom = [&](int64_t n) {
      std::vector<double> v = uniform(n, 0.5, 2.0);
      for (size_t i = 0; i < v.size(); i += 2) v[i] = -v[i];
      return v;
    };
    check({"contiguous", k, {Fr({1001}), F({1001}, denom(1001))}, {Out({1001})}});
    Arg b = F({3, 5, 7}, denom(5));
    b.strides = {0, 1, 0};  // [1, 5, 1] expanded
    check({"broadcast", k, {Fr({3, 5, 7}), b}, {Out({3, 5, 7})}});
    Arg a = Strided({5, 9}, {1, 5}, 45);  // a transposed [9, 5]
    Arg b2 = F({5, 9}, denom(9));
    b2.strides = {0, 1};
    check({"transposed", k, {a, b2}, {Out({5, 9})}});
  }
}

TEST_CASE("where") {
  Arg c = Fixed(DType::kBool, {3, 4, 7}, ints(21, 0, 2));
  c.strides = {7, 0, 1};  // [3, 1, 7] expanded
  Arg b = Fr({7});
  b.shape = {3, 4, 7};
  b.strides = {0, 0, 1};
  check({"where", Kernel::where, {c, Fr({3, 4, 7}), b}, {Out({3, 4, 7})}});
}

TEST_CASE("unary ops") {
  struct U {
    Kernel k;
    double lo, hi;
  };
  for (U u : {U{Kernel::neg, -3, 3}, U{Kernel::exp, -3, 3}, U{Kernel::log, 0.1, 5},
              U{Kernel::sqrt, 0.1, 5}, U{Kernel::rsqrt, 0.1, 5}, U{Kernel::tanh, -3, 3},
              U{Kernel::relu, -3, 3}, U{Kernel::gelu, -4, 4}, U{Kernel::gelu_tanh, -4, 4},
              U{Kernel::silu, -4, 4}}) {
    check({"contiguous", u.k, {F({1037}, uniform(1037, u.lo, u.hi))}, {Out({1037})}});
    Arg x = F({9, 5}, uniform(45, u.lo, u.hi));
    x.strides = {1, 9};
    check({"transposed", u.k, {x}, {Out({9, 5})}});
  }
}

TEST_CASE("scalar ops") {
  ScalarParams add{0.75}, mul{-1.5}, pw{2.5};
  check({"add_scalar", Kernel::add_scalar, {Fr({333})}, {Out({333})}, &add});
  check({"mul_scalar", Kernel::mul_scalar, {Fr({333})}, {Out({333})}, &mul});
  check(
      {"pow_scalar", Kernel::pow_scalar, {F({333}, uniform(333, 0.1, 3))}, {Out({333})}, &pw, 2.0});
}

TEST_CASE("activation backwards") {
  for (Kernel k : {Kernel::relu_backward, Kernel::gelu_backward, Kernel::gelu_tanh_backward,
                   Kernel::silu_backward}) {
    check({"backward", k, {Fr({777}), F({777}, uniform(777, -4, 4))}, {Out({777})}});
  }
}

TEST_CASE("copy and cast between dtypes, strided") {
  g_tested.insert(static_cast<int>(Kernel::copy));
  const DType all[] = {DType::kF32, DType::kF64, DType::kBF16, DType::kF16,
                       DType::kI32, DType::kI64, DType::kU8,   DType::kBool};
  for (DType from : all) {
    for (DType to : all) {
      INFO("copy " << dtype_name(from) << " -> " << dtype_name(to));
      std::vector<double> v = is_floating(from) ? uniform(60, -100, 100) : ints(60, 0, 200);
      if (from == DType::kBool) v = ints(60, 0, 2);
      if (!is_floating(to) && to != DType::kBool) {
        for (double& x : v) x = std::fabs(x);  // negative floats -> unsigned is undefined
      }
      Arg x = Fixed(from, {6, 10}, v);
      x.strides = {1, 6};  // transposed view
      Case c{"copy", Kernel::copy, {x}, {OutFixed(to, {6, 10})}, nullptr, 0.0, {DType::kF32}};
      check(c);
      Case same{"copy contiguous", Kernel::copy, {Fixed(from, {60}, v)}, {OutFixed(to, {60})},
                nullptr,           0.0,          {DType::kF32}};
      check(same);
    }
  }
}

TEST_CASE("fill every dtype") {
  g_tested.insert(static_cast<int>(Kernel::fill));
  ScalarParams p{2.5};
  for (DType t : kAllDTypes) {
    INFO("fill " << dtype_name(t));
    Arg y = OutFixed(t, {5, 7});
    y.values.assign(70, 0.0);
    y.strides = {14, 2};  // every other element: the gaps must stay untouched
    check({"fill", Kernel::fill, {}, {y}, &p, 0.0, {DType::kF32}});
  }
}

// ---- reductions -----------------------------------------------------------------------------
TEST_CASE("sum_last, sum_sq_last, sum_rows and max_last") {
  check({"sum_last", Kernel::sum_last, {Fr({37, 129})}, {Out({37})}, nullptr, 4.0});
  check({"sum_last long rows", Kernel::sum_last, {Fr({3, 5000})}, {Out({3})}, nullptr, 30.0});
  check({"sum_sq_last", Kernel::sum_sq_last, {Fr({37, 129})}, {Out({37})}, nullptr, 4.0});
  check({"sum_sq_last long rows", Kernel::sum_sq_last, {Fr({3, 5000})}, {Out({3})}, nullptr, 30.0});
  check({"sum_rows", Kernel::sum_rows, {Fr({37, 129})}, {Out({129})}, nullptr, 4.0});
  check({"sum_rows many rows", Kernel::sum_rows, {Fr({3000, 5})}, {Out({5})}, nullptr, 30.0});
  // Few rows much longer than a block's chunk take the split path (chunks, then partials).
  check({"sum_last split rows", Kernel::sum_last, {Fr({2, 300007})}, {Out({2})}, nullptr, 30.0});
  // Scaled so that the sum of squares (~18750) fits f16.
  check({"sum_sq_last split row",
         Kernel::sum_sq_last,
         {Fr({1, 300007}, 0.25)},
         {Out({1})},
         nullptr,
         30.0});
  check({"max_last", Kernel::max_last, {Fr({37, 129})}, {Out({37}), OutFixed(DType::kI64, {37})}});
  check({"max_last ties",
         Kernel::max_last,
         {F({4, 9}, ints(36, 0, 3))},
         {Out({4}), OutFixed(DType::kI64, {4})}});
}

// ---- matmul ---------------------------------------------------------------------------------
// Every layout also under autocast: f32 operands rounded to bf16 / f16 and multiplied with fp32
// accumulation, as the CPU kernel does (bf16 GEMM / fp16-valued inputs): the same rounded
// products summed in another order, so f32 tolerances hold, while skipping the rounding would be
// off by ~1e-3 relative.
TEST_CASE("matmul: transposes from strides, batch broadcast, accumulate, autocast") {
  const int64_t B = 3, M = 37, K = 61, N = 45;
  const double s = 3.0;  // K-term sums
  for (MatmulCompute compute :
       {MatmulCompute::kNative, MatmulCompute::kBF16, MatmulCompute::kF16}) {
    INFO("compute " << static_cast<int>(compute));
    MatmulParams plain, acc{0.5, 1.0, compute};
    plain.compute = compute;
    check({"nn", Kernel::matmul, {Fr({B, M, K}), Fr({B, K, N})}, {Out({B, M, N})}, &plain, s});
    check({"tn",
           Kernel::matmul,
           {Strided({B, M, K}, {M * K, 1, M}, B * M * K), Fr({B, K, N})},
           {Out({B, M, N})},
           &plain,
           s});
    check({"nt",
           Kernel::matmul,
           {Fr({B, M, K}), Strided({B, K, N}, {K * N, 1, K}, B * K * N)},
           {Out({B, M, N})},
           &plain,
           s});
    check({"tt broadcast b",
           Kernel::matmul,
           {Strided({B, M, K}, {M * K, 1, M}, B * M * K), Strided({B, K, N}, {0, 1, K}, K * N)},
           {Out({B, M, N})},
           &plain,
           s});
    Arg c = Fr({B, M, N});
    check({"accumulate", Kernel::matmul, {Fr({B, M, K}), Fr({B, K, N})}, {c}, &acc, s});
    check({"vector", Kernel::matmul, {Fr({1, 1, K}), Fr({1, K, 1})}, {Out({1, 1, 1})}, &plain, s});
  }
}

TEST_CASE("gemm epilogues: bias and GELU") {
  // Against the CPU: matmul, then + bias, then gelu_tanh, composed from CPU kernels.
  const int64_t M = 33, K = 48, N = 40;
  for (cuda::Epilogue e :
       {cuda::Epilogue::kBias, cuda::Epilogue::kGeluTanh, cuda::Epilogue::kBiasGeluTanh}) {
    std::vector<double> a = randn(M * K), b = randn(K * N), bias = randn(N);
    std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end()),
        biasf(bias.begin(), bias.end());
    std::vector<float> want(M * N);
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += a[m * K + k] * b[k * N + n];
        if (e != cuda::Epilogue::kGeluTanh) s += bias[n];
        if (e != cuda::Epilogue::kBias) {
          s = 0.5 * s * (1 + std::tanh(0.7978845608028654 * (s + 0.044715 * s * s * s)));
        }
        want[m * N + n] = static_cast<float>(s);
      }
    }
    memory::cuda::DeviceBuffer da(af.size() * 4), db(bf.size() * 4), dbias(N * 4), dc(M * N * 4);
    CUDA_CHECK(cudaMemcpy(da.get(), af.data(), af.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(db.get(), bf.data(), bf.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dbias.get(), biasf.data(), N * 4, cudaMemcpyHostToDevice));
    cuda::GemmArgs g;
    g.dtype = DType::kF32;
    g.M = M;
    g.N = N;
    g.K = K;
    g.A = da.get();
    g.lda = K;
    g.B = db.get();
    g.ldb = N;
    g.C = dc.get();
    g.ldc = N;
    g.epilogue = e;
    g.bias = dbias.get();
    cuda::gemm(g);
    std::vector<float> got(M * N);
    CUDA_CHECK(cudaMemcpy(got.data(), dc.get(), got.size() * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
      bad += std::fabs(got[i] - want[i]) > 1e-3 + 1e-3 * std::fabs(want[i]);
    INFO("epilogue " << static_cast<int>(e) << ": " << bad << " elements differ");
    CHECK(bad == 0);
  }
}

// ---- softmax, norms, cross-entropy --------------------------------------------------------
TEST_CASE("softmax family") {
  check({"softmax", Kernel::softmax, {Fr({33, 257}, 3.0)}, {Out({33, 257})}});
  check({"log_softmax", Kernel::log_softmax, {Fr({33, 257}, 3.0)}, {Out({33, 257})}, nullptr, 2.0});
  check({"softmax_backward",
         Kernel::softmax_backward,
         {Fr({33, 257}), F({33, 257}, uniform(33 * 257, 0, 1))},
         {Out({33, 257})},
         nullptr,
         4.0});
  check({"log_softmax_backward",
         Kernel::log_softmax_backward,
         {Fr({33, 257}), F({33, 257}, uniform(33 * 257, -6, 0))},
         {Out({33, 257})},
         nullptr,
         8.0});
}

TEST_CASE("layer_norm and rms_norm, forward and backward") {
  static NormParams p{1e-5};
  for (int64_t N : {300, 9001}) {  // register-cached rows and long rows
    const int64_t M = N > 8192 ? 3 : 45;
    INFO("N = " << N);
    check({"layer_norm",
           Kernel::layer_norm,
           {F({M, N}, uniform(M * N, -2, 4)), Fr({N}), Fr({N})},
           {Out({M, N}), Out({M}), Out({M})},
           &p,
           2.0});
    check({"rms_norm",
           Kernel::rms_norm,
           {F({M, N}, uniform(M * N, -2, 4)), Fr({N})},
           {Out({M, N}), Out({M})},
           &p,
           2.0});
  }
  const int64_t M = 301, N = 70;  // many row blocks for the weight gradients
  check({"layer_norm_backward",
         Kernel::layer_norm_backward,
         {Fr({M, N}), Fr({M, N}), Fr({N}), Fr({M}, 0.5), F({M}, uniform(M, 0.5, 2))},
         {Out({M, N}), Out({N}), Out({N})},
         &p,
         20.0});
  check({"rms_norm_backward",
         Kernel::rms_norm_backward,
         {Fr({M, N}), Fr({M, N}), Fr({N}), F({M}, uniform(M, 0.5, 2))},
         {Out({M, N}), Out({N})},
         &p,
         20.0});
}

std::vector<double> targets(int64_t M, int64_t V) {
  std::vector<double> t = ints(M, 0, V);
  for (int64_t i = 3; i < M; i += 7) t[i] = -100;  // ignore_index rows
  return t;
}

TEST_CASE("cross_entropy forward and backward") {
  const int64_t M = 37, V = 1003;
  static CrossEntropyParams plain, smooth{-100, 0.1};
  for (const CrossEntropyParams* p : {&plain, &smooth}) {
    const std::vector<double> t = targets(M, V);
    check({"cross_entropy",
           Kernel::cross_entropy,
           {Fr({M, V}, 3.0), Fixed(DType::kI64, {M}, t)},
           {Out({M}), Out({M})},
           p,
           4.0});
    Case bw{"cross_entropy_backward",
            Kernel::cross_entropy_backward,
            {Fr({M}), Fr({M, V}, 3.0), Fixed(DType::kI64, {M}, t), Out({M})},
            {Out({M, V})},
            p};
    bw.prepare = [M, V](DType dt, std::vector<Arg>& in) {
      for (int64_t m = 0; m < M; ++m) {  // the rows' real log-sum-exp
        double mx = -1e300, s = 0;
        for (int64_t v = 0; v < V; ++v) mx = std::max(mx, in[1].values[m * V + v]);
        for (int64_t v = 0; v < V; ++v) s += std::exp(in[1].values[m * V + v] - mx);
        in[3].values[m] = quantize(mx + std::log(s), dt);
      }
    };
    check(bw);
  }
}

TEST_CASE("cross_entropy reports an out-of-range target") {
  const int64_t M = 5, V = 11;
  CrossEntropyParams p;
  std::vector<double> t = ints(M, 0, V);
  t[3] = V;  // bad
  Arg logits = Fr({M, V});
  Arg target = Fixed(DType::kI64, {M}, t);
  CHECK_THROWS_WITH(run(Kernel::cross_entropy, DeviceType::kCUDA, DType::kF32, {logits, target},
                        {Out({M}), Out({M})}, &p),
                    Catch::Contains("target 11 at row 3"));
}

// ---- indexing -------------------------------------------------------------------------------
TEST_CASE("index_select, index_add (duplicates), gather, scatter_add") {
  check({"index_select",
         Kernel::index_select,
         {Fr({2, 50, 33}), Fixed(DType::kI64, {70}, ints(70, 0, 50))},
         {Out({2, 70, 33})}});
  Arg dx = Fr({2, 50, 33});  // accumulates into existing values
  check({"index_add",
         Kernel::index_add,
         {Fr({2, 70, 33}), Fixed(DType::kI64, {70}, ints(70, 0, 10))},
         {dx},
         nullptr,
         4.0});
  Arg emb = Fr({1, 1000, 65});
  check({"index_add embedding",
         Kernel::index_add,
         {Fr({1, 4099, 65}), Fixed(DType::kI64, {4099}, ints(4099, 0, 1000))},
         {emb},
         nullptr,
         4.0});
  check({"gather",
         Kernel::gather,
         {Fr({3, 20, 17}), Fixed(DType::kI64, {3, 11, 17}, ints(3 * 11 * 17, 0, 20))},
         {Out({3, 11, 17})}});
  Arg sx = Fr({3, 20, 17});
  check({"scatter_add",
         Kernel::scatter_add,
         {Fr({3, 11, 17}), Fixed(DType::kI64, {3, 11, 17}, ints(3 * 11 * 17, 0, 20))},
         {sx},
         nullptr,
         2.0});
  CHECK_THROWS_WITH(
      run(Kernel::index_select, DeviceType::kCUDA, DType::kF32,
          {Fr({1, 5, 3}), Fixed(DType::kI64, {2}, {1, 5})}, {Out({1, 2, 3})}, nullptr),
      Catch::Contains("index 5"));
}

// ---- mixture of experts ------------------------------------------------------------------------
TEST_CASE("grouped_matmul (an empty expert), moe_combine (duplicate and absent tokens)") {
  const Arg offsets = Fixed(DType::kI64, {5}, {0, 7, 7, 30, 40});
  std::vector<Arg> in = {Fr({40, 24}), offsets};
  for (int e = 0; e < 4; ++e) in.push_back(Fr({16, 24}));
  check({"grouped_matmul", Kernel::grouped_matmul, in, {Out({40, 16})}, nullptr, 3.0});
  std::vector<Arg> bin = {Fr({40, 16}), Fr({40, 24}), offsets};
  std::vector<Arg> bout = {Out({40, 24})};
  for (int e = 0; e < 4; ++e) {
    bin.push_back(Fr({16, 24}));
    bout.push_back(Out({16, 24}));
  }
  // Expert 1's dw is written as zeros over a non-zero buffer.
  bout[2] = Fr({16, 24});
  check({"grouped_matmul_backward", Kernel::grouped_matmul_backward, bin, bout, nullptr, 4.0});

  std::vector<double> rows = ints(30, 0, 12);
  for (double& r : rows) r = r == 5 ? 6 : r;  // token 5 receives nothing
  const Arg tokens = Fixed(DType::kI64, {30}, rows);
  check({"moe_combine",
         Kernel::moe_combine,
         {Fr({30, 20}), tokens, Fr({30})},
         {Fr({12, 20})},  // overwritten, not accumulated
         nullptr,
         3.0});
  check({"moe_combine_backward",
         Kernel::moe_combine_backward,
         {Fr({12, 20}), Fr({30, 20}), tokens, Fr({30})},
         {Out({30, 20}), Out({30})},
         nullptr,
         3.0});
  CHECK_THROWS_WITH(
      run(Kernel::moe_combine, DeviceType::kCUDA, DType::kF32,
          {Fr({4, 3}), Fixed(DType::kI64, {4}, {0, 1, 2, 9}), Fr({4})}, {Out({5, 3})}, nullptr),
      Catch::Contains("row 3 names token 9 of 5"));
  CHECK_THROWS_WITH(run(Kernel::grouped_matmul, DeviceType::kCUDA, DType::kF32,
                        {Fr({4, 3}), Fixed(DType::kI64, {3}, {0, 3, 2}), Fr({2, 3}), Fr({2, 3})},
                        {Out({4, 2})}, nullptr),
                    Catch::Contains("offsets must run from 0 to 4"));
}

// ---- dropout, rope ----------------------------------------------------------------------------
TEST_CASE("dropout reproduces the CPU's Philox masks") {
  static DropoutParams p{0.3, 1234, 77};
  static DropoutParams all{1.0, 9, 0};
  check(
      {"dropout", Kernel::dropout, {Fr({1001})}, {Out({1001}), OutFixed(DType::kU8, {1001})}, &p});
  check(
      {"dropout p=1", Kernel::dropout, {Fr({13})}, {Out({13}), OutFixed(DType::kU8, {13})}, &all});
}

TEST_CASE("rope") {
  static RopeParams full{10000.0, 5, 0, false}, partial{500000.0, 0, 24, true};
  check({"rope full", Kernel::rope, {Fr({2, 13, 3, 40})}, {Out({2, 13, 3, 40})}, &full, 2.0});
  check({"rope partial inverse",
         Kernel::rope,
         {Fr({2, 13, 3, 40})},
         {Out({2, 13, 3, 40})},
         &partial,
         2.0});
  // An explicit inv_freq table (f32 whatever x's dtype: scaled rope, models/llama/rope.h).
  check({"rope inv_freq table",
         Kernel::rope,
         {Fr({2, 13, 3, 8}), Fixed(DType::kF32, {4}, {0.9, 0.21, 0.05, 0.003})},
         {Out({2, 13, 3, 8})},
         &full,
         2.0});
}

// ---- attention ----------------------------------------------------------------------------
void attention_cases(int64_t D) {
  const int64_t B = 2, Hq = 4, Hk = 2, Tq = 37, Tk = 45;
  std::vector<double> mask = ints(B * Tk, 0, 4);
  for (double& m : mask) m = m != 0;  // ~75% of keys visible
  for (int64_t j = 0; j < Tk; ++j) mask[Tk + j] = j < 3 ? 0 : mask[Tk + j];
  for (bool causal : {false, true}) {
    for (bool masked : {false, true}) {
      static AttentionParams params[2][2];
      AttentionParams& p = params[causal][masked];
      p = {0.0, causal, masked};
      INFO("D=" << D << " causal=" << causal << " masked=" << masked);
      std::vector<Arg> qkv = {Fr({B, Hq, Tq, D}), Fr({B, Hk, Tk, D}), Fr({B, Hk, Tk, D})};
      if (masked) qkv.push_back(Fixed(DType::kBool, {B, Tk}, mask));
      check({"attention",
             Kernel::attention,
             qkv,
             {Out({B, Hq, Tq, D}), OutFixed(DType::kF32, {B, Hq, Tq})},
             &p,
             3.0});
      // Backward: out and lse are the CPU forward of the (rounded) inputs.
      std::vector<Arg> in = {Fr({B, Hq, Tq, D}),
                             qkv[0],
                             qkv[1],
                             qkv[2],
                             Out({B, Hq, Tq, D}),
                             OutFixed(DType::kF32, {B, Hq, Tq})};
      if (masked) in.push_back(qkv[3]);
      Case bw{"attention_backward",
              Kernel::attention_backward,
              in,
              {Out({B, Hq, Tq, D}), Out({B, Hk, Tk, D}), Out({B, Hk, Tk, D})},
              &p,
              6.0};
      bw.prepare = [&p, masked](DType dt, std::vector<Arg>& a) {
        std::vector<Arg> fin = {a[1], a[2], a[3]};
        if (masked) fin.push_back(a[6]);
        const auto fwd =
            run(Kernel::attention, DeviceType::kCPU, DType::kF32, fin, {a[4], a[5]}, &p);
        a[4].values = fwd[0];
        for (double& x : a[4].values) x = quantize(x, dt);
        a[5].values = fwd[1];
      };
      check(bw);
    }
  }
}

TEST_CASE("attention: flash path (D=64, 128) and row path (D=40), causal, masked, GQA") {
  attention_cases(64);
  attention_cases(40);
  attention_cases(128);
}

// ---- optimizers ---------------------------------------------------------------------------
TEST_CASE("adamw and sgd update in place like the CPU") {
  static AdamWParams ap{1e-3, 0.9, 0.999, 1e-8, 0.01, 3, 0.5};
  const int64_t n = 1003;
  Arg w = Fr({n}), m = Fr({n}, 0.1), v = F({n}, uniform(n, 0, 0.01));
  w.compare = m.compare = v.compare = true;
  check({"adamw", Kernel::adamw, {w, Fr({n}), m, v}, {}, &ap, 1.0, {DType::kF32}});
  static SgdParams sp{0.1, 0.9, 0.1, 0.01, true, false, 1.0};
  Arg buf = Fr({n});
  buf.compare = true;
  check({"sgd", Kernel::sgd, {w, Fr({n}), buf}, {}, &sp, 1.0, {DType::kF32}});
}

TEST_CASE("adamw_multi_tensor over many awkward tensors equals per-tensor CPU updates") {
  AdamWParams ap{3e-4, 0.9, 0.95, 1e-8, 0.1, 7, 1.0};
  std::vector<std::vector<float>> host[4];
  std::vector<memory::cuda::DeviceBuffer> dev;
  std::vector<cuda::AdamWTensor> ts;
  for (int t = 0; t < 45; ++t) {  // more than one launch's 32 tensors
    const int64_t n = 1 + (t * 7919) % 5003;
    for (int k = 0; k < 4; ++k) {
      std::vector<double> v = k == 3 ? uniform(n, 0, 0.01) : randn(n);
      host[k].emplace_back(v.begin(), v.end());
      dev.emplace_back(n * sizeof(float));
      CUDA_CHECK(
          cudaMemcpy(dev.back().get(), host[k].back().data(), n * 4, cudaMemcpyHostToDevice));
    }
    const size_t b = dev.size() - 4;
    ts.push_back({dev[b].as<float>(), dev[b + 1].as<float>(), dev[b + 2].as<float>(),
                  dev[b + 3].as<float>(), n});
  }
  cuda::adamw_multi_tensor(ts, ap);
  const KernelFn cpu = Registry::instance().get(Kernel::adamw, DeviceType::kCPU, DType::kF32);
  int64_t bad = 0;
  for (size_t t = 0; t < ts.size(); ++t) {
    const int64_t n = ts[t].numel;
    TensorArg a[4];
    for (int k = 0; k < 4; ++k) {
      a[k].data = host[k][t].data();
      a[k].ndim = 1;
      a[k].shape[0] = n;
      a[k].strides[0] = 1;
    }
    cpu(std::span<const TensorArg>(a, 4), {}, &ap);
    std::vector<float> got(n);
    CUDA_CHECK(cudaMemcpy(got.data(), ts[t].param, n * 4, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; ++i)
      bad += std::fabs(got[i] - host[0][t][i]) > 1e-6 + 1e-5 * std::fabs(host[0][t][i]);
  }
  CHECK(bad == 0);
}

// ---- memory ---------------------------------------------------------------------------------
TEST_CASE("caching allocator reuses blocks and tracks allocated, reserved, peak") {
  memory::cuda::CachingAllocator& a =
      memory::cuda::device_allocator(memory::cuda::current_device());
  a.empty_cache();
  const auto s0 = a.detailed_stats();
  void* p = a.allocate(3000);
  void* q = a.allocate(5 << 20);
  const auto s1 = a.detailed_stats();
  CHECK(s1.allocated_bytes - s0.allocated_bytes == 3072 + (5 << 20));
  CHECK(s1.reserved_bytes >= s1.allocated_bytes);
  a.deallocate(p, 3000);
  void* p2 = a.allocate(2900);  // same 3072-byte class: the freed block comes back
  CHECK(p2 == p);
  a.deallocate(p2, 2900);
  a.deallocate(q, 5 << 20);
  const auto s2 = a.detailed_stats();
  CHECK(s2.allocated_bytes == s0.allocated_bytes);
  CHECK(s2.peak_allocated_bytes >= s1.allocated_bytes);
  a.empty_cache();
  CHECK(a.detailed_stats().reserved_bytes <= s0.reserved_bytes);
}

TEST_CASE("copy_bytes round trip through the device and pinned memory") {
  const Device d = Device::cuda(memory::cuda::current_device());
  std::vector<uint8_t> src(100003), back(100003);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  memory::cuda::DeviceBuffer buf(src.size()), buf2(src.size());
  memory::cuda::copy_bytes(buf.get(), d, src.data(), Device::cpu(), src.size());
  memory::cuda::copy_bytes(buf2.get(), d, buf.get(), d, src.size());
  memory::cuda::PinnedHostAllocator& pin = memory::cuda::pinned_allocator();
  void* pinned = pin.allocate(src.size());
  memory::cuda::Stream s;
  memory::cuda::copy_bytes_async(pinned, Device::cpu(), buf2.get(), d, src.size(), s.get());
  pin.record_stream(pinned, s.get());
  s.synchronize();
  std::memcpy(back.data(), pinned, src.size());
  pin.deallocate(pinned, src.size());
  CHECK(back == src);
}

}  // namespace
}  // namespace mammoth::kernels

int main(int argc, char** argv) {
  using namespace mammoth;
  std::string reason;
  try {
    if (!memory::cuda::cuda_available(&reason)) {
      std::printf(
          "[cuda_kernels_test] no CUDA device (%s): this test needs a GPU; "
          "run it with tools/gpu_check.sh on a GPU machine\n",
          reason.c_str());
      return 1;
    }
    memory::cuda::select_device();
  } catch (const std::exception& e) {
    std::printf("[cuda_kernels_test] CUDA initialisation failed: %s\n", e.what());
    return 1;
  }
  kernels::Registry& r = kernels::Registry::instance();
  if (r.find(kernels::Kernel::add, DeviceType::kCUDA, DType::kF32) == nullptr) {
    kernels::cuda::register_kernels(r);  // the registry was built without MAMMOTH_WITH_CUDA
  }
  std::vector<char*> args = testing::catch_args(argc, argv);
  const int rc = Catch::Session().run(static_cast<int>(args.size()), args.data());
  if (argc > 1) return rc;
  std::vector<std::string> missing;
  for (int k = 0; k < kernels::kKernelCount; ++k) {
    if (kernels::g_tested.count(k) == 0) missing.push_back(kernels::kKernelNames[k]);
    if (r.find(static_cast<kernels::Kernel>(k), DeviceType::kCUDA, DType::kF32) == nullptr) {
      missing.push_back(std::string(kernels::kKernelNames[k]) + " (no CUDA f32 kernel)");
    }
  }
  for (const std::string& m : missing)
    std::printf("[cuda_kernels_test] not covered: %s\n", m.c_str());
  return rc != 0 ? rc : (missing.empty() ? 0 : 1);
}
