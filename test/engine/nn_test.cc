// nn modules: hierarchical names, seeded initialisation, forward shapes, train/eval dropout.
#include <catch2/catch.hpp>

#include "engine/nn/module.h"
#include "engine/nn/rng.h"
#include "engine/ops.h"

using namespace mammoth;
using engine::Tensor;
namespace nn = engine::nn;

namespace {
struct Block : nn::Module {
  std::shared_ptr<nn::LayerNorm> ln;
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::Dropout> drop;
  Block() {
    ln = register_module("ln_1", std::make_shared<nn::LayerNorm>(4));
    fc = register_module("c_fc", std::make_shared<nn::Linear>(4, 8));
    drop = register_module("drop", std::make_shared<nn::Dropout>(0.5));
  }
  Tensor forward(const Tensor& x) { return drop->forward(fc->forward(ln->forward(x))); }
};
struct Net : nn::Module {
  std::vector<std::shared_ptr<Block>> h;
  Net() {
    for (int i = 0; i < 2; ++i)
      h.push_back(register_module("h." + std::to_string(i), std::make_shared<Block>()));
  }
};
}  // namespace

TEST_CASE("parameter names are hierarchical, Hugging Face style") {
  Net net;
  std::vector<std::string> names;
  for (auto& [n, t] : net.named_parameters()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"h.0.ln_1.weight", "h.0.ln_1.bias", "h.0.c_fc.weight",
                                          "h.0.c_fc.bias", "h.1.ln_1.weight", "h.1.ln_1.bias",
                                          "h.1.c_fc.weight", "h.1.c_fc.bias"});
  CHECK(net.num_parameters() == 2 * (4 + 4 + 32 + 8));
  for (auto& t : net.parameters()) CHECK(t.requires_grad());
}

TEST_CASE("initialisation depends on seed and names only") {
  Net a, b;
  a.init(7);
  b.init(7);
  CHECK(a.h[1]->fc->weight.to_vector() == b.h[1]->fc->weight.to_vector());
  CHECK(a.h[0]->fc->weight.to_vector() != a.h[1]->fc->weight.to_vector());
  CHECK(a.h[0]->ln->weight.to_vector() == std::vector<double>(4, 1.0));
  CHECK(a.h[0]->fc->bias.to_vector() == std::vector<double>(8, 0.0));
  b.init(8);
  CHECK(a.h[1]->fc->weight.to_vector() != b.h[1]->fc->weight.to_vector());
  // N(0, 0.02): sample std within 20% of 0.02 over 32 values is a loose but failing-capable check
  double ss = 0;
  for (double v : a.h[0]->fc->weight.to_vector()) ss += v * v;
  CHECK(std::sqrt(ss / 32) == Approx(0.02).epsilon(0.35));
}

TEST_CASE("dropout is active in training, identity in eval, reproducible from the RNG state") {
  Block blk;
  blk.init(1);
  Tensor x = Tensor::randn({3, 4}, 2);
  nn::rng_state() = {42, 0};
  const std::vector<double> y1 = blk.forward(x).to_vector();
  nn::rng_state() = {42, 0};
  const std::vector<double> y2 = blk.forward(x).to_vector();
  CHECK(y1 == y2);
  int zeros = 0;
  for (double v : y1) zeros += v == 0.0;
  CHECK(zeros > 0);
  blk.eval();
  const std::vector<double> y3 = blk.forward(x).to_vector();
  for (double v : y3) CHECK(v != 0.0);
}

TEST_CASE("modules check their shapes") {
  nn::Linear fc(4, 2);
  CHECK_THROWS_AS(fc.forward(Tensor::zeros({3, 5})), Error);
  nn::LayerNorm ln(4);
  CHECK_THROWS_AS(ln.forward(Tensor::zeros({3, 5})), Error);
}
