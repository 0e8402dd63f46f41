// LoRA (models/lora.h): training through the real loop leaves the base bitwise unchanged with no
// gradient buffers for it; the wrapped model starts as the base; merging equals base + adapter;
// save/load round-trips; the optimizer's state with LoRA on a gpt2-124M-shaped model is below
// 2% of full fine-tuning's, measured from the allocator; bad options are refused by name.
#include "models/lora.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/autograd.h"
#include "engine/io/safetensors.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "engine/train/trainer.h"
#include "memory/allocator.h"
#include "models/registry.h"
#include "test/testing/test_dir.h"
#include "test/testing/token_data.h"

using namespace mammoth;
using engine::Tensor;

namespace {

std::shared_ptr<models::LanguageModel> tiny(const std::string& name) {
  models::ModelOptions mo;
  mo.vocab_size = 48;
  mo.max_seq = 16;
  mo.seed = 5;
  mo.announce = false;
  return models::create_language_model(name, mo);
}

std::vector<std::string> targets_for(const std::string& name) {
  return name == "gpt2-tiny" ? std::vector<std::string>{"c_attn", "c_proj"}
                             : std::vector<std::string>{"q_proj", "v_proj", "down_proj"};
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.contiguous().raw_data(), b.contiguous().raw_data(), a.nbytes()) == 0;
}

double max_rel(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector(), y = b.to_vector();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return diff / std::max(scale, 1e-30);
}

// B is zero at the start; give it values so that the adapter changes the output.
void randomise_b(const models::LoraAdapters& lora) {
  engine::NoGradGuard ng;
  uint64_t stream = 1;
  for (const auto& t : lora.targets()) {
    engine::copy_(t.lora->lora_b(),
                  Tensor::randn(t.lora->lora_b().shape(), 9, 0.0, 0.05, DType::kF32, stream++));
  }
}

Tensor ids() {
  std::vector<int64_t> v;
  for (int i = 0; i < 24; ++i) v.push_back((i * 5 + 3) % 48);
  return Tensor::from_ints(v, {2, 12});
}

}  // namespace

TEST_CASE("LoRA training leaves every base parameter bitwise unchanged") {
  for (const std::string name : {"gpt2-tiny", "llama-tiny"}) {
    INFO(name);
    testing::TestDir dir;
    auto model = tiny(name);
    engine::nn::NamedTensors before;
    for (const auto& [n, p] : model->named_parameters()) before.emplace_back(n, p.clone());
    auto lora = models::apply_lora(
        *model, {.rank = 4, .alpha = 8, .dropout = 0.1, .targets = targets_for(name), .seed = 2});
    const engine::nn::NamedTensors adapters = lora->named_parameters();
    REQUIRE(adapters.size() == 2 * lora->targets().size());
    engine::train::TrainOptions o;
    o.steps = 6;
    o.micro_batch = 4;
    o.seq_len = 16;
    o.lr = 1e-2;
    o.warmup = 1;
    o.eval_every = 0;
    o.quiet = true;
    o.weight_decay = 0.1;  // decay must not reach the frozen base either
    o.trained_params = &adapters;
    const auto data = data::TokenDataset::open(testing::write_tiny_tokens(dir));
    const auto r = engine::train::train(
        *model, [&](const Tensor& in, const Tensor& tg) { return model->loss(in, tg); }, data,
        data::TokenDataset(), o, json::Value::object());
    REQUIRE(r.losses.size() == 6);
    CHECK(r.losses.back() < r.losses.front());
    const engine::nn::NamedTensors after = model->named_parameters();
    REQUIRE(after.size() == before.size());
    for (size_t i = 0; i < after.size(); ++i) {
      INFO(after[i].first);
      CHECK(bitwise_equal(after[i].second, before[i].second));
      CHECK_FALSE(after[i].second.requires_grad());
      CHECK_FALSE(after[i].second.grad().defined());  // no gradient buffer was ever made
    }
    for (const auto& t : lora->targets()) {
      INFO(t.path);
      CHECK(engine::sum(t.lora->lora_b() * t.lora->lora_b()).item() > 0);  // B trained away from 0
    }
  }
}

TEST_CASE("LoRA starts as the base model and merges into base + (alpha/r) B A") {
  for (const std::string name : {"gpt2-tiny", "llama-tiny"}) {
    INFO(name);
    auto model = tiny(name);
    model->eval();
    engine::NoGradGuard ng;
    const Tensor base = model->forward(ids());
    auto lora = models::apply_lora(*model, {.rank = 4, .alpha = 16, .targets = targets_for(name)});
    CHECK(bitwise_equal(model->forward(ids()), base));  // B = 0: the base function
    randomise_b(*lora);
    const Tensor adapted = model->forward(ids());
    CHECK(max_rel(adapted, base) > 1e-3);
    // GPT-2's Conv1D layers are marked so that PEFT merges them transposed.
    for (const auto& t : lora->targets()) CHECK(t.conv1d == (name == "gpt2-tiny"));
    CHECK(lora->targets().front().path.rfind(name == "gpt2-tiny" ? "transformer.h.0." : "model.",
                                             0) == 0);
    models::merge_lora(*model, *lora);
    CHECK(max_rel(model->forward(ids()), adapted) < 1e-5);
  }
}

TEST_CASE("an adapter directory saves and loads back into another copy of the model") {
  testing::TestDir dir;
  auto model = tiny("gpt2-tiny");
  model->eval();
  auto lora = models::apply_lora(*model, {.rank = 2, .alpha = 4, .targets = {"c_fc"}});
  randomise_b(*lora);
  engine::NoGradGuard ng;
  const Tensor want = model->forward(ids());
  models::save_adapter(*lora, *model, dir.file("adapter"), "some/base");
  std::string base;
  const models::LoraOptions o = models::read_adapter_config(dir.file("adapter"), &base);
  CHECK(base == "some/base");
  CHECK(o.rank == 2);
  CHECK(o.alpha == 4);
  CHECK(o.targets == std::vector<std::string>{"c_fc"});
  auto other = tiny("gpt2-tiny");
  other->eval();
  auto back = models::load_adapter(*other, dir.file("adapter"));
  CHECK(bitwise_equal(other->forward(ids()), want));
  // PEFT's key names.
  const auto file =
      mammoth::io::SafetensorsFile::open(dir.file("adapter/adapter_model.safetensors"));
  CHECK(file.find("base_model.model.transformer.h.1.mlp.c_fc.lora_A.weight") != nullptr);
  CHECK(file.find("base_model.model.transformer.h.1.mlp.c_fc.lora_B.weight") != nullptr);
}

TEST_CASE("all-linear wraps every Linear layer but the output head, as PEFT does") {
  for (const std::string name : {"gpt2-tiny", "llama-tiny"}) {
    INFO(name);
    models::ModelConfig c = models::resolve_config(name);
    c.tie_embeddings = false;  // an lm_head Linear that all-linear must leave out
    auto model = models::build_model(c);
    auto lora = models::apply_lora(*model, {.rank = 2, .alpha = 4, .targets = {"all-linear"}});
    const int64_t per_layer = name == "gpt2-tiny" ? 4 : 7;
    CHECK(static_cast<int64_t>(lora->targets().size()) == per_layer * model->config().n_layer);
    for (const auto& t : lora->targets()) CHECK(t.path.find("lm_head") == std::string::npos);
    CHECK(lora->peft_config("b").at("target_modules").as_string() == "all-linear");
  }
}

TEST_CASE("adapter configs LoRA cannot honour are refused by name") {
  testing::TestDir dir;
  auto model = tiny("gpt2-tiny");
  auto lora = models::apply_lora(*model, {.rank = 2, .alpha = 4, .targets = {"c_attn"}});
  models::save_adapter(*lora, *model, dir.file("a"), "x");
  const std::string path = dir.file("a/adapter_config.json");
  json::Value c = json::parse_file(path);
  c.set("use_dora", true);
  std::ofstream(path) << json::dump(c);
  auto fresh = tiny("gpt2-tiny");
  CHECK_THROWS_WITH(models::load_adapter(*fresh, dir.file("a")),
                    Catch::Contains("use_dora is not supported"));
  auto again = tiny("gpt2-tiny");
  CHECK_THROWS_WITH(models::apply_lora(*again, {.rank = 2, .alpha = 4, .targets = {"q_proj"}}),
                    Catch::Contains("target 'q_proj' matches no Linear layer"));
  CHECK_THROWS_WITH(models::apply_lora(*again, {.rank = 0, .alpha = 4, .targets = {"c_attn"}}),
                    Catch::Contains("--lora-rank must be > 0"));
  CHECK_THROWS_WITH(models::parse_lora_targets("c_attn,,c_proj"), Catch::Contains("empty entry"));
}

TEST_CASE("LoRA's optimizer states on gpt2 (124M) are below 2% of full fine-tuning's") {
  // Both measured as the bytes the CPU allocator hands out while the optimizer is built (AdamW
  // allocates its two states per parameter up front), not from a formula.
  models::ModelOptions mo;
  mo.announce = false;
  auto model = models::create_language_model("gpt2", mo);
  memory::Allocator& alloc = memory::allocator_for(Device::cpu());
  auto measure = [&](const engine::nn::NamedTensors& params) {
    const int64_t before = alloc.stats().allocated_bytes;
    engine::optim::AdamW opt(params, {});
    int64_t state = 0;
    for (const auto& [n, t] : opt.state()) state += static_cast<int64_t>(t.nbytes());
    const int64_t allocated = alloc.stats().allocated_bytes - before;
    CHECK(allocated >= state);  // the states are really there
    return allocated;
  };
  const int64_t full = measure(model->named_parameters());
  auto lora = models::apply_lora(*model, {.rank = 8, .alpha = 16, .targets = {"c_attn"}});
  const int64_t with_lora = measure(lora->named_parameters());
  const double ratio = static_cast<double>(with_lora) / static_cast<double>(full);
  std::printf(
      "gpt2 AdamW states: full fine-tuning %lld bytes, LoRA r=8 on c_attn %lld bytes "
      "(%.3f%%)\n",
      static_cast<long long>(full), static_cast<long long>(with_lora), 100.0 * ratio);
  CHECK(full >= 2 * 4 * model->num_parameters());
  CHECK(with_lora > 0);
  CHECK(ratio < 0.02);
}
