// models/generate: sampling rules and KV-cache generation against step-by-step full forwards.
#include "models/generate.h"

#include <catch2/catch.hpp>
#include <map>

#include "engine/autograd.h"
#include "engine/ops.h"
#include "models/registry.h"

namespace mammoth::models {
namespace {

using engine::Tensor;

TEST_CASE("sample_token: greedy, top-k, top-p") {
  const std::vector<double> logits{1.0, 3.0, 2.0, 2.9};
  CHECK(sample_token(logits, {.temperature = 0.0}, 0.99) == 1);
  // top_k = 1 and a tiny nucleus are greedy whatever the draw.
  for (double u : {0.0, 0.5, 0.999}) {
    CHECK(sample_token(logits, {.temperature = 1.0, .top_k = 1}, u) == 1);
    CHECK(sample_token(logits, {.temperature = 1.0, .top_p = 0.01}, u) == 1);
  }
  // top_k = 2 only ever returns the two best tokens.
  for (int i = 0; i < 100; ++i) {
    const int64_t t = sample_token(logits, {.temperature = 1.0, .top_k = 2}, i / 100.0);
    CHECK((t == 1 || t == 3));
  }
  // Unrestricted sampling over a uniform grid of draws follows softmax probabilities.
  std::map<int64_t, int> counts;
  const int n = 10000;
  for (int i = 0; i < n; ++i) counts[sample_token(logits, {}, (i + 0.5) / n)]++;
  double z = 0;
  for (double l : logits) z += std::exp(l);
  for (int64_t t = 0; t < 4; ++t) {
    CHECK(counts[t] / double(n) == Approx(std::exp(logits[t]) / z).margin(2e-3));
  }
}

TEST_CASE("generate: greedy with a KV cache equals argmax of repeated full forwards") {
  // mistral-tiny decodes past its sliding window (16): the cached path must slide it too.
  for (const std::string name : {"gpt2-tiny", "llama-tiny", "mistral-tiny", "qwen2-tiny"}) {
    INFO(name);
    auto m = create_language_model(name, {.seed = 5});
    m->eval();
    const std::vector<int64_t> prompt{1, 7, 42, 3};
    const std::vector<int64_t> got =
        generate(*m, prompt, {.max_new_tokens = 20, .temperature = 0.0});
    REQUIRE(got.size() == 20);
    std::vector<int64_t> seq = prompt;
    engine::NoGradGuard ng;
    for (int64_t expected : got) {
      Tensor logits = m->forward(Tensor::from_ints(seq, {1, int64_t(seq.size())}));
      std::vector<double> last = logits.select(1, int64_t(seq.size()) - 1).select(0, 0).to_vector();
      const int64_t best = std::max_element(last.begin(), last.end()) - last.begin();
      CHECK(best == expected);
      seq.push_back(best);
    }
  }
}

TEST_CASE("generate: a seed fixes the sample, another seed changes it") {
  auto m = create_language_model("gpt2-tiny", {.seed = 2});
  const GenerateOptions o{.max_new_tokens = 16, .temperature = 1.0, .top_k = 50, .seed = 1};
  const auto a = generate(*m, {5}, o), b = generate(*m, {5}, o);
  CHECK(a == b);
  GenerateOptions o2 = o;
  o2.seed = 2;
  CHECK(generate(*m, {5}, o2) != a);
}

TEST_CASE("generate: stops at eos and at max_seq") {
  auto m = create_language_model("gpt2-tiny", {.max_seq = 8, .seed = 2});
  const auto all = generate(*m, {1, 2, 3}, {.max_new_tokens = 20, .temperature = 0.0});
  CHECK(all.size() == 6);  // positions 3..7 fed back, plus the token predicted at position 7
  const auto stop =
      generate(*m, {1, 2, 3}, {.max_new_tokens = 20, .temperature = 0.0, .eos_token = all[1]});
  CHECK(stop.size() <= 2);
  CHECK(stop.back() == all[1]);
}

TEST_CASE("generate: BERT has no causal decoding") {
  auto m = create_language_model("bert-tiny");
  CHECK_THROWS_WITH(generate(*m, {1}, {}), Catch::Contains("not a causal LM"));
}

}  // namespace
}  // namespace mammoth::models
