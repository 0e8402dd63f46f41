#include "models/registry.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "base/error.h"
#include "models/bert/bert.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"
#include "models/vit/vit.h"
#include "models/weights.h"

namespace mammoth::models {
namespace {

ModelConfig gpt2(const std::string& name, int64_t vocab, int64_t layers, int64_t heads, int64_t d,
                 int64_t seq, double dropout) {
  ModelConfig c;
  c.name = name;
  c.family = Family::kGpt2;
  c.vocab_size = vocab;
  c.n_layer = layers;
  c.n_head = c.n_kv_head = heads;
  c.d_model = d;
  c.d_ff = 4 * d;
  c.max_seq = seq;
  c.norm_eps = 1e-5;
  c.tie_embeddings = true;
  c.dropout = c.attn_dropout = dropout;
  return c;
}

ModelConfig llama(const std::string& name, int64_t vocab, int64_t layers, int64_t heads,
                  int64_t kv_heads, int64_t d, int64_t ff, int64_t seq, double eps,
                  double rope_base) {
  ModelConfig c;
  c.name = name;
  c.family = Family::kLlama;
  c.vocab_size = vocab;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_kv_head = kv_heads;
  c.d_model = d;
  c.d_ff = ff;
  c.max_seq = seq;
  c.norm_eps = eps;
  c.rope_base = rope_base;
  c.tie_embeddings = false;
  return c;
}

ModelConfig bert(const std::string& name, int64_t vocab, int64_t layers, int64_t heads, int64_t d,
                 int64_t seq, double dropout, SpecialTokenIds special) {
  ModelConfig c;
  c.special_tokens = special;
  c.name = name;
  c.family = Family::kBert;
  c.vocab_size = vocab;
  c.n_layer = layers;
  c.n_head = c.n_kv_head = heads;
  c.d_model = d;
  c.d_ff = 4 * d;
  c.max_seq = seq;
  c.norm_eps = 1e-12;
  c.tie_embeddings = true;
  c.dropout = c.attn_dropout = dropout;
  c.type_vocab_size = 2;
  c.num_labels = 2;
  return c;
}

ModelConfig vit(const std::string& name, int64_t image, int64_t patch, int64_t layers,
                int64_t heads, int64_t d, int64_t labels) {
  ModelConfig c;
  c.name = name;
  c.family = Family::kVit;
  c.n_layer = layers;
  c.n_head = c.n_kv_head = heads;
  c.d_model = d;
  c.d_ff = 4 * d;
  c.norm_eps = 1e-12;
  c.tie_embeddings = false;
  c.image_size = image;
  c.patch_size = patch;
  c.num_channels = 3;
  c.num_labels = labels;
  return c;
}

constexpr SpecialTokenIds kBertUncased = {
    .pad = 0, .unk = 100, .cls = 101, .sep = 102, .mask = 103};

const std::vector<ModelConfig>& registry() {
  static const std::vector<ModelConfig> r = {
      // The default model of `mammoth train` on a laptop's CPU: ~0.9M parameters.
      gpt2("gpt2-tiny", 1024, 4, 4, 128, 128, 0.0),
      gpt2("gpt2", 50257, 12, 12, 768, 1024, 0.1),
      gpt2("gpt2-medium", 50257, 24, 16, 1024, 1024, 0.1),
      gpt2("gpt2-large", 50257, 36, 20, 1280, 1024, 0.1),
      gpt2("gpt2-xl", 50257, 48, 25, 1600, 1024, 0.1),
      llama("llama-tiny", 512, 2, 4, 2, 64, 172, 128, 1e-6, 10000.0),
      llama("llama-7b", 32000, 32, 32, 32, 4096, 11008, 4096, 1e-5, 10000.0),
      llama("llama-13b", 32000, 40, 40, 40, 5120, 13824, 4096, 1e-5, 10000.0),
      llama("llama-70b", 32000, 80, 64, 8, 8192, 28672, 4096, 1e-5, 10000.0),
      llama("llama3-8b", 128256, 32, 32, 8, 4096, 14336, 8192, 1e-5, 500000.0),
      llama("llama3-70b", 128256, 80, 64, 8, 8192, 28672, 8192, 1e-5, 500000.0),
      // A small WordPiece vocabulary trained with BERT's special tokens first (what Hugging
      // Face `tokenizers` gives): [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4. In the ids of
      // `mammoth data`'s byte-level BPE these are the control bytes 0x00-0x04, absent from text.
      bert("bert-tiny", 512, 2, 4, 64, 128, 0.0,
           {.pad = 0, .unk = 1, .cls = 2, .sep = 3, .mask = 4}),
      // bert-base-uncased's vocabulary: [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103.
      bert("bert-base", 30522, 12, 12, 768, 512, 0.1, kBertUncased),
      bert("bert-large", 30522, 24, 16, 1024, 512, 0.1, kBertUncased),
      vit("vit-tiny", 32, 8, 2, 4, 64, 10),
      vit("vit-base-patch16-224", 224, 16, 12, 12, 768, 1000),
      vit("vit-large-patch16-224", 224, 16, 24, 16, 1024, 1000),
      vit("vit-huge-patch16-224", 224, 16, 32, 16, 1280, 1000),
      vit("vit-huge-patch14-224", 224, 14, 32, 16, 1280, 1000),
  };
  return r;
}

int64_t get_int(const json::Value& hf, const char* key, int64_t fallback) {
  const json::Value* v = hf.find(key);
  return v == nullptr || v->is_null() ? fallback : v->as_int();
}

double get_double(const json::Value& hf, const char* key, double fallback) {
  const json::Value* v = hf.find(key);
  return v == nullptr || v->is_null() ? fallback : v->as_double();
}

void check_activation(const json::Value& hf, const char* key, const std::string& expected,
                      const std::string& what) {
  const json::Value* v = hf.find(key);
  if (v == nullptr || v->is_null()) return;
  MAMMOTH_CHECK(v->as_string() == expected)
      << "[config_from_hf_json] " << what << ": " << key << " '" << v->as_string()
      << "' is not supported (this family implements '" << expected << "')";
}

int64_t num_labels_of(const json::Value& hf, int64_t fallback) {
  if (const json::Value* v = hf.find("id2label"); v != nullptr && v->is_object())
    return static_cast<int64_t>(v->size());
  return get_int(hf, "num_labels", fallback);
}

// BERT's special tokens by their spelling in the directory's tokenizer (tokenizer.json's
// added_tokens, else WordPiece's vocab.txt, one token per line), for the ids config.json does
// not give.
void special_tokens_from_tokenizer(const std::filesystem::path& dir, SpecialTokenIds* st) {
  const std::pair<const char*, int64_t*> names[] = {{"[PAD]", &st->pad},
                                                    {"[UNK]", &st->unk},
                                                    {"[CLS]", &st->cls},
                                                    {"[SEP]", &st->sep},
                                                    {"[MASK]", &st->mask}};
  auto found = [&](const std::string& token, int64_t id) {
    for (const auto& [name, field] : names)
      if (token == name && *field < 0) *field = id;
  };
  const std::filesystem::path tokenizer = dir / "tokenizer.json", vocab = dir / "vocab.txt";
  if (std::filesystem::exists(tokenizer)) {
    const json::Value t = json::parse_file(tokenizer.string());
    if (const json::Value* added = t.find("added_tokens"); added != nullptr && added->is_array()) {
      for (const json::Value& a : *added) {
        const json::Value* id = a.find("id");
        const json::Value* content = a.find("content");
        if (id != nullptr && content != nullptr) found(content->as_string(), id->as_int());
      }
    }
  } else if (std::filesystem::exists(vocab)) {
    std::ifstream in(vocab);
    std::string line;
    for (int64_t id = 0; std::getline(in, line); ++id) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      found(line, id);
    }
  }
}

}  // namespace

std::vector<std::string> registered_names() {
  std::vector<std::string> out;
  for (const ModelConfig& c : registry()) out.push_back(c.name);
  return out;
}

bool is_registered(const std::string& name) {
  for (const ModelConfig& c : registry())
    if (c.name == name) return true;
  return false;
}

ModelConfig config_from_hf_json(const json::Value& hf, const std::string& what) {
  MAMMOTH_CHECK(hf.is_object()) << "[config_from_hf_json] " << what << " is not a JSON object";
  const std::string type = hf.at("model_type").as_string();
  ModelConfig c;
  c.name = what;
  if (type == "gpt2") {
    c.family = Family::kGpt2;
    c.vocab_size = hf.at("vocab_size").as_int();
    c.max_seq = hf.at("n_positions").as_int();
    c.d_model = hf.at("n_embd").as_int();
    c.n_layer = hf.at("n_layer").as_int();
    c.n_head = c.n_kv_head = hf.at("n_head").as_int();
    c.d_ff = get_int(hf, "n_inner", 4 * c.d_model);
    c.norm_eps = get_double(hf, "layer_norm_epsilon", 1e-5);
    c.dropout = get_double(hf, "resid_pdrop", 0.1);
    c.attn_dropout = get_double(hf, "attn_pdrop", 0.1);
    c.tie_embeddings = true;
    check_activation(hf, "activation_function", "gelu_new", what);
  } else if (type == "llama") {
    c.family = Family::kLlama;
    c.vocab_size = hf.at("vocab_size").as_int();
    c.d_model = hf.at("hidden_size").as_int();
    c.n_layer = hf.at("num_hidden_layers").as_int();
    c.n_head = hf.at("num_attention_heads").as_int();
    c.n_kv_head = get_int(hf, "num_key_value_heads", c.n_head);
    c.d_ff = hf.at("intermediate_size").as_int();
    c.max_seq = get_int(hf, "max_position_embeddings", 2048);
    c.norm_eps = get_double(hf, "rms_norm_eps", 1e-6);
    c.rope_base = get_double(hf, "rope_theta", 10000.0);
    c.attn_dropout = get_double(hf, "attention_dropout", 0.0);
    const json::Value* tie = hf.find("tie_word_embeddings");
    c.tie_embeddings = tie != nullptr && !tie->is_null() && tie->as_bool();
    check_activation(hf, "hidden_act", "silu", what);
    if (const json::Value* rs = hf.find("rope_scaling"); rs != nullptr && !rs->is_null()) {
      MAMMOTH_THROW() << "[config_from_hf_json] " << what
                      << ": rope_scaling is not supported (plain rotary embeddings only)";
    }
    if (int64_t hd = get_int(hf, "head_dim", c.d_model / c.n_head); hd != c.d_model / c.n_head) {
      MAMMOTH_THROW() << "[config_from_hf_json] " << what << ": head_dim " << hd
                      << " != hidden_size / num_attention_heads is not supported";
    }
    for (const char* key : {"attention_bias", "mlp_bias"}) {
      const json::Value* b = hf.find(key);
      MAMMOTH_CHECK(b == nullptr || b->is_null() || !b->as_bool())
          << "[config_from_hf_json] " << what << ": " << key << "=true is not supported";
    }
  } else if (type == "bert" || type == "vit") {
    c.family = type == "bert" ? Family::kBert : Family::kVit;
    c.d_model = hf.at("hidden_size").as_int();
    c.n_layer = hf.at("num_hidden_layers").as_int();
    c.n_head = c.n_kv_head = hf.at("num_attention_heads").as_int();
    c.d_ff = hf.at("intermediate_size").as_int();
    c.norm_eps = get_double(hf, "layer_norm_eps", 1e-12);
    c.dropout = get_double(hf, "hidden_dropout_prob", type == "bert" ? 0.1 : 0.0);
    c.attn_dropout = get_double(hf, "attention_probs_dropout_prob", type == "bert" ? 0.1 : 0.0);
    check_activation(hf, "hidden_act", "gelu", what);
    c.num_labels = num_labels_of(hf, 2);
    if (type == "bert") {
      c.vocab_size = hf.at("vocab_size").as_int();
      c.max_seq = get_int(hf, "max_position_embeddings", 512);
      c.type_vocab_size = get_int(hf, "type_vocab_size", 2);
      c.tie_embeddings = true;
      c.special_tokens = {.pad = get_int(hf, "pad_token_id", -1),
                          .unk = get_int(hf, "unk_token_id", -1),
                          .cls = get_int(hf, "cls_token_id", -1),
                          .sep = get_int(hf, "sep_token_id", -1),
                          .mask = get_int(hf, "mask_token_id", -1)};
      if (const json::Value* pe = hf.find("position_embedding_type"); pe && !pe->is_null()) {
        MAMMOTH_CHECK(pe->as_string() == "absolute")
            << "[config_from_hf_json] " << what << ": position_embedding_type '" << pe->as_string()
            << "' is not supported";
      }
    } else {
      c.image_size = get_int(hf, "image_size", 224);
      c.patch_size = get_int(hf, "patch_size", 16);
      c.num_channels = get_int(hf, "num_channels", 3);
      c.tie_embeddings = false;
      const json::Value* qkv = hf.find("qkv_bias");
      MAMMOTH_CHECK(qkv == nullptr || qkv->is_null() || qkv->as_bool())
          << "[config_from_hf_json] " << what << ": qkv_bias=false is not supported";
    }
  } else {
    MAMMOTH_THROW() << "[config_from_hf_json] " << what << ": model_type '" << type
                    << "' is not supported (gpt2, llama, bert, vit)";
  }
  c.validate();
  return c;
}

json::Value config_to_hf_json(const ModelConfig& c) {
  json::Value v = json::Value::object();
  v.set("model_type", family_name(c.family));
  switch (c.family) {
    case Family::kGpt2:
      v.set("architectures", json::Value::array().push_back("GPT2LMHeadModel"));
      v.set("vocab_size", c.vocab_size).set("n_positions", c.max_seq).set("n_ctx", c.max_seq);
      v.set("n_embd", c.d_model).set("n_layer", c.n_layer).set("n_head", c.n_head);
      v.set("n_inner", c.d_ff).set("layer_norm_epsilon", c.norm_eps);
      v.set("resid_pdrop", c.dropout).set("embd_pdrop", c.dropout);
      v.set("attn_pdrop", c.attn_dropout).set("activation_function", "gelu_new");
      v.set("tie_word_embeddings", true);
      break;
    case Family::kLlama:
      v.set("architectures", json::Value::array().push_back("LlamaForCausalLM"));
      v.set("vocab_size", c.vocab_size).set("hidden_size", c.d_model);
      v.set("num_hidden_layers", c.n_layer).set("num_attention_heads", c.n_head);
      v.set("num_key_value_heads", c.n_kv_head).set("intermediate_size", c.d_ff);
      v.set("max_position_embeddings", c.max_seq).set("rms_norm_eps", c.norm_eps);
      v.set("rope_theta", c.rope_base).set("hidden_act", "silu");
      v.set("tie_word_embeddings", c.tie_embeddings);
      v.set("attention_dropout", c.attn_dropout);
      break;
    case Family::kBert:
    case Family::kVit: {
      const bool bert = c.family == Family::kBert;
      v.set("architectures",
            json::Value::array().push_back(bert ? "BertForMaskedLM" : "ViTForImageClassification"));
      v.set("hidden_size", c.d_model).set("num_hidden_layers", c.n_layer);
      v.set("num_attention_heads", c.n_head).set("intermediate_size", c.d_ff);
      v.set("hidden_act", "gelu").set("layer_norm_eps", c.norm_eps);
      v.set("hidden_dropout_prob", c.dropout);
      v.set("attention_probs_dropout_prob", c.attn_dropout);
      json::Value labels = json::Value::object();
      for (int64_t i = 0; i < c.num_labels; ++i)
        labels.set(std::to_string(i), "LABEL_" + std::to_string(i));
      v.set("id2label", std::move(labels));
      if (bert) {
        v.set("vocab_size", c.vocab_size).set("max_position_embeddings", c.max_seq);
        v.set("type_vocab_size", c.type_vocab_size);
        v.set("position_embedding_type", "absolute");
        // pad_token_id is BertConfig's own; the others are kept by PretrainedConfig as extra
        // attributes, so the masked-LM rule's tokens travel with the model directory.
        const SpecialTokenIds& st = c.special_tokens;
        const std::pair<const char*, int64_t> special[] = {{"pad_token_id", st.pad},
                                                           {"unk_token_id", st.unk},
                                                           {"cls_token_id", st.cls},
                                                           {"sep_token_id", st.sep},
                                                           {"mask_token_id", st.mask}};
        for (const auto& [key, id] : special)
          if (id >= 0) v.set(key, id);
      } else {
        v.set("image_size", c.image_size).set("patch_size", c.patch_size);
        v.set("num_channels", c.num_channels).set("qkv_bias", true);
      }
      break;
    }
  }
  v.set("torch_dtype", c.dtype == DType::kBF16  ? "bfloat16"
                       : c.dtype == DType::kF16 ? "float16"
                                                : "float32");
  return v;
}

ModelConfig resolve_config(const std::string& name_or_dir) {
  for (const ModelConfig& c : registry())
    if (c.name == name_or_dir) return c;
  namespace fs = std::filesystem;
  if (fs::is_directory(name_or_dir)) {
    const std::string path = (fs::path(name_or_dir) / "config.json").string();
    MAMMOTH_CHECK(fs::exists(path)) << "[models] directory '" << name_or_dir
                                    << "' has no config.json (Hugging Face layout expected)";
    ModelConfig c = config_from_hf_json(json::parse_file(path), name_or_dir);
    if (c.family == Family::kBert && c.special_tokens.mask < 0)
      special_tokens_from_tokenizer(name_or_dir, &c.special_tokens);
    return c;
  }
  std::ostringstream known;
  for (const ModelConfig& c : registry()) known << " " << c.name;
  MAMMOTH_THROW() << "[models] '" << name_or_dir
                  << "' is neither a registered model nor a directory with config.json; known:"
                  << known.str();
}

ModelConfig apply_options(ModelConfig c, const ModelOptions& o) {
  if (o.vocab_size) c.vocab_size = *o.vocab_size;
  if (o.max_seq) c.max_seq = *o.max_seq;
  if (o.dropout) c.dropout = c.attn_dropout = *o.dropout;
  if (o.num_labels) c.num_labels = *o.num_labels;
  if (o.dtype) c.dtype = *o.dtype;
  if (o.special_tokens) c.special_tokens = *o.special_tokens;
  c.validate();
  return c;
}

std::shared_ptr<Model> build_model(const ModelConfig& config, uint64_t seed) {
  std::shared_ptr<Model> m;
  switch (config.family) {
    case Family::kGpt2:
      m = std::make_shared<Gpt2>(config);
      break;
    case Family::kLlama:
      m = std::make_shared<Llama>(config);
      break;
    case Family::kBert:
      m = std::make_shared<Bert>(config);
      break;
    case Family::kVit:
      m = std::make_shared<Vit>(config);
      break;
  }
  m->init(seed);
  return m;
}

std::shared_ptr<Model> create_model(const std::string& name_or_dir, const ModelOptions& options) {
  const ModelConfig config = apply_options(resolve_config(name_or_dir), options);
  std::shared_ptr<Model> m = build_model(config, options.seed);
  namespace fs = std::filesystem;
  if (options.load_weights && fs::is_directory(name_or_dir) && !is_registered(name_or_dir)) {
    const fs::path weights = fs::path(name_or_dir) / "model.safetensors";
    if (fs::exists(weights)) load_weights(*m, weights.string());
  }
  return m;
}

std::shared_ptr<LanguageModel> create_language_model(const std::string& name_or_dir,
                                                     const ModelOptions& options) {
  std::shared_ptr<Model> m = create_model(name_or_dir, options);
  auto lm = std::dynamic_pointer_cast<LanguageModel>(m);
  MAMMOTH_CHECK(lm != nullptr) << "[create_language_model] '" << name_or_dir << "' is a "
                               << family_name(m->config().family) << " model, not a language model";
  return lm;
}

void save_pretrained(const Model& model, const std::string& dir) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const std::string config_path = (fs::path(dir) / "config.json").string();
  {
    std::ofstream out(config_path);
    out << json::dump(config_to_hf_json(model.config()), 2) << "\n";
    MAMMOTH_CHECK(out.good()) << "[save_pretrained] cannot write " << config_path;
  }
  save_weights(model, (fs::path(dir) / "model.safetensors").string());
}

}  // namespace mammoth::models
