// models/registry: named configs, overrides, HF config.json directories, save_pretrained.
#include "models/registry.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "engine/autograd.h"
#include "engine/ops.h"

namespace mammoth::models {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  fs::path p = fs::path(base ? base : fs::temp_directory_path().string()) / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

TEST_CASE("registry knows every family's tiny and real configs") {
  for (const std::string name :
       {"gpt2-tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-tiny", "llama-7b",
        "llama-70b", "mistral-tiny", "qwen2-tiny", "bert-tiny", "bert-base", "bert-large",
        "vit-tiny", "vit-base-patch16-224", "vit-large-patch16-224", "vit-huge-patch16-224"}) {
    INFO(name);
    CHECK(is_registered(name));
    CHECK_NOTHROW(resolve_config(name).validate());
  }
  const ModelConfig l = resolve_config("llama-70b");
  CHECK(l.n_kv_head == 8);
  CHECK(l.n_head == 64);
  CHECK_THROWS_WITH(resolve_config("gpt5"), Catch::Contains("gpt2-tiny"));
}

TEST_CASE("options override vocab, sequence length, dropout; bad values name the field") {
  auto m = create_language_model("gpt2-tiny", {.vocab_size = 777, .max_seq = 32, .dropout = 0.1});
  CHECK(m->config().vocab_size == 777);
  CHECK(m->config().max_seq == 32);
  CHECK(m->config().dropout == 0.1);
  CHECK_THROWS_WITH(create_model("gpt2-tiny", {.vocab_size = 0}), Catch::Contains("vocab_size"));
  CHECK_THROWS_WITH(create_language_model("vit-tiny"), Catch::Contains("not a language model"));
}

TEST_CASE("HF config.json of each family parses to the same config") {
  for (const std::string name : {"gpt2", "llama-70b", "bert-base", "vit-base-patch16-224"}) {
    INFO(name);
    const ModelConfig c = resolve_config(name);
    const ModelConfig back =
        config_from_hf_json(json::parse(json::dump(config_to_hf_json(c))), "test");
    CHECK(back.family == c.family);
    CHECK(back.vocab_size == c.vocab_size);
    CHECK(back.n_layer == c.n_layer);
    CHECK(back.n_head == c.n_head);
    CHECK(back.n_kv_head == c.n_kv_head);
    CHECK(back.d_model == c.d_model);
    CHECK(back.d_ff == c.d_ff);
    CHECK(back.max_seq == c.max_seq);
    CHECK(back.norm_eps == c.norm_eps);
    CHECK(back.rope_base == c.rope_base);
    CHECK(back.tie_embeddings == c.tie_embeddings);
    CHECK(back.num_labels == c.num_labels);
    CHECK(back.image_size == c.image_size);
    CHECK(back.patch_size == c.patch_size);
  }
}

TEST_CASE("Mistral and Qwen2 config.json: LLaMA-like, written back as their model_type") {
  using V = ModelConfig::LlamaVariant;
  for (const std::string name : {"mistral-tiny", "qwen2-tiny"}) {
    INFO(name);
    const ModelConfig c = resolve_config(name);
    const json::Value hf = config_to_hf_json(c);
    CHECK(hf.at("model_type").as_string() == (name == "mistral-tiny" ? "mistral" : "qwen2"));
    const ModelConfig back = config_from_hf_json(json::parse(json::dump(hf)), "test");
    CHECK(back.family == Family::kLlama);
    CHECK(back.llama_variant == c.llama_variant);
    CHECK(back.sliding_window == c.sliding_window);
    CHECK(back.qkv_bias == c.qkv_bias);
    CHECK(back.tie_embeddings == c.tie_embeddings);
  }
  CHECK(resolve_config("mistral-tiny").sliding_window == 16);
  CHECK(resolve_config("qwen2-tiny").llama_variant == V::kQwen2);
  const std::string base = R"("vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
      "num_attention_heads": 4, "intermediate_size": 48)";
  auto parse = [&](const std::string& extra) {
    return config_from_hf_json(json::parse("{" + base + ", " + extra + "}"), "x");
  };
  // null: full attention, as transformers reads it.
  CHECK(parse(R"("model_type": "mistral", "sliding_window": null)").sliding_window == 0);
  CHECK(parse(R"("model_type": "mistral", "sliding_window": 7)").sliding_window == 7);
  CHECK_THROWS_WITH(parse(R"("model_type": "mistral", "rope_scaling": null)"),
                    Catch::Contains("'rope_scaling'"));
  CHECK_THROWS_WITH(parse(R"("model_type": "qwen2", "use_sliding_window": true)"),
                    Catch::Contains("use_sliding_window=true"));
  const ModelConfig q = parse(
      R"("model_type": "qwen2", "use_sliding_window": false, "sliding_window": 4096,
         "max_window_layers": 28, "tie_word_embeddings": true)");
  CHECK(q.qkv_bias);
  CHECK(q.sliding_window == 0);
  CHECK(q.tie_embeddings);
  CHECK_THROWS_WITH(parse(R"("model_type": "qwen2", "head_dim": 8)"),
                    Catch::Contains("'head_dim'"));
  // The bias exists as HF names it.
  bool found = false;
  for (const auto& [n, t] : create_model("qwen2-tiny")->named_parameters())
    found = found || n == "model.layers.0.self_attn.k_proj.bias";
  CHECK(found);
}

TEST_CASE("a real GPT-2 config.json (HF hub layout) is read") {
  const std::string text =
      R"({"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256,
    "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024,
    "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1,
    "vocab_size": 50257})";
  const ModelConfig c = config_from_hf_json(json::parse(text), "gpt2");
  CHECK(c.d_model == 768);
  CHECK(c.d_ff == 3072);
  CHECK(c.max_seq == 1024);
  CHECK_THROWS_WITH(config_from_hf_json(json::parse(R"({"model_type": "t5"})"), "x"),
                    Catch::Contains("t5"));
}

TEST_CASE("save_pretrained then create_model(dir) reproduces the model") {
  for (const std::string name : {"gpt2-tiny", "llama-tiny", "bert-tiny", "vit-tiny"}) {
    INFO(name);
    const std::string dir = temp_dir("pretrained_" + name);
    auto a = create_model(name, {.seed = 11});
    save_pretrained(*a, dir);
    auto b = create_model(dir, {.seed = 99});  // weights come from the file, not the seed
    CHECK(b->config().family == a->config().family);
    auto pa = a->named_parameters(), pb = b->named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i].first);
      CHECK(pa[i].first == pb[i].first);
      CHECK(engine::max_abs(pa[i].second - pb[i].second) == 0.0);
    }
  }
}

}  // namespace
}  // namespace mammoth::models

namespace mammoth::models {
namespace {

TEST_CASE("BERT's special tokens: registered ids, config.json round trip, tokenizer files") {
  const ModelConfig tiny = resolve_config("bert-tiny"), base = resolve_config("bert-base");
  CHECK(tiny.special_tokens == SpecialTokenIds{.pad = 0, .unk = 1, .cls = 2, .sep = 3, .mask = 4});
  CHECK(base.special_tokens ==
        SpecialTokenIds{.pad = 0, .unk = 100, .cls = 101, .sep = 102, .mask = 103});
  CHECK(base.special_tokens.ids() == std::vector<int64_t>{0, 100, 101, 102, 103});
  CHECK(resolve_config("gpt2-tiny").special_tokens.ids().empty());
  // config.json carries them (BertConfig's pad_token_id, the rest as extra attributes).
  const json::Value hf = config_to_hf_json(base);
  CHECK(hf.at("mask_token_id").as_int() == 103);
  CHECK(config_from_hf_json(hf, "x").special_tokens == base.special_tokens);
  // Options replace them (train's embedded corpus appends [MASK] to its BPE).
  const ModelConfig extended = apply_options(
      tiny, {.vocab_size = 101, .special_tokens = SpecialTokenIds{.sep = 99, .mask = 100}});
  CHECK(extended.special_tokens.ids() == std::vector<int64_t>{99, 100});
  // A directory whose config.json names no [MASK]: tokenizer.json's added tokens name it, or
  // else WordPiece's vocab.txt.
  json::Value plain = config_to_hf_json(tiny);
  for (const char* key : {"unk_token_id", "cls_token_id", "sep_token_id", "mask_token_id"})
    plain.set(key, json::Value());
  const std::string a = temp_dir("bert_tokenizer_json"), b = temp_dir("bert_vocab_txt"),
                    c = temp_dir("bert_no_mask");
  for (const std::string& dir : {a, b, c}) std::ofstream(dir + "/config.json") << json::dump(plain);
  std::ofstream(a + "/tokenizer.json")
      << R"({"added_tokens": [{"id": 7, "content": "[MASK]"}, {"id": 6, "content": "[CLS]"}]})";
  std::ofstream(b + "/vocab.txt") << "[PAD]\n[UNK]\nhello\n[SEP]\n[MASK]\n";
  CHECK(resolve_config(a).special_tokens == SpecialTokenIds{.pad = 0, .cls = 6, .mask = 7});
  CHECK(resolve_config(b).special_tokens ==
        SpecialTokenIds{.pad = 0, .unk = 1, .sep = 3, .mask = 4});
  CHECK(resolve_config(c).special_tokens == SpecialTokenIds{.pad = 0});
}

}  // namespace
}  // namespace mammoth::models
