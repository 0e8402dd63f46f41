// Activation checkpointing per block: identical losses and gradients (dropout included: the
// recomputation draws the same masks), and less memory held between forward and backward.
#include <catch2/catch.hpp>

#include "engine/nn/rng.h"
#include "engine/ops.h"
#include "memory/allocator.h"
#include "models/registry.h"

using namespace mammoth;
using engine::Tensor;

namespace {

struct Result {
  double loss;
  std::vector<std::vector<double>> grads;
  int64_t peak_bytes;  // allocator peak from the start of forward to the end of backward
};

Result run(const std::string& name, int64_t recompute_blocks) {
  models::ModelOptions mo;
  mo.vocab_size = 64;
  mo.max_seq = 64;
  mo.dropout = 0.1;
  mo.seed = 9;
  auto model = models::create_language_model(name, mo);
  model->set_recompute_blocks(recompute_blocks);
  model->train();
  std::vector<int64_t> ids;
  for (int i = 0; i < 4 * 64; ++i) ids.push_back((i * 13 + i / 7) % 64);
  Tensor x = Tensor::from_ints(ids, {4, 64});
  engine::nn::rng_state() = {77, 0};
  memory::cpu_allocator().reset_peak();
  const int64_t before = memory::cpu_allocator().stats().allocated_bytes;
  // BERT learns masked-LM: targets at every fifth position, -100 (ignored) elsewhere.
  std::vector<int64_t> targets;
  for (size_t i = 0; i < ids.size(); ++i) targets.push_back(i % 5 == 0 ? ids[i] : -100);
  Tensor loss = name.rfind("bert", 0) == 0 ? model->loss(x, Tensor::from_ints(targets, {4, 64}))
                                           : model->loss(x);
  loss.backward();
  Result r{loss.item(), {}, memory::cpu_allocator().stats().peak_bytes - before};
  // BERT's pooler has no gradient under masked-LM: an empty entry keeps the lists aligned.
  for (auto& [n, p] : model->named_parameters())
    r.grads.push_back(p.grad().defined() ? p.grad().to_vector() : std::vector<double>{});
  return r;
}

}  // namespace

TEST_CASE("activation checkpointing gives identical results with less memory") {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "bert-tiny"}) {
    INFO(name);
    const Result plain = run(name, 0);
    const Result ckpt = run(name, -1);
    // Recomputing only the first block: the same numbers, and memory between the two.
    const Result first = run(name, 1);
    for (const Result* r : {&ckpt, &first}) {
      CHECK(r->loss == plain.loss);
      REQUIRE(r->grads.size() == plain.grads.size());
      for (size_t i = 0; i < plain.grads.size(); ++i) CHECK(r->grads[i] == plain.grads[i]);
    }
    INFO("peak bytes: plain " << plain.peak_bytes << ", first block " << first.peak_bytes
                              << ", every block " << ckpt.peak_bytes);
    CHECK(ckpt.peak_bytes < plain.peak_bytes * 3 / 4);
    CHECK(ckpt.peak_bytes <= first.peak_bytes);
    CHECK(first.peak_bytes < plain.peak_bytes);
  }
}
