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

Result run(const std::string& name, bool checkpointing) {
  models::ModelOptions mo;
  mo.vocab_size = 64;
  mo.max_seq = 64;
  mo.dropout = 0.1;
  mo.seed = 9;
  auto model = models::create_language_model(name, mo);
  model->set_activation_checkpointing(checkpointing);
  model->train();
  std::vector<int64_t> ids;
  for (int i = 0; i < 4 * 64; ++i) ids.push_back((i * 13 + i / 7) % 64);
  Tensor x = Tensor::from_ints(ids, {4, 64});
  engine::nn::rng_state() = {77, 0};
  memory::cpu_allocator().reset_peak();
  const int64_t before = memory::cpu_allocator().stats().allocated_bytes;
  Tensor loss = model->loss(x);
  loss.backward();
  Result r{loss.item(), {}, memory::cpu_allocator().stats().peak_bytes - before};
  for (auto& [n, p] : model->named_parameters()) r.grads.push_back(p.grad().to_vector());
  return r;
}

}  // namespace

TEST_CASE("activation checkpointing gives identical results with less memory") {
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    INFO(name);
    const Result plain = run(name, false);
    const Result ckpt = run(name, true);
    CHECK(ckpt.loss == plain.loss);
    REQUIRE(ckpt.grads.size() == plain.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i) CHECK(ckpt.grads[i] == plain.grads[i]);
    INFO("peak bytes: plain " << plain.peak_bytes << ", checkpointed " << ckpt.peak_bytes);
    CHECK(ckpt.peak_bytes < plain.peak_bytes * 3 / 4);
  }
}
