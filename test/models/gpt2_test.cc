// GPT-2: shapes, initial loss, gradients reach every parameter, KV-cache decoding equals the
// full forward, dropout is active only in training.
#include "models/gpt2/gpt2.h"

#include <catch2/catch.hpp>
#include <cmath>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/registry.h"

namespace mammoth::models {
namespace {

using engine::Tensor;

Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Tensor r = Tensor::rand({B, T}, seed, 0.0, static_cast<double>(V));
  std::vector<int64_t> ids;
  for (double x : r.to_vector()) ids.push_back(static_cast<int64_t>(x));
  return Tensor::from_ints(ids, {B, T});
}

TEST_CASE("gpt2-tiny: logits shape and initial loss near log(V)") {
  auto m = create_language_model("gpt2-tiny", {.vocab_size = 300, .seed = 3});
  REQUIRE(m->config().vocab_size == 300);
  Tensor ids = random_ids(2, 16, 300, 1);
  Tensor logits = m->forward(ids);
  REQUIRE(logits.shape() == engine::Shape{2, 16, 300});
  const double loss = m->loss(ids).item();
  CHECK(std::abs(loss - std::log(300.0)) < 0.3);
}

TEST_CASE("gpt2-tiny: backward reaches every parameter") {
  auto m = create_language_model("gpt2-tiny", {.seed = 1});
  Tensor loss = m->loss(random_ids(2, 8, m->config().vocab_size, 2));
  loss.backward();
  for (const auto& [name, p] : m->named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    CHECK(engine::max_abs(p.grad()) > 0);
  }
}

TEST_CASE("gpt2-tiny: explicit targets equal the next-token loss") {
  auto m = create_language_model("gpt2-tiny", {.seed = 4});
  Tensor ids = random_ids(2, 10, m->config().vocab_size, 5);
  std::vector<int64_t> v = ids.to_int_vector(), t(v.size(), -100);
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i + 1 < 10; ++i) t[b * 10 + i] = v[b * 10 + i + 1];
  engine::NoGradGuard ng;
  CHECK(m->loss(ids).item() ==
        Approx(m->loss(ids, Tensor::from_ints(t, {2, 10})).item()).epsilon(1e-6));
}

TEST_CASE("gpt2-tiny: KV-cache decoding matches the full forward") {
  auto m = create_language_model("gpt2-tiny", {.seed = 7});
  m->eval();
  engine::NoGradGuard ng;
  Tensor ids = random_ids(2, 12, m->config().vocab_size, 9);
  Tensor full = m->forward(ids);
  KVCache cache = m->make_cache(2, 12);
  Tensor a = m->forward_cached(ids.slice(1, 0, 5), &cache);  // prompt of 5
  std::vector<Tensor> parts{a};
  for (int64_t t = 5; t < 12; ++t)
    parts.push_back(m->forward_cached(ids.slice(1, t, t + 1), &cache));
  REQUIRE(cache.length == 12);
  Tensor inc = engine::concat(parts, 1);
  CHECK(engine::max_abs(inc - full) < 1e-4);
}

TEST_CASE("gpt2-tiny: dropout changes training outputs only") {
  auto m = create_language_model("gpt2-tiny", {.dropout = 0.2, .seed = 7});
  Tensor ids = random_ids(1, 8, m->config().vocab_size, 11);
  engine::NoGradGuard ng;
  m->train();
  const double a = m->loss(ids).item(), b = m->loss(ids).item();
  CHECK(a != b);  // a fresh mask each call
  m->eval();
  CHECK(m->loss(ids).item() == m->loss(ids).item());
}

TEST_CASE("gpt2: positions beyond max_seq are an error") {
  auto m = create_language_model("gpt2-tiny", {.max_seq = 8});
  CHECK_THROWS_WITH(m->forward(random_ids(1, 9, 10, 1)), Catch::Contains("max_seq"));
}

}  // namespace
}  // namespace mammoth::models
