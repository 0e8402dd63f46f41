// models/analyze: parameter counts against the built modules and published sizes; FLOPs
// against Megatron-LM's GPT formula and the 6N rule.
#include "models/analyze.h"

#include <catch2/catch.hpp>

#include "models/registry.h"

namespace mammoth::models {
namespace {

TEST_CASE("count_parameters equals the built module's parameter count") {
  for (const std::string name :
       {"gpt2-tiny", "llama-tiny", "mistral-tiny", "qwen2-tiny", "bert-tiny", "vit-tiny"}) {
    INFO(name);
    ModelConfig c = resolve_config(name);
    CHECK(count_parameters(c) == build_model(c)->num_parameters());
  }
  ModelConfig tied = resolve_config("llama-tiny");
  tied.tie_embeddings = true;
  CHECK(count_parameters(tied) == build_model(tied)->num_parameters());
  ModelConfig no_head = resolve_config("bert-tiny");
  no_head.num_labels = 0;
  CHECK(count_parameters(no_head) == build_model(no_head)->num_parameters());
}

TEST_CASE("parameter counts of real models match their published sizes") {
  // Hugging Face model cards / num_parameters() of the reference implementations.
  CHECK(count_parameters(resolve_config("gpt2")) == 124439808);
  CHECK(count_parameters(resolve_config("gpt2-medium")) == 354823168);
  CHECK(count_parameters(resolve_config("gpt2-large")) == 774030080);
  CHECK(count_parameters(resolve_config("gpt2-xl")) == 1557611200);
  CHECK(count_parameters(resolve_config("llama-7b")) == 6738415616);
  CHECK(count_parameters(resolve_config("llama-13b")) == 13015864320);
  CHECK(count_parameters(resolve_config("llama-70b")) == 68976648192);
  CHECK(count_parameters(resolve_config("vit-base-patch16-224")) == 86567656);
}

TEST_CASE("GPT-2 FLOPs follow Megatron-LM's formula") {
  // Narayanan et al. 2021: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)) per iteration without
  // recomputation is 3x forward; per token divide by B s.
  for (const std::string name : {"gpt2", "gpt2-xl", "gpt2-tiny"}) {
    INFO(name);
    const ModelAnalysis a = analyze(resolve_config(name), 512);
    const double l = a.config.n_layer, h = a.config.d_model, V = a.config.vocab_size, s = 512;
    const double megatron = 72 * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
    CHECK(a.flops_per_token_train == Approx(megatron).epsilon(1e-12));
    CHECK(a.flops_per_token_forward * 3 == Approx(a.flops_per_token_train));
  }
}

TEST_CASE("LLaMA FLOPs are 6 x matmul parameters + 12 l s d (Kaplan et al. / PaLM)") {
  for (const std::string name : {"llama-7b", "llama-70b", "llama3-8b"}) {
    INFO(name);
    const ModelConfig c = resolve_config(name);
    const ModelAnalysis a = analyze(c, 2048);
    // Matmul weights: everything but the input embedding and the norm vectors.
    const double norms = (2.0 * c.n_layer + 1) * c.d_model;
    const double matmul_params = a.params - double(c.vocab_size) * c.d_model - norms;
    const double expected = 6 * matmul_params + 12.0 * c.n_layer * 2048 * c.d_model;
    CHECK(a.flops_per_token_train == Approx(expected).epsilon(1e-12));
  }
}

TEST_CASE("analysis JSON carries the numbers") {
  const ModelAnalysis a = analyze(resolve_config("gpt2"));
  const json::Value v = analysis_to_json(a);
  CHECK(v.at("params").as_int() == a.params);
  CHECK(v.at("seq_len").as_int() == a.config.max_seq);
  CHECK(v.at("flops_per_token_train").as_double() == a.flops_per_token_train);
  // Memory is plan/memory_model's (test/plan/fit_test.cc), not a second formula here.
  CHECK_FALSE(v.contains("memory"));
}

}  // namespace
}  // namespace mammoth::models
