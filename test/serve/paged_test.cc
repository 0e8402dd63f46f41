// LanguageModel::forward_paged and serve::Scheduler against generate() alone.
#include <catch2/catch.hpp>
#include <cmath>
#include <thread>

#include "engine/autograd.h"
#include "models/generate.h"
#include "models/registry.h"
#include "serve/scheduler.h"

namespace mammoth::serve {
namespace {

using engine::Tensor;

std::vector<int64_t> prompt_of(int64_t i, int64_t len) {
  std::vector<int64_t> p;
  for (int64_t k = 0; k < len; ++k) p.push_back((i * 37 + k * 11 + 3) % 500);
  return p;
}

// The registered tiny models, and llama-tiny with Llama 3.1's rope_scaling (the paged path must
// rotate with the scaled frequencies, as forward does).
std::shared_ptr<models::LanguageModel> paged_model(const std::string& name) {
  if (name != "llama-tiny-llama3") return models::create_language_model(name, {.seed = 3});
  models::ModelConfig c = models::resolve_config("llama-tiny");
  c.rope_scaling = models::ModelConfig::RopeScaling::kLlama3;
  c.rope_factor = 8.0;
  c.rope_low_freq_factor = 1.0;
  c.rope_high_freq_factor = 4.0;
  c.rope_original_max_seq = 8;
  auto m = std::dynamic_pointer_cast<models::LanguageModel>(models::build_model(c, 3));
  REQUIRE(m != nullptr);
  return m;
}

TEST_CASE("forward_paged: batched steps over scattered blocks equal forward_cached alone") {
  // mistral-tiny: sequences grow past its window of 16, which the paged path must apply too.
  for (const std::string name :
       {"gpt2-tiny", "llama-tiny", "llama-tiny-llama3", "mistral-tiny", "qwen2-tiny"}) {
    INFO(name);
    auto m = paged_model(name);
    m->eval();
    engine::NoGradGuard ng;
    const int64_t bs = 4, steps = 6;
    models::PagedKVCache pool = m->make_paged_cache(64, bs);
    // Three sequences of different prompt lengths; blocks handed out in a scrambled order so
    // every sequence's table is non-contiguous and interleaved with the others'.
    const std::vector<std::vector<int64_t>> prompts = {prompt_of(0, 9), prompt_of(1, 3),
                                                       prompt_of(2, 14)};
    std::vector<int64_t> next_block;
    for (int64_t b = 0; b < 64; ++b) next_block.push_back((b * 29) % 64);
    std::vector<std::vector<int64_t>> tables(3);
    std::vector<int64_t> cached(3, 0);
    std::vector<std::vector<int64_t>> inputs = prompts;
    // References: one KV cache per sequence, fed the same tokens.
    std::vector<models::KVCache> refs;
    for (size_t s = 0; s < prompts.size(); ++s) refs.push_back(m->make_cache(1, 64));
    double worst = 0;
    for (int64_t step = 0; step < steps + 3; ++step) {
      // Prefill in chunks of at most 5 tokens beside the decodes.
      std::vector<int64_t> ids;
      std::vector<models::PagedSequence> seqs;
      std::vector<size_t> who;
      for (size_t s = 0; s < 3; ++s) {
        const int64_t rest = static_cast<int64_t>(inputs[s].size()) - cached[s];
        if (rest <= 0) continue;
        const int64_t count = std::min<int64_t>(rest, 5);
        while (static_cast<int64_t>(tables[s].size()) * bs < cached[s] + count) {
          tables[s].push_back(next_block.back());
          next_block.pop_back();
        }
        ids.insert(ids.end(), inputs[s].begin() + cached[s], inputs[s].begin() + cached[s] + count);
        seqs.push_back({.blocks = &tables[s], .start = cached[s], .count = count});
        who.push_back(s);
      }
      const Tensor logits =
          m->forward_paged(Tensor::from_ints(ids, {int64_t(ids.size())}), seqs, &pool);
      REQUIRE(logits.size(0) == int64_t(seqs.size()));
      for (size_t i = 0; i < seqs.size(); ++i) {
        const size_t s = who[i];
        const std::vector<int64_t> chunk(inputs[s].begin() + cached[s],
                                         inputs[s].begin() + cached[s] + seqs[i].count);
        const Tensor ref =
            m->forward_cached(Tensor::from_ints(chunk, {1, int64_t(chunk.size())}), &refs[s]);
        const std::vector<double> a = logits.select(0, int64_t(i)).to_vector();
        const std::vector<double> b = ref.select(1, ref.size(1) - 1).select(0, 0).to_vector();
        for (size_t v = 0; v < a.size(); ++v) worst = std::max(worst, std::abs(a[v] - b[v]));
        cached[s] += seqs[i].count;
        if (cached[s] == int64_t(inputs[s].size())) {
          inputs[s].push_back(std::max_element(b.begin(), b.end()) - b.begin());
        }
      }
    }
    // Bit for bit: the GEMMs see different row counts (all sequences' tokens vs one
    // sequence's) but each output is the same dot product in the same order, and attention
    // reads the same keys and values gathered from the blocks.
    CHECK(worst == 0.0);
  }
}

TEST_CASE("Scheduler: concurrent requests each equal generate() alone; the pool drains") {
  for (const std::string name : {"gpt2-tiny", "llama-tiny"}) {
    INFO(name);
    auto m = models::create_language_model(name, {.seed = 4});
    m->eval();
    std::vector<std::vector<int64_t>> expected;
    std::vector<std::shared_ptr<Request>> requests;
    const int n = 12;
    for (int i = 0; i < n; ++i) {
      models::GenerateOptions o{.max_new_tokens = 5 + i % 7,
                                .temperature = i % 3 == 0 ? 0.8 : 0.0,
                                .top_k = 20,
                                .seed = uint64_t(i)};
      const std::vector<int64_t> prompt = prompt_of(i, 2 + (i * 5) % 23);
      expected.push_back(models::generate(*m, prompt, o));
      requests.push_back(std::make_shared<Request>(prompt, o));
    }
    // A pool that holds only a few requests' worst cases at once: the rest queue.
    Scheduler s(m, {.kv_blocks = 10, .block_size = 4, .max_step_tokens = 7});
    for (auto& r : requests) s.submit(r);
    for (int i = 0; i < n; ++i) {
      std::vector<int64_t> got;
      while (requests[i]->wait(&got)) {
      }
      CHECK(got == expected[i]);
      CHECK(requests[i]->finish_reason() == "length");
    }
    const SchedulerStats st = s.stats();
    CHECK(st.kv_blocks_used == 0);
    CHECK(st.finished == n);
    CHECK(st.generated_tokens > 0);
  }
}

TEST_CASE("Scheduler: refusals by name; cancel frees the sequence; stop ends waiters") {
  auto m = models::create_language_model("gpt2-tiny", {.max_seq = 64, .seed = 4});
  Scheduler s(m, {.kv_blocks = 4, .block_size = 4});
  auto too_big =
      std::make_shared<Request>(prompt_of(0, 10), models::GenerateOptions{.max_new_tokens = 20});
  CHECK_THROWS_WITH(s.submit(too_big), Catch::Contains("more than the whole pool of 4"));
  auto bad_token = std::make_shared<Request>(std::vector<int64_t>{5000},
                                             models::GenerateOptions{.max_new_tokens = 2});
  CHECK_THROWS_WITH(s.submit(bad_token), Catch::Contains("outside the vocabulary"));
  CHECK_THROWS_WITH(
      s.submit(std::make_shared<Request>(std::vector<int64_t>{}, models::GenerateOptions{})),
      Catch::Contains("at least one token"));

  // A long request cancelled after its first tokens ends "cancelled" and returns its blocks.
  auto r = std::make_shared<Request>(
      prompt_of(1, 3), models::GenerateOptions{.max_new_tokens = 12, .temperature = 0.0});
  s.submit(r);
  std::vector<int64_t> got;
  while (got.empty()) r->wait(&got);
  r->cancel();
  while (r->wait(&got)) {
  }
  CHECK(r->finish_reason() == "cancelled");
  CHECK(s.stats().kv_blocks_used == 0);

  auto pending =
      std::make_shared<Request>(prompt_of(2, 3), models::GenerateOptions{.max_new_tokens = 12});
  s.submit(pending);
  s.stop();
  std::vector<int64_t> rest;
  while (pending->wait(&rest)) {
  }
  CHECK((pending->finish_reason() == "error" || pending->finish_reason() == "length"));
}

}  // namespace
}  // namespace mammoth::serve
