// Optimizers against hand-computed references (PyTorch's update rules written out in doubles),
// clipping and learning-rate schedules.
#include "engine/optim/optim.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "engine/ops.h"

using namespace mammoth;
using engine::Tensor;
using engine::optim::NamedTensors;

namespace {
Tensor param(std::vector<double> v, DType dt = DType::kF64) {
  Tensor t = Tensor::from_vector(v, {static_cast<int64_t>(v.size())}, dt);
  t.requires_grad_();
  return t;
}
}  // namespace

TEST_CASE("AdamW matches the hand-computed update over three steps") {
  const std::vector<double> w0 = {0.5, -1.0, 2.0};
  const std::vector<std::vector<double>> grads = {
      {0.1, -0.2, 0.3}, {-0.5, 0.4, 0.0}, {1.0, 1.0, -1.0}};
  Tensor w = param(w0).view({3, 1}).detach().contiguous();  // a matrix gets weight decay
  w.requires_grad_();
  engine::optim::AdamWOptions o;
  o.lr = 0.01;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  engine::optim::AdamW opt({{"w", w}}, o);
  std::vector<double> ref = w0, m(3, 0.0), v(3, 0.0);
  for (int step = 1; step <= 3; ++step) {
    w.set_grad(Tensor::from_vector(grads[step - 1], {3, 1}, DType::kF64));
    opt.step();
    for (int i = 0; i < 3; ++i) {
      const double g = grads[step - 1][i];
      ref[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      const double mhat = m[i] / (1 - std::pow(o.beta1, step));
      const double vhat = v[i] / (1 - std::pow(o.beta2, step));
      ref[i] -= o.lr * mhat / (std::sqrt(vhat) + o.eps);
    }
    const std::vector<double> got = w.to_vector();
    for (int i = 0; i < 3; ++i) CHECK(got[i] == Approx(ref[i]).epsilon(1e-12));
  }
  CHECK(opt.step_count() == 3);
  CHECK(opt.state().size() == 2);
}

TEST_CASE("AdamW does not decay vectors by default and skips parameters without grad") {
  Tensor b = param({1.0, 1.0});
  Tensor unused = param({3.0});
  engine::optim::AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.5;
  engine::optim::AdamW opt({{"b", b}, {"unused", unused}}, o);
  b.set_grad(Tensor::from_vector({0.0, 0.0}, {2}, DType::kF64));
  opt.step();
  CHECK(b.to_vector() == std::vector<double>{1.0, 1.0});  // zero grad, no decay
  CHECK(unused.to_vector() == std::vector<double>{3.0});
}

TEST_CASE("SGD with momentum and Nesterov follows PyTorch's rule") {
  for (bool nesterov : {false, true}) {
    Tensor w = param({1.0, -2.0});
    engine::optim::SgdOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    o.weight_decay = 0.01;
    o.nesterov = nesterov;
    engine::optim::SGD opt({{"w", w}}, o);
    std::vector<double> ref{1.0, -2.0}, buf(2, 0.0);
    for (int step = 0; step < 3; ++step) {
      const std::vector<double> g{0.5 * (step + 1), -0.25};
      w.set_grad(Tensor::from_vector(g, {2}, DType::kF64));
      opt.step();
      for (int i = 0; i < 2; ++i) {
        double d = g[i] + o.weight_decay * ref[i];
        buf[i] = step == 0 ? d : o.momentum * buf[i] + d;
        d = nesterov ? d + o.momentum * buf[i] : buf[i];
        ref[i] -= o.lr * d;
      }
      const std::vector<double> got = w.to_vector();
      for (int i = 0; i < 2; ++i) CHECK(got[i] == Approx(ref[i]).epsilon(1e-12));
    }
  }
}

TEST_CASE("gradient norm and clipping factor") {
  Tensor a = param({3.0});
  Tensor b = param({0.0, 0.0});
  a.set_grad(Tensor::from_vector({3.0}, {1}, DType::kF64));
  b.set_grad(Tensor::from_vector({0.0, 4.0}, {2}, DType::kF64));
  const NamedTensors ps = {{"a", a}, {"b", b}};
  CHECK(engine::optim::grad_norm(ps) == Approx(5.0));
  CHECK(engine::optim::clip_factor(5.0, 1.0) == Approx(1.0 / (5.0 + 1e-6)));
  CHECK(engine::optim::clip_factor(0.5, 1.0) == 1.0);
  CHECK(engine::optim::clip_factor(5.0, 0.0) == 1.0);
}

TEST_CASE("learning-rate schedules") {
  engine::optim::LrSchedule s;
  s.kind = engine::optim::LrSchedule::Kind::kCosine;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.min_lr_ratio = 0.1;
  CHECK(s.at(0, 1.0) == Approx(0.1));
  CHECK(s.at(9, 1.0) == Approx(1.0));
  CHECK(s.at(10, 1.0) == Approx(1.0));
  CHECK(s.at(60, 1.0) == Approx(0.55));
  CHECK(s.at(110, 1.0) == Approx(0.1));
  s.kind = engine::optim::LrSchedule::Kind::kLinear;
  CHECK(s.at(60, 1.0) == Approx(0.55));
  CHECK(s.at(35, 1.0) == Approx(1.0 - 0.9 * 0.25));
  s.kind = engine::optim::LrSchedule::Kind::kConstant;
  CHECK(s.at(100, 2.0) == 2.0);
  CHECK_THROWS_AS(engine::optim::LrSchedule::parse_kind("cosin"), Error);
}
