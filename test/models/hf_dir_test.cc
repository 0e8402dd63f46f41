// Hugging Face model directories: sharded safetensors through model.safetensors.index.json, a
// directory without weights, missing shards and tensors, untied GPT-2 heads, and config.json
// keys that are honoured or refused by name.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "base/json.h"
#include "engine/autograd.h"
#include "engine/io/safetensors.h"
#include "engine/ops.h"
#include "models/registry.h"
#include "models/weights.h"
#include "test/testing/test_dir.h"

namespace mammoth::models {
namespace {

namespace fs = std::filesystem;
using engine::Tensor;

const char* kShard1 = "model-00001-of-00002.safetensors";
const char* kShard2 = "model-00002-of-00002.safetensors";

// An owned tensor for a safetensors view (keeps the bytes alive).
struct Owned {
  std::string name;
  Tensor t;
  io::TensorView view() const {
    return {name, t.dtype(), t.shape(), static_cast<const uint8_t*>(t.raw_data()), t.nbytes()};
  }
};

std::vector<Owned> read_all(const std::string& path) {
  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  std::vector<Owned> out;
  for (const io::TensorView& v : f.tensors()) {
    Tensor t = Tensor::empty(v.shape, v.dtype);
    if (v.nbytes > 0) std::memcpy(t.raw_data(), v.data, v.nbytes);
    out.push_back({v.name, t});
  }
  return out;
}

void write_all(const std::string& path, const std::vector<Owned>& tensors) {
  std::vector<io::TensorView> views;
  for (const Owned& o : tensors) views.push_back(o.view());
  io::write_safetensors(path, views, {{"format", "pt"}});
}

// A model directory: `name` saved with save_pretrained, its tensors re-stored in f32, bf16 and
// f16 in turn (so that both layouts hold the same, mixed-dtype values).
std::vector<Owned> pretrained_dir(const std::string& name, const std::string& dir) {
  save_pretrained(*create_model(name, {.seed = 21}), dir);
  std::vector<Owned> tensors = read_all(dir + "/model.safetensors");
  const DType kinds[] = {DType::kF32, DType::kBF16, DType::kF16};
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].t = tensors[i].t.to(kinds[i % 3]);
  write_all(dir + "/model.safetensors", tensors);
  return tensors;
}

// The same tensors as two shards plus the index, beside a copy of config.json.
void sharded_dir(const std::string& single, const std::vector<Owned>& tensors,
                 const std::string& dir) {
  fs::create_directories(dir);
  fs::copy_file(single + "/config.json", dir + "/config.json");
  std::vector<Owned> a(tensors.begin(), tensors.begin() + tensors.size() / 2);
  std::vector<Owned> b(tensors.begin() + tensors.size() / 2, tensors.end());
  write_all(dir + "/" + kShard1, a);
  write_all(dir + "/" + kShard2, b);
  json::Value map = json::Value::object();
  for (const Owned& o : a) map.set(o.name, kShard1);
  for (const Owned& o : b) map.set(o.name, kShard2);
  json::Value index = json::Value::object();
  index.set("metadata", json::Value::object().set("total_size", 0));
  index.set("weight_map", std::move(map));
  std::ofstream(dir + "/model.safetensors.index.json") << json::dump(index, 2);
}

Tensor ids_for(const LanguageModel& m) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < 2 * 12; ++i) ids.push_back((i * 37 + 5) % m.config().vocab_size);
  return Tensor::from_ints(ids, {2, 12});
}

double loss_of(const std::string& dir) {
  auto m = create_language_model(dir);
  m->eval();
  engine::NoGradGuard ng;
  return m->loss(ids_for(*m)).item();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_CASE("a sharded directory gives the same loss as the single file (f32, bf16, f16 shards)") {
  for (const std::string name : {"gpt2-tiny", "llama-tiny"}) {
    INFO(name);
    testing::TestDir t;
    const std::vector<Owned> tensors = pretrained_dir(name, t.file("single"));
    sharded_dir(t.file("single"), tensors, t.file("sharded"));
    const double single = loss_of(t.file("single"));
    const double sharded = loss_of(t.file("sharded"));
    CHECK(single == sharded);
    // The fresh model of the same config computes something else: the weights were loaded.
    auto fresh = create_language_model(t.file("sharded"), {.seed = 5, .fresh_init = true});
    engine::NoGradGuard ng;
    CHECK(fresh->loss(ids_for(*fresh)).item() != single);

    const WeightFiles w = WeightFiles::open(t.file("sharded/model.safetensors.index.json"));
    CHECK(w.sharded());
    CHECK(w.num_files() == 2);
    CHECK(w.num_tensors() == tensors.size());
    CHECK(w.describe().find("(2 shards, ") != std::string::npos);
    CHECK(w.file_of(tensors.back().name) == kShard2);
    CHECK(find_weights(t.file("sharded")) == t.file("sharded/model.safetensors.index.json"));
  }
}

TEST_CASE("a directory without weights is an error unless fresh_init asks for initialisation") {
  testing::TestDir t;
  save_pretrained(*create_model("gpt2-tiny", {.seed = 1}), t.file("m"));
  fs::remove(t.file("m/model.safetensors"));
  t.write("m/pytorch_model.bin", "not loaded");
  const std::string e = error_of([&] { create_model(t.file("m")); });
  CHECK_THAT(e, Catch::Contains("has no weights"));
  CHECK_THAT(e, Catch::Contains("model.safetensors.index.json"));
  CHECK_THAT(e, Catch::Contains("pytorch_model.bin"));
  CHECK_THAT(e, Catch::Contains("--fresh-init"));
  auto a = create_model(t.file("m"), {.seed = 3, .fresh_init = true});
  auto b = create_model("gpt2-tiny", {.seed = 3});  // registered names stay fresh
  auto pa = a->named_parameters(), pb = b->named_parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) CHECK(engine::max_abs(pa[i].second - pb[i].second) == 0);
  CHECK_THROWS_WITH(create_model(t.file("m"), {.fresh_init = true, .weights = "x.safetensors"}),
                    Catch::Contains("exclude each other"));
  // load_weights = false: the caller loads; nothing is read or required here.
  CHECK_NOTHROW(create_model(t.file("m"), {.load_weights = false}));
}

TEST_CASE("a missing shard, a missing tensor, an unexpected or mis-shaped one: one error") {
  testing::TestDir t;
  const std::vector<Owned> tensors = pretrained_dir("gpt2-tiny", t.file("single"));
  const std::string dir = t.file("sharded");
  sharded_dir(t.file("single"), tensors, dir);

  SECTION("missing shard") {
    fs::remove(dir + "/" + kShard2);
    const std::string e = error_of([&] { create_model(dir); });
    CHECK_THAT(e, Catch::Contains(std::string(kShard2) + "' does not exist"));
    // Every tensor it should have held is listed, with the shard the index names.
    CHECK_THAT(e, Catch::Contains("missing '" + tensors.back().name + "'"));
    CHECK_THAT(e, Catch::Contains("(the index maps it to " + std::string(kShard2) + ")"));
  }
  SECTION("missing tensor, unexpected tensor and wrong shape, all in one message") {
    std::vector<Owned> a = read_all(dir + "/" + kShard1);
    const std::string dropped = a[0].name;
    const std::string reshaped = a[1].name;
    a.erase(a.begin());
    a[0].t = Tensor::zeros({3, 5}, a[0].t.dtype());
    a.push_back({"extra.weight", Tensor::zeros({2}, DType::kF32)});
    write_all(dir + "/" + kShard1, a);
    const std::string e = error_of([&] { create_model(dir); });
    CHECK_THAT(e, Catch::Contains("3 problems"));
    CHECK_THAT(e, Catch::Contains("missing '" + dropped + "'"));
    CHECK_THAT(e, Catch::Contains("'" + reshaped + "' in " + kShard1 + ": shape (3, 5)"));
    CHECK_THAT(e, Catch::Contains("unexpected 'extra.weight' (2,) f32 in " + std::string(kShard1)));
  }
  SECTION("a tensor in two shards") {
    std::vector<Owned> b = read_all(dir + "/" + kShard2);
    b.push_back(read_all(dir + "/" + kShard1)[0]);
    write_all(dir + "/" + kShard2, b);
    CHECK_THAT(error_of([&] { create_model(dir); }), Catch::Contains("is in two shards"));
  }
  SECTION("an index without weight_map") {
    std::ofstream(dir + "/model.safetensors.index.json") << "{\"metadata\": {}}";
    CHECK_THAT(error_of([&] { create_model(dir); }), Catch::Contains("weight_map"));
  }
  SECTION("options.weights loads an index for a registered name too") {
    auto m = create_model("gpt2-tiny", {.weights = dir + "/model.safetensors.index.json"});
    auto ref = create_model(t.file("single"));
    auto pa = m->named_parameters(), pb = ref->named_parameters();
    for (size_t i = 0; i < pa.size(); ++i) CHECK(engine::max_abs(pa[i].second - pb[i].second) == 0);
  }
}

TEST_CASE("GPT-2 with tie_word_embeddings false loads and uses lm_head.weight") {
  testing::TestDir t;
  ModelConfig c = resolve_config("gpt2-tiny");
  c.tie_embeddings = false;
  auto a = build_model(c, 4);
  const auto names = a->named_parameters();
  CHECK(std::any_of(names.begin(), names.end(),
                    [](const auto& p) { return p.first == "lm_head.weight"; }));
  save_pretrained(*a, t.file("untied"));
  const json::Value cfg = json::parse_file(t.file("untied/config.json"));
  CHECK(cfg.at("tie_word_embeddings").as_bool() == false);
  CHECK(io::SafetensorsFile::open(t.file("untied/model.safetensors")).find("lm_head.weight"));
  auto b = create_language_model(t.file("untied"));
  CHECK_FALSE(b->config().tie_embeddings);
  auto& lm_a = dynamic_cast<LanguageModel&>(*a);
  engine::NoGradGuard ng;
  const Tensor ids = ids_for(*b);
  CHECK(lm_a.loss(ids).item() == b->loss(ids).item());
  // The head is lm_head: changing it changes the logits, wte's tied product would not.
  for (auto& [n, p] : b->named_parameters())
    if (n == "lm_head.weight") engine::copy_(p, p * 2.0);
  CHECK(b->loss(ids).item() != lm_a.loss(ids).item());

  // Untied directory without lm_head.weight: a missing tensor, not a silent tie.
  std::vector<Owned> tensors = read_all(t.file("untied/model.safetensors"));
  std::erase_if(tensors, [](const Owned& o) { return o.name == "lm_head.weight"; });
  write_all(t.file("untied/model.safetensors"), tensors);
  CHECK_THAT(error_of([&] { create_model(t.file("untied")); }),
             Catch::Contains("missing 'lm_head.weight'"));
}

TEST_CASE("LLaMA follows tie_word_embeddings both ways") {
  testing::TestDir t;
  for (const bool tied : {true, false}) {
    INFO(tied);
    ModelConfig c = resolve_config("llama-tiny");
    c.tie_embeddings = tied;
    auto a = build_model(c, 6);
    const std::string dir = t.file(tied ? "tied" : "untied");
    save_pretrained(*a, dir);
    CHECK(json::parse_file(dir + "/config.json").at("tie_word_embeddings").as_bool() == tied);
    CHECK((io::SafetensorsFile::open(dir + "/model.safetensors").find("lm_head.weight") ==
           nullptr) == tied);
    auto b = create_language_model(dir);
    CHECK(b->config().tie_embeddings == tied);
    engine::NoGradGuard ng;
    const Tensor ids = ids_for(*b);
    CHECK(dynamic_cast<LanguageModel&>(*a).loss(ids).item() == b->loss(ids).item());
  }
}

ModelConfig parse(const std::string& text) { return config_from_hf_json(json::parse(text), "cfg"); }

TEST_CASE("config.json keys that change the computation are honoured or refused by name") {
  const std::string gpt2 =
      R"({"model_type": "gpt2", "vocab_size": 64, "n_positions": 16, "n_embd": 32,
          "n_layer": 1, "n_head": 2)";
  auto gpt2_with = [&](const std::string& extra) { return parse(gpt2 + ", " + extra + "}"); };
  CHECK(gpt2_with(R"("layer_norm_epsilon": 1e-3)").norm_eps == 1e-3);
  CHECK_FALSE(gpt2_with(R"("tie_word_embeddings": false)").tie_embeddings);
  CHECK(gpt2_with(R"("tie_word_embeddings": true)").tie_embeddings);
  CHECK_NOTHROW(gpt2_with(R"("activation_function": "gelu_pytorch_tanh")"));
  CHECK_THROWS_WITH(gpt2_with(R"("activation_function": "relu")"),
                    Catch::Contains("activation_function 'relu'"));
  CHECK_THROWS_WITH(gpt2_with(R"("scale_attn_by_inverse_layer_idx": true)"),
                    Catch::Contains("scale_attn_by_inverse_layer_idx=true"));
  CHECK_THROWS_WITH(gpt2_with(R"("scale_attn_weights": false)"),
                    Catch::Contains("scale_attn_weights=false"));
  CHECK_THROWS_WITH(gpt2_with(R"("resid_pdrop": 0.0, "embd_pdrop": 0.2)"),
                    Catch::Contains("embd_pdrop"));
  // Unknown keys are refused with their names; inert ones are accepted.
  CHECK_THROWS_WITH(gpt2_with(R"("quantization_config": {}, "n_bogus": 3)"),
                    Catch::Contains("'quantization_config', 'n_bogus'"));
  CHECK_THROWS_WITH(gpt2_with(R"("layer_norm_eps": 1e-3)"), Catch::Contains("'layer_norm_eps'"));
  CHECK_NOTHROW(gpt2_with(
      R"("architectures": ["GPT2LMHeadModel"], "torch_dtype": "float32", "_name_or_path": "x",
         "bos_token_id": 1, "eos_token_id": 2, "transformers_version": "4.44.2",
         "task_specific_params": {}, "summary_type": "cls_index", "n_ctx": 16, "use_cache": true)"));

  const std::string llama =
      R"({"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 4, "intermediate_size": 48)";
  auto llama_with = [&](const std::string& extra) { return parse(llama + ", " + extra + "}"); };
  const ModelConfig l = llama_with(R"("rms_norm_eps": 1e-5, "rope_theta": 500000.0,
                                      "tie_word_embeddings": true, "pretraining_tp": 1)");
  CHECK(l.norm_eps == 1e-5);
  CHECK(l.rope_base == 500000.0);
  CHECK(l.tie_embeddings);
  // rope_scaling: the kinds and keys transformers 4.44 implements for LLaMA (logits against
  // transformers in test/models/parity:rope_scaling_test), everything else refused by name.
  CHECK_THROWS_WITH(llama_with(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})"),
                    Catch::Contains("rope_scaling 'llama3' needs low_freq_factor"));
  const ModelConfig linear = llama_with(R"("rope_scaling": {"type": "linear", "factor": 2.0})");
  CHECK(linear.rope_scaling == ModelConfig::RopeScaling::kLinear);
  CHECK(linear.rope_factor == 2.0);
  const ModelConfig l3 = llama_with(
      R"("head_dim": 16, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
         "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
  CHECK(l3.rope_scaling == ModelConfig::RopeScaling::kLlama3);
  CHECK(l3.rope_original_max_seq == 8192);
  CHECK(l3.head_dim() == 16);
  CHECK(config_from_hf_json(config_to_hf_json(l3), "round trip").rope_high_freq_factor == 4.0);
  CHECK_THROWS_WITH(llama_with(R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})"),
                    Catch::Contains("rope_scaling 'yarn' is not supported"));
  CHECK_THROWS_WITH(llama_with(R"("rope_scaling": {"type": "dynamic", "factor": 2.0, "beta": 1})"),
                    Catch::Contains("key 'beta' is not supported"));
  CHECK_THROWS_WITH(
      llama_with(R"("rope_scaling": {"rope_type": "linear", "type": "dynamic", "factor": 2.0})"),
      Catch::Contains("disagree"));
  CHECK_NOTHROW(llama_with(R"("rope_scaling": {"rope_type": "default"})"));
  CHECK_THROWS_WITH(llama_with(R"("hidden_act": "gelu")"), Catch::Contains("hidden_act 'gelu'"));
  CHECK_THROWS_WITH(llama_with(R"("sliding_window": 4096)"), Catch::Contains("'sliding_window'"));
  CHECK_THROWS_WITH(llama_with(R"("attention_bias": true)"), Catch::Contains("attention_bias"));

  const std::string bert =
      R"({"model_type": "bert", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 4, "intermediate_size": 48)";
  auto bert_with = [&](const std::string& extra) { return parse(bert + ", " + extra + "}"); };
  CHECK(bert_with(R"("layer_norm_eps": 1e-7)").norm_eps == 1e-7);
  CHECK_THROWS_WITH(bert_with(R"("is_decoder": true)"), Catch::Contains("is_decoder=true"));
  CHECK_THROWS_WITH(bert_with(R"("classifier_dropout": 0.3)"),
                    Catch::Contains("classifier_dropout"));
  CHECK_THROWS_WITH(bert_with(R"("position_embedding_type": "relative_key")"),
                    Catch::Contains("relative_key"));
  CHECK_THROWS_WITH(bert_with(R"("problem_type": "multi_label_classification")"),
                    Catch::Contains("problem_type"));
  CHECK_THROWS_WITH(bert_with(R"("tie_word_embeddings": false)"),
                    Catch::Contains("tie_word_embeddings=false"));

  // Real hub configs read as they are.
  CHECK_NOTHROW(parse(R"({"architectures": ["LlamaForCausalLM"], "bos_token_id": 1,
      "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
      "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
      "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
      "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
      "tie_word_embeddings": false, "torch_dtype": "float16", "transformers_version": "4.31.0",
      "use_cache": true, "vocab_size": 32000})"));
  CHECK_NOTHROW(parse(R"({"architectures": ["BertForMaskedLM"],
      "attention_probs_dropout_prob": 0.1, "gradient_checkpointing": false, "hidden_act": "gelu",
      "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02,
      "intermediate_size": 3072, "layer_norm_eps": 1e-12, "max_position_embeddings": 512,
      "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 12, "pad_token_id": 0,
      "position_embedding_type": "absolute", "transformers_version": "4.6.0.dev0",
      "type_vocab_size": 2, "use_cache": true, "vocab_size": 30522})"));
  CHECK_NOTHROW(parse(R"({"architectures": ["ViTForImageClassification"],
      "attention_probs_dropout_prob": 0.0, "hidden_act": "gelu", "hidden_dropout_prob": 0.0,
      "hidden_size": 768, "id2label": {"0": "a", "1": "b"}, "label2id": {"a": 0, "b": 1},
      "image_size": 224, "initializer_range": 0.02, "intermediate_size": 3072,
      "layer_norm_eps": 1e-12, "model_type": "vit", "num_attention_heads": 12,
      "num_channels": 3, "num_hidden_layers": 12, "patch_size": 16, "qkv_bias": true,
      "encoder_stride": 16, "transformers_version": "4.13.0.dev0"})"));
}

}  // namespace
}  // namespace mammoth::models
