// bf16 autocast through linear(): the forward (x W^T, NT), dx (dy W, NN) and dW (dy^T x, TN)
// products each equal the f32 products of bf16-rounded operands, and db, a column sum rather than
// a product, is the f32 sum of dy itself (unrounded); results do not depend on
// the thread count (each output element is summed by one thread in a fixed order), so two
// AdamW steps under bf16 give bitwise the same parameters on 1 and 2 threads.
#include <catch2/catch.hpp>
#include <vector>

#include "base/thread_pool.h"
#include "engine/amp/amp.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "test/testing/gradcheck.h"

using namespace mammoth;
using engine::Tensor;
using engine::amp::AutocastGuard;
using engine::amp::Precision;

namespace {

Tensor round_bf16(const Tensor& x) { return x.to(DType::kBF16).to(DType::kF32); }

struct Grads {
  Tensor y, dx, dw, db;
};

// y = linear(x, w, b) under bf16 autocast, backward from upstream gradient g.
Grads run_linear(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& g) {
  Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(),
         b = b0.clone().requires_grad_();
  AutocastGuard guard(Precision::kBF16);
  Tensor y = engine::linear(x, w, b);
  engine::sum(y * g).backward();
  return {y.detach(), x.grad(), w.grad(), b.grad()};
}

}  // namespace

TEST_CASE("bf16 linear forward and backward are f32 products of bf16-rounded operands") {
  // Sizes off the 6 x 64 register tile and odd K in every product.
  const int64_t M = 37, in = 70, out = 131;
  const Tensor x = Tensor::randn({M, in}, 1), w = Tensor::randn({out, in}, 2);
  const Tensor b = Tensor::randn({out}, 3), g = Tensor::randn({M, out}, 4);
  const Grads got = run_linear(x, w, b, g);
  const Tensor y_ref = engine::matmul(round_bf16(x), round_bf16(w).transpose(0, 1)) + b;
  const Tensor dx_ref = engine::matmul(round_bf16(g), round_bf16(w));
  const Tensor dw_ref = engine::matmul(round_bf16(g).transpose(0, 1), round_bf16(x));
  const Tensor db_ref = engine::sum(g, {0});
  CHECK(testing::compare(got.y, y_ref, 1e-5, 1e-5) == "");
  CHECK(testing::compare(got.dx, dx_ref, 1e-5, 1e-5) == "");
  CHECK(testing::compare(got.dw, dw_ref, 1e-5, 1e-5) == "");
  CHECK(testing::compare(got.db, db_ref, 1e-5, 1e-5) == "");
  // Not the f32 products: the rounding really happened in each of them.
  CHECK(engine::max_abs(got.dw - engine::matmul(g.transpose(0, 1), x)) > 1e-3);
  CHECK(engine::max_abs(got.dx - engine::matmul(g, w)) > 1e-3);
  CHECK(engine::max_abs(got.db - engine::sum(round_bf16(g), {0})) > 1e-3);
}

TEST_CASE("bf16 linear and AdamW steps are bitwise the same on 1 and 2 threads") {
  // Large enough that the products are split over threads (row and column slabs).
  const int64_t M = 96, in = 200, out = 330;
  const Tensor x = Tensor::randn({M, in}, 5), w0 = Tensor::randn({out, in}, 6, 0.0, 0.05);
  const Tensor b0 = Tensor::randn({out}, 7), g = Tensor::randn({M, out}, 8);
  std::vector<std::vector<double>> results;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Tensor w = w0.clone().requires_grad_(), b = b0.clone().requires_grad_();
    engine::optim::AdamW opt({{"w", w}, {"b", b}}, {});
    for (int step = 0; step < 2; ++step) {
      AutocastGuard guard(Precision::kBF16);
      engine::sum(engine::linear(x, w, b) * g).backward();
      opt.step();
      opt.zero_grad();
    }
    std::vector<double> v = w.to_vector(), vb = b.to_vector();
    v.insert(v.end(), vb.begin(), vb.end());
    results.push_back(v);
  }
  set_num_threads(0);
  CHECK(results[0] == results[1]);
  // The steps moved the weights (the comparison above is not of two untouched copies).
  CHECK(results[0] != w0.to_vector());
}
