// models/family: a family registered from outside the generic code (as a new folder would) is
// named, built, read from and written to config.json, analysed and planned like the zoo's own.
#include "models/family.h"

#include <catch2/catch.hpp>
#include <filesystem>

#include "engine/ops.h"
#include "models/analyze.h"
#include "models/gpt2/gpt2.h"
#include "models/registry.h"
#include "plan/cluster.h"
#include "plan/memory_model.h"
#include "plan/parallel_plan.h"
#include "plan/time_model.h"

namespace mammoth::models {
namespace {

namespace fs = std::filesystem;

// A family of its own tag that builds GPT-2's blocks under other config.json keys.
constexpr Family kToy{100};

ModelConfig toy(const std::string& name, int64_t layers, int64_t d) {
  ModelConfig c;
  c.name = name;
  c.family = kToy;
  c.vocab_size = 64;
  c.n_layer = layers;
  c.n_head = c.n_kv_head = 2;
  c.d_model = d;
  c.d_ff = 4 * d;
  c.max_seq = 16;
  return c;
}

FamilySpec toy_family() {
  FamilySpec f;
  f.family = kToy;
  f.name = "toy";
  f.hf_model_types = {"toy", "toy2"};
  f.build = [](const ModelConfig& c) { return std::make_shared<Gpt2>(c); };
  f.from_hf = [](const json::Value& hf, const std::string& type, const std::string& what,
                 ModelConfig& c) {
    hf::check_keys(hf, {"width", "depth", "heads", "vocab", "positions"}, type, what);
    c.d_model = hf.at("width").as_int();
    c.d_ff = 4 * c.d_model;
    c.n_layer = hf.at("depth").as_int();
    c.n_head = c.n_kv_head = hf.at("heads").as_int();
    c.vocab_size = hf.at("vocab").as_int();
    c.max_seq = hf.at("positions").as_int();
  };
  f.to_hf = [](const ModelConfig& c, json::Value& v) {
    v.set("width", c.d_model).set("depth", c.n_layer).set("heads", c.n_head);
    v.set("vocab", c.vocab_size).set("positions", c.max_seq);
  };
  f.configs = {toy("toy-tiny", 2, 16), toy("toy-small", 3, 32)};
  f.cost = cost::layer_norm_cost();
  f.cost.outside_params = [](const ModelConfig& c) {
    return (c.vocab_size + c.max_seq + 2) * c.d_model;  // wte, wpe, ln_f
  };
  f.cost.embedding_params = [](const ModelConfig& c) {
    return (c.vocab_size + c.max_seq) * c.d_model;
  };
  f.cost.head_flops = [](const ModelConfig& c, int64_t) { return 2.0 * c.d_model * c.vocab_size; };
  f.cost.tp_split = [](const ModelConfig& c, int tp, int64_t Vp, int64_t) {
    TpParamSplit s = cost::layer_norm_tp_split(c, tp);
    s.tied = Vp * c.d_model / tp;
    s.embed = c.max_seq * c.d_model;
    s.head = 2 * c.d_model;
    return s;
  };
  return f;
}

// The one registration line a family's folder holds.
[[maybe_unused]] const bool kRegistered = register_family(toy_family());

TEST_CASE("family: a registered family is named, resolved and built") {
  CHECK(std::string(family_name(kToy)) == "toy");
  CHECK(family_from_name("toy") == kToy);
  CHECK(is_registered("toy-tiny"));
  CHECK(is_registered("toy-small"));
  CHECK(family_for_model_type("toy2") == &family_spec(kToy));
  const ModelConfig c = resolve_config("toy-small");
  CHECK(c.family == kToy);
  CHECK(c.n_layer == 3);
  auto m = create_model("toy-small", {.seed = 3, .announce = false});
  // The spec's parameter count is the built model's.
  CHECK(count_parameters(c) == m->num_parameters());
  CHECK(create_language_model("toy-tiny", {.announce = false}) != nullptr);
}

TEST_CASE("family: config.json round trip and its keys refused by name") {
  const ModelConfig c = resolve_config("toy-tiny");
  const json::Value hf = config_to_hf_json(c);
  CHECK(hf.at("model_type").as_string() == "toy");
  CHECK(hf.at("width").as_int() == 16);
  const ModelConfig back = config_from_hf_json(hf, "dir");
  CHECK(back.family == kToy);
  CHECK(back.d_model == c.d_model);
  CHECK(back.n_layer == c.n_layer);
  CHECK(back.vocab_size == c.vocab_size);
  json::Value other = hf;
  other.set("model_type", "toy2").set("rotary", true);
  CHECK_THROWS_WITH(config_from_hf_json(other, "dir"),
                    Catch::Contains("'rotary'") && Catch::Contains("model_type 'toy2'"));
  CHECK_THROWS_WITH(config_from_hf_json(json::parse(R"({"model_type": "t5"})"), "x"),
                    Catch::Contains("toy, toy2"));
}

TEST_CASE("family: save_pretrained and load through the spec") {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base ? base : fs::temp_directory_path().string()) / "toy_dir";
  fs::remove_all(dir);
  auto a = create_model("toy-tiny", {.seed = 5, .announce = false});
  save_pretrained(*a, dir.string());
  auto b = create_model(dir.string(), {.seed = 9, .announce = false});
  CHECK(b->config().family == kToy);
  auto pa = a->named_parameters(), pb = b->named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i].first);
    CHECK(engine::max_abs(pa[i].second - pb[i].second) == 0.0);
  }
}

TEST_CASE("family: analyze and the memory model read the spec's costs") {
  const ModelConfig c = resolve_config("toy-tiny");
  const ModelAnalysis a = analyze(c, 8);
  // d 16, f 64, T 8: 2 (4 d^2 + 2 d f) + 4 T d = 2 (1024 + 2048) + 512 per block.
  CHECK(a.block_flops_per_token_forward == 6656.0);
  CHECK(a.head_flops_per_token_forward == 2.0 * 16 * 64);
  CHECK(a.flops_per_token_forward == 2 * 6656.0 + 2048.0);
  CHECK(a.embedding_params == (64 + 16) * 16);
  // Its costs are GPT-2's (tied head) by construction, so the planner's numbers are too.
  ModelConfig g = c;
  g.family = Family::kGpt2;
  CHECK(count_parameters(g) == count_parameters(c));
  for (int tp : {1, 2}) {
    INFO("tp " << tp);
    plan::ParallelPlan p;
    p.tp = tp;
    p.micro_batch = 2;
    p.seq_len = 8;
    const plan::MemoryPrediction m = plan::predict_memory(c, p);
    REQUIRE(m.stages.size() == 1);
    CHECK(m.stages[0].activations > 0);
    CHECK(json::dump(m.to_json()) == json::dump(plan::predict_memory(g, p).to_json()));
  }
}

TEST_CASE("family: a taken tag, name or model_type is refused") {
  FamilySpec again = toy_family();
  CHECK_THROWS_WITH(register_family(again), Catch::Contains("toy"));
  FamilySpec type_taken = toy_family();
  type_taken.family = Family{101};
  type_taken.name = "toy-other";
  type_taken.hf_model_types = {"gpt2"};
  CHECK_THROWS_WITH(register_family(type_taken), Catch::Contains("model_type 'gpt2'"));
  FamilySpec no_cost = toy_family();
  no_cost.family = Family{103};
  no_cost.name = "toy-no-cost";
  no_cost.hf_model_types = {"toy3"};
  no_cost.cost.tp_split = nullptr;
  CHECK_THROWS_WITH(register_family(no_cost), Catch::Contains("cost function"));
  CHECK_THROWS_WITH(family_spec(Family{102}), Catch::Contains("102"));
}

TEST_CASE("family: the plan and the time model read the spec, not the tag") {
  const ModelConfig c = resolve_config("toy-tiny");
  ModelConfig g = c;
  g.family = Family::kGpt2;
  plan::ParallelPlan p;
  p.micro_batch = 2;
  p.seq_len = 8;
  // The spec's defaults: GPT-2's block shape in the time model, no pipeline form.
  const plan::Cluster cluster = plan::load_cluster("dgx_a100_80gb");
  CHECK(json::dump(plan::predict_time(c, p, cluster).to_json()) ==
        json::dump(plan::predict_time(g, p, cluster).to_json()));
  CHECK(plan::check(p, {.model = &c}).empty());
  p.pp = 2;
  CHECK(plan::check(p, {.world = 2, .model = &c}) ==
        "--pp: model family toy has no pipeline stages; use --pp 1");
  CHECK(plan::check(p, {.world = 2, .model = &g}).empty());
  // Messages name the family by its title.
  p.pp = 1;
  p.tp = 2;
  g.tie_embeddings = false;
  CHECK(plan::check(p, {.world = 2, .model = &g}) ==
        "--tp 2: GPT-2 with an untied LM head has no tensor-parallel form yet (its policy shards "
        "the tied embedding as the head)");
}

}  // namespace
}  // namespace mammoth::models
