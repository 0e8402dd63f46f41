// Mixtral's config.json handling (models/registry.cc), its validation and analysis: keys
// transformers reads are honoured or refused by name, the written config reads back the same,
// and analyze's parameter counts match the built model.
#include <catch2/catch.hpp>

#include "base/json.h"
#include "models/analyze.h"
#include "models/mixtral/mixtral.h"
#include "models/registry.h"

using namespace mammoth;
using namespace mammoth::models;

namespace {

json::Value tiny_hf() {
  return json::parse(R"({"model_type": "mixtral", "vocab_size": 64, "hidden_size": 32,
    "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
    "output_router_logits": true, "router_aux_loss_coef": 0.02, "sliding_window": null})");
}

}  // namespace

TEST_CASE("mixtral config.json: read, written back, refused keys named") {
  const ModelConfig c = config_from_hf_json(tiny_hf(), "t");
  CHECK(c.family == Family::kMixtral);
  CHECK(c.moe_experts == 4);
  CHECK(c.moe_top_k == 2);
  CHECK(c.moe_aux_loss);
  CHECK(c.moe_aux_loss_coef == 0.02);
  CHECK(c.moe_z_loss_coef == 0.0);
  CHECK(c.moe_capacity_factor == 0.0);  // dropless, as transformers
  const ModelConfig back = config_from_hf_json(config_to_hf_json(c), "back");
  CHECK(back.moe_experts == c.moe_experts);
  CHECK(back.moe_top_k == c.moe_top_k);
  CHECK(back.moe_aux_loss == c.moe_aux_loss);
  CHECK(back.moe_aux_loss_coef == c.moe_aux_loss_coef);
  CHECK(back.n_kv_head == c.n_kv_head);
  CHECK(back.d_ff == c.d_ff);

  json::Value j = tiny_hf();
  j.set("router_jitter_noise", 0.1);
  CHECK_THROWS_WITH(config_from_hf_json(j, "t"), Catch::Contains("router_jitter_noise"));
  j = tiny_hf();
  j.set("sliding_window", 4096);
  CHECK_THROWS_WITH(config_from_hf_json(j, "t"), Catch::Contains("sliding_window"));
  j = tiny_hf();
  j.set("router_something", 1);
  CHECK_THROWS_WITH(config_from_hf_json(j, "t"), Catch::Contains("router_something"));
  j = tiny_hf();
  j.set("num_experts_per_tok", 5);
  CHECK_THROWS_WITH(config_from_hf_json(j, "t"), Catch::Contains("num_experts_per_tok"));
}

TEST_CASE("MoE options: mixtral only, by name") {
  CHECK_THROWS_WITH(create_model("llama-tiny", {.moe_capacity_factor = 1.0}),
                    Catch::Contains("capacity factor"));
  CHECK_THROWS_WITH(create_model("llama-tiny", {.moe_aux_loss_coef = 0.1}),
                    Catch::Contains("auxiliary-loss"));
  auto m = create_model("mixtral-tiny", {.announce = false, .moe_capacity_factor = 1.25});
  CHECK(m->config().moe_capacity_factor == 1.25);
}

TEST_CASE("analyze: mixtral's total parameters match the model, active ones count top-k experts") {
  for (const char* name : {"mixtral-tiny"}) {
    const ModelConfig c = resolve_config(name);
    auto m = build_model(c);
    const ModelAnalysis a = analyze(c);
    CHECK(a.params == m->num_parameters());
    // One expert's parameters: w1, w2, w3.
    const int64_t expert = 3 * c.d_model * c.d_ff;
    CHECK(a.params - a.active_params == c.n_layer * (c.moe_experts - c.moe_top_k) * expert);
  }
  const ModelAnalysis big = analyze(resolve_config("mixtral-8x7b"));
  // Mixtral 8x7B: 46.7B parameters, 12.9B active (Mistral AI's figures).
  CHECK(big.params == Approx(46.7e9).epsilon(0.01));
  CHECK(big.active_params == Approx(12.9e9).epsilon(0.01));
}
