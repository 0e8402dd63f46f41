#include "models/registry.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "base/error.h"
#include "models/family.h"
#include "models/weights.h"

namespace mammoth::models {
namespace hf {

int64_t get_int(const json::Value& hf, const char* key, int64_t fallback) {
  const json::Value* v = hf.find(key);
  return v == nullptr || v->is_null() ? fallback : v->as_int();
}

double get_double(const json::Value& hf, const char* key, double fallback) {
  const json::Value* v = hf.find(key);
  return v == nullptr || v->is_null() ? fallback : v->as_double();
}

bool get_bool(const json::Value& hf, const char* key, bool fallback) {
  const json::Value* v = hf.find(key);
  return v == nullptr || v->is_null() ? fallback : v->as_bool();
}

void check_activation(const json::Value& hf, const char* key,
                      std::initializer_list<const char*> same, const std::string& what) {
  const json::Value* v = hf.find(key);
  if (v == nullptr || v->is_null()) return;
  std::string known;
  for (const char* s : same) {
    if (v->as_string() == s) return;
    known += (known.empty() ? "'" : "' or '") + std::string(s);
  }
  MAMMOTH_THROW() << "[config_from_hf_json] " << what << ": " << key << " '" << v->as_string()
                  << "' is not supported (this family implements " << known << "')";
}

void require_bool(const json::Value& hf, const char* key, bool only, const std::string& what) {
  const json::Value* v = hf.find(key);
  MAMMOTH_CHECK(v == nullptr || v->is_null() || v->as_bool() == only)
      << "[config_from_hf_json] " << what << ": " << key << "=" << (only ? "false" : "true")
      << " is not supported";
}

namespace {

// Keys of every family that do not change what the model computes from its weights: names,
// token ids, label names, generation defaults, the file's dtype, caching and output switches,
// and the initialiser's scale (it shapes fresh weights only; loaded weights do not depend on it).
const std::set<std::string>& inert_keys() {
  static const std::set<std::string> k = {"_attn_implementation",
                                          "_attn_implementation_autoset",
                                          "_commit_hash",
                                          "_name_or_path",
                                          "architectures",
                                          "bad_words_ids",
                                          "begin_suppress_tokens",
                                          "bos_token_id",
                                          "chunk_size_feed_forward",
                                          "cls_token_id",
                                          "decoder_start_token_id",
                                          "diversity_penalty",
                                          "do_sample",
                                          "early_stopping",
                                          "encoder_no_repeat_ngram_size",
                                          "eos_token_id",
                                          "exponential_decay_length_penalty",
                                          "finetuning_task",
                                          "forced_bos_token_id",
                                          "forced_eos_token_id",
                                          "gradient_checkpointing",
                                          "id2label",
                                          "initializer_range",
                                          "label2id",
                                          "length_penalty",
                                          "mask_token_id",
                                          "max_length",
                                          "min_length",
                                          "model_type",
                                          "no_repeat_ngram_size",
                                          "num_beam_groups",
                                          "num_beams",
                                          "num_return_sequences",
                                          "output_attentions",
                                          "output_hidden_states",
                                          "output_scores",
                                          "pad_token_id",
                                          "prefix",
                                          "remove_invalid_values",
                                          "repetition_penalty",
                                          "return_dict",
                                          "return_dict_in_generate",
                                          "sep_token_id",
                                          "suppress_tokens",
                                          "task_specific_params",
                                          "temperature",
                                          "tf_legacy_loss",
                                          "tie_encoder_decoder",
                                          "tokenizer_class",
                                          "top_k",
                                          "top_p",
                                          "torch_dtype",
                                          "torchscript",
                                          "transformers_version",
                                          "typical_p",
                                          "unk_token_id",
                                          "use_bfloat16",
                                          "use_cache"};
  return k;
}

const std::set<std::string> kCommonConditional = {
    "is_encoder_decoder",          "add_cross_attention", "is_decoder", "pruned_heads",
    "cross_attention_hidden_size", "problem_type",        "num_labels"};

}  // namespace

void check_keys(const json::Value& hf, std::set<std::string> known, const std::string& type,
                const std::string& what) {
  known.insert(kCommonConditional.begin(), kCommonConditional.end());
  std::string unknown;
  for (const json::Value& m : hf) {
    if (known.count(m.key()) || inert_keys().count(m.key())) continue;
    unknown += (unknown.empty() ? "'" : ", '") + m.key() + "'";
  }
  MAMMOTH_CHECK(unknown.empty())
      << "[config_from_hf_json] " << what << ": config.json key(s) " << unknown
      << " not supported for model_type '" << type
      << "' (they may change the computation, so they are refused rather than ignored)";
}

void check_common(const json::Value& hf, bool encoder, const std::string& what) {
  require_bool(hf, "is_encoder_decoder", false, what);
  require_bool(hf, "add_cross_attention", false, what);
  if (encoder) require_bool(hf, "is_decoder", false, what);  // a causal mask for BERT
  if (const json::Value* v = hf.find("pruned_heads"); v != nullptr && !v->is_null()) {
    MAMMOTH_CHECK(v->empty()) << "[config_from_hf_json] " << what
                              << ": pruned_heads is not supported (every head is kept)";
  }
  if (const json::Value* v = hf.find("cross_attention_hidden_size"); v && !v->is_null()) {
    MAMMOTH_THROW() << "[config_from_hf_json] " << what
                    << ": cross_attention_hidden_size is not supported";
  }
  if (const json::Value* v = hf.find("problem_type"); encoder && v != nullptr && !v->is_null()) {
    MAMMOTH_CHECK(v->as_string() == "single_label_classification")
        << "[config_from_hf_json] " << what << ": problem_type '" << v->as_string()
        << "' is not supported (the classifier's loss is single-label cross-entropy)";
  }
}

int64_t num_labels_of(const json::Value& hf, int64_t fallback) {
  if (const json::Value* v = hf.find("id2label"); v != nullptr && v->is_object())
    return static_cast<int64_t>(v->size());
  return get_int(hf, "num_labels", fallback);
}

void read_encoder(const json::Value& hf, std::set<std::string> keys, const std::string& type,
                  const std::string& what, double dropout, ModelConfig& c) {
  keys.insert({"hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
               "hidden_act", "hidden_dropout_prob", "layer_norm_eps",
               "attention_probs_dropout_prob"});
  check_keys(hf, std::move(keys), type, what);
  check_common(hf, true, what);
  c.d_model = hf.at("hidden_size").as_int();
  c.n_layer = hf.at("num_hidden_layers").as_int();
  c.n_head = c.n_kv_head = hf.at("num_attention_heads").as_int();
  c.d_ff = hf.at("intermediate_size").as_int();
  c.norm_eps = get_double(hf, "layer_norm_eps", 1e-12);
  c.dropout = get_double(hf, "hidden_dropout_prob", dropout);
  c.attn_dropout = get_double(hf, "attention_probs_dropout_prob", dropout);
  check_activation(hf, "hidden_act", {"gelu", "gelu_python"}, what);
  c.num_labels = num_labels_of(hf, 2);
}

void write_encoder(const ModelConfig& c, const char* architecture, json::Value& v) {
  v.set("architectures", json::Value::array().push_back(architecture));
  v.set("hidden_size", c.d_model).set("num_hidden_layers", c.n_layer);
  v.set("num_attention_heads", c.n_head).set("intermediate_size", c.d_ff);
  v.set("hidden_act", "gelu").set("layer_norm_eps", c.norm_eps);
  v.set("hidden_dropout_prob", c.dropout);
  v.set("attention_probs_dropout_prob", c.attn_dropout);
  json::Value labels = json::Value::object();
  for (int64_t i = 0; i < c.num_labels; ++i)
    labels.set(std::to_string(i), "LABEL_" + std::to_string(i));
  v.set("id2label", std::move(labels));
}

}  // namespace hf

namespace {

// Every registered config, in family (tag) order.
std::vector<const ModelConfig*> registry() {
  std::vector<const ModelConfig*> r;
  for (const FamilySpec& f : families())
    for (const ModelConfig& c : f.configs) r.push_back(&c);
  return r;
}

}  // namespace

std::vector<std::string> registered_names() {
  std::vector<std::string> out;
  for (const ModelConfig* c : registry()) out.push_back(c->name);
  return out;
}

bool is_registered(const std::string& name) {
  for (const ModelConfig* c : registry())
    if (c->name == name) return true;
  return false;
}

ModelConfig config_from_hf_json(const json::Value& hf, const std::string& what) {
  MAMMOTH_CHECK(hf.is_object()) << "[config_from_hf_json] " << what << " is not a JSON object";
  const std::string type = hf.at("model_type").as_string();
  const FamilySpec* spec = family_for_model_type(type);
  if (spec == nullptr) {
    std::string known;
    for (const FamilySpec& f : families())
      for (const std::string& t : f.hf_model_types) known += (known.empty() ? "" : ", ") + t;
    MAMMOTH_THROW() << "[config_from_hf_json] " << what << ": model_type '" << type
                    << "' is not supported (" << known << ")";
  }
  ModelConfig c;
  c.name = what;
  c.family = spec->family;
  spec->from_hf(hf, type, what, c);
  c.validate();
  return c;
}

json::Value config_to_hf_json(const ModelConfig& c) {
  json::Value v = json::Value::object();
  const FamilySpec& spec = family_spec(c.family);
  v.set("model_type", spec.name);
  spec.to_hf(c, v);
  v.set("torch_dtype", c.dtype == DType::kBF16  ? "bfloat16"
                       : c.dtype == DType::kF16 ? "float16"
                                                : "float32");
  return v;
}

ModelConfig resolve_config(const std::string& name_or_dir) {
  for (const ModelConfig* c : registry())
    if (c->name == name_or_dir) return *c;
  namespace fs = std::filesystem;
  if (fs::is_directory(name_or_dir)) {
    const std::string path = (fs::path(name_or_dir) / "config.json").string();
    MAMMOTH_CHECK(fs::exists(path)) << "[models] directory '" << name_or_dir
                                    << "' has no config.json (Hugging Face layout expected)";
    ModelConfig c = config_from_hf_json(json::parse_file(path), name_or_dir);
    const FamilySpec& spec = family_spec(c.family);
    if (spec.from_dir) spec.from_dir(name_or_dir, c);
    return c;
  }
  std::ostringstream known;
  for (const ModelConfig* c : registry()) known << " " << c->name;
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
  const bool experts = family_spec(c.family).experts;
  if (o.moe_capacity_factor) {
    MAMMOTH_CHECK(experts) << "[models] " << c.name
                           << ": a capacity factor needs a mixture-of-experts model, not "
                           << family_name(c.family);
    c.moe_capacity_factor = *o.moe_capacity_factor;
  }
  if (o.moe_aux_loss_coef) {
    MAMMOTH_CHECK(experts) << "[models] " << c.name
                           << ": an auxiliary-loss coefficient needs a mixture-of-experts "
                           << "model, not " << family_name(c.family);
    c.moe_aux_loss_coef = *o.moe_aux_loss_coef;
    c.moe_aux_loss = c.moe_aux_loss_coef > 0;
  }
  c.validate();
  return c;
}

std::shared_ptr<Model> build_model(const ModelConfig& config, uint64_t seed) {
  std::shared_ptr<Model> m = family_spec(config.family).build(config);
  m->init(seed);
  return m;
}

std::string find_weights(const std::string& dir) {
  namespace fs = std::filesystem;
  for (const char* name : {"model.safetensors", "model.safetensors.index.json"}) {
    const fs::path p = fs::path(dir) / name;
    if (fs::is_regular_file(p)) return p.string();
  }
  std::string others;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    const bool weights = n.ends_with(".safetensors") || n.ends_with(".bin") || n.ends_with(".pt") ||
                         n.ends_with(".pth") || n.ends_with(".index.json");
    if (weights) others += (others.empty() ? "" : ", ") + n;
  }
  MAMMOTH_THROW() << "[create_model] " << dir
                  << " has no weights: neither model.safetensors nor model.safetensors.index.json"
                  << (others.empty() ? "" : " (it holds " + others + ", which are not loaded)")
                  << "; pass fresh_init (--fresh-init) to start from freshly initialised weights";
}

std::shared_ptr<Model> create_model(const std::string& name_or_dir, const ModelOptions& options) {
  const ModelConfig config = apply_options(resolve_config(name_or_dir), options);
  std::shared_ptr<Model> m = build_model(config, options.seed);
  if (!options.load_weights) return m;
  MAMMOTH_CHECK(!options.fresh_init || options.weights.empty())
      << "[create_model] " << name_or_dir << ": fresh_init (--fresh-init) and weights ("
      << options.weights << ") exclude each other";
  std::string path = options.weights;
  if (path.empty() && !options.fresh_init && !is_registered(name_or_dir))
    path = find_weights(name_or_dir);
  std::string source;
  if (path.empty()) {
    source = "fresh initialisation (seed " + std::to_string(options.seed) + ")";
    if (!is_registered(name_or_dir)) source += "; the directory's weights are not read";
  } else {
    const WeightFiles files = WeightFiles::open(path);
    const LoadReport report = load_weights(*m, files);
    source = files.describe();
    if (!report.missing_optional.empty()) {
      source +=
          "; not in the files, so freshly initialised (seed " + std::to_string(options.seed) + "):";
      for (const std::string& name : report.missing_optional) source += " " + name;
    }
  }
  if (options.announce)
    std::fprintf(stderr, "[model] %s: weights: %s\n", name_or_dir.c_str(), source.c_str());
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

void save_pretrained(const Model& model, const std::string& dir,
                     const SavePretrainedOptions& options) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const int64_t max_shard_bytes = options.max_shard_bytes;
  ModelConfig config = model.config();
  engine::nn::NamedTensors params = model.named_parameters();
  HfLayout layout = model.hf_layout();
  const FamilySpec& spec = family_spec(config.family);
  if (!options.labels.empty()) {
    MAMMOTH_CHECK(spec.classifier)
        << "[save_pretrained] class labels are for classifiers, not " << family_name(config.family);
    MAMMOTH_CHECK(static_cast<int64_t>(options.labels.size()) == config.num_labels)
        << "[save_pretrained] " << options.labels.size() << " class labels for a model with "
        << config.num_labels;
    if (const std::string& drop = spec.classifier_drops_prefix; !drop.empty()) {
      const auto dropped = [&](const std::string& name) { return name.rfind(drop, 0) == 0; };
      std::erase_if(params, [&](const auto& p) { return dropped(p.first); });
      std::erase_if(layout.params, [&](const HfParam& p) { return dropped(p.param); });
    }
  }
  if (options.dtype) {
    MAMMOTH_CHECK(is_floating(*options.dtype))
        << "[save_pretrained] weights are saved as a floating dtype, not "
        << dtype_name(*options.dtype);
    config.dtype = *options.dtype;
    for (auto& [name, p] : params) p = p.detach().to(*options.dtype);
  }
  const std::string config_path = (fs::path(dir) / "config.json").string();
  {
    std::ofstream out(config_path);
    json::Value hf = config_to_hf_json(config);
    if (!options.labels.empty()) {
      if (!spec.classifier_architecture.empty()) {
        hf.set("architectures",
               json::Value::array().push_back(spec.classifier_architecture.c_str()));
      }
      json::Value id2label = json::Value::object(), label2id = json::Value::object();
      for (size_t i = 0; i < options.labels.size(); ++i) {
        id2label.set(std::to_string(i), options.labels[i]);
        label2id.set(options.labels[i], static_cast<int64_t>(i));
      }
      hf.set("id2label", std::move(id2label)).set("label2id", std::move(label2id));
    }
    out << json::dump(hf, 2) << "\n";
    MAMMOTH_CHECK(out.good()) << "[save_pretrained] cannot write " << config_path;
  }
  std::map<std::string, int64_t> bytes;
  int64_t total = 0;
  for (const auto& [name, p] : params) {
    bytes[name] = static_cast<int64_t>(p.nbytes());
    total += bytes[name];
  }
  // Shards as transformers cuts them: in order, a new one when the next tensor would overflow.
  std::vector<HfLayout> shards;
  if (max_shard_bytes > 0 && total > max_shard_bytes) {
    int64_t in_shard = 0;
    for (const HfParam& p : layout.params) {
      if (shards.empty() || (in_shard > 0 && in_shard + bytes.at(p.param) > max_shard_bytes)) {
        shards.push_back(layout);
        shards.back().params.clear();
        in_shard = 0;
      }
      shards.back().params.push_back(p);
      in_shard += bytes.at(p.param);
    }
  }
  std::error_code ec;
  if (shards.size() <= 1) {
    fs::remove(fs::path(dir) / "model.safetensors.index.json", ec);
    save_named(params, layout, (fs::path(dir) / "model.safetensors").string());
    return;
  }
  fs::remove(fs::path(dir) / "model.safetensors", ec);
  json::Value weight_map = json::Value::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    save_named(params, shards[k], (fs::path(dir) / file).string());
    for (const HfParam& p : shards[k].params) weight_map.set(p.hf_name, file);
  }
  json::Value index = json::Value::object();
  index.set("metadata", json::Value::object().set("total_size", total));
  index.set("weight_map", std::move(weight_map));
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  std::ofstream out(index_path);
  out << json::dump(index, 2) << "\n";
  MAMMOTH_CHECK(out.good()) << "[save_pretrained] cannot write " << index_path;
}

}  // namespace mammoth::models
