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
#include "models/bert/bert.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"
#include "models/mixtral/mixtral.h"
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

ModelConfig mistral(ModelConfig c, int64_t window) {
  c.llama_variant = ModelConfig::LlamaVariant::kMistral;
  c.sliding_window = window;
  return c;
}

ModelConfig qwen2(ModelConfig c, bool tied) {
  c.llama_variant = ModelConfig::LlamaVariant::kQwen2;
  c.qkv_bias = true;
  c.tie_embeddings = tied;
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

// Mixtral (models/mixtral): LLaMA's shape plus experts; the router's load-balancing loss on
// (HF's output_router_logits) at HF's default coefficient, no z-loss, dropless.
ModelConfig mixtral(const std::string& name, int64_t vocab, int64_t layers, int64_t heads,
                    int64_t kv_heads, int64_t d, int64_t ff, int64_t seq, int64_t experts,
                    int64_t top_k, double rope_base) {
  ModelConfig c = llama(name, vocab, layers, heads, kv_heads, d, ff, seq, 1e-5, rope_base);
  c.family = Family::kMixtral;
  c.moe_experts = experts;
  c.moe_top_k = top_k;
  c.moe_aux_loss = true;
  c.moe_aux_loss_coef = 0.001;
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
      // Tiny LLaMA-like variants for tests; mistral-tiny's window (16) is shorter than the
      // sequences its tests train on, so the window shapes the result.
      mistral(llama("mistral-tiny", 512, 2, 4, 2, 64, 172, 128, 1e-6, 10000.0), 16),
      qwen2(llama("qwen2-tiny", 512, 2, 4, 2, 64, 172, 128, 1e-6, 10000.0), true),
      // A small WordPiece vocabulary trained with BERT's special tokens first (what Hugging
      // Face `tokenizers` gives): [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4. In the ids of
      // `mammoth data`'s byte-level BPE these are the control bytes 0x00-0x04, absent from text.
      bert("bert-tiny", 512, 2, 4, 64, 128, 0.0,
           {.pad = 0, .unk = 1, .cls = 2, .sep = 3, .mask = 4}),
      // bert-base-uncased's vocabulary: [PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103.
      bert("bert-base", 30522, 12, 12, 768, 512, 0.1, kBertUncased),
      bert("bert-large", 30522, 24, 16, 1024, 512, 0.1, kBertUncased),
      mixtral("mixtral-tiny", 512, 2, 4, 2, 64, 96, 128, 4, 2, 10000.0),
      mixtral("mixtral-8x7b", 32000, 32, 32, 8, 4096, 14336, 32768, 8, 2, 1e6),
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

bool get_bool(const json::Value& hf, const char* key, bool fallback) {
  const json::Value* v = hf.find(key);
  return v == nullptr || v->is_null() ? fallback : v->as_bool();
}

// `key` may be absent or null, or one of `same` (spellings of the one computation implemented).
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

// A key that is honoured only at the value that means "the computation we implement".
void require_bool(const json::Value& hf, const char* key, bool only, const std::string& what) {
  const json::Value* v = hf.find(key);
  MAMMOTH_CHECK(v == nullptr || v->is_null() || v->as_bool() == only)
      << "[config_from_hf_json] " << what << ": " << key << "=" << (only ? "false" : "true")
      << " is not supported";
}

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

// Refuses, by name, every key that is neither in `known` (what the family reads or accepts)
// nor inert: an unknown key may change the computation, and ignoring it would be silent.
void check_keys(const json::Value& hf, const std::set<std::string>& known, const std::string& type,
                const std::string& what) {
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

// Keys every family accepts at the value that changes nothing.
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

const std::set<std::string> kCommonConditional = {
    "is_encoder_decoder",          "add_cross_attention", "is_decoder", "pruned_heads",
    "cross_attention_hidden_size", "problem_type",        "num_labels"};

std::set<std::string> with_common(std::set<std::string> keys) {
  keys.insert(kCommonConditional.begin(), kCommonConditional.end());
  return keys;
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

// config.json's rope_scaling as transformers 4.44 reads it for LLaMA: the kind in "rope_type"
// or the older "type", and exactly the keys that kind uses. Other kinds (yarn, longrope, su)
// and unknown keys are refused by name rather than rotated differently.
void read_rope_scaling(const json::Value& rs, ModelConfig& c, const std::string& what) {
  const std::string where = "[config_from_hf_json] " + what + ": rope_scaling";
  MAMMOTH_CHECK(rs.is_object()) << where << " must be an object or null";
  std::string kind;
  for (const char* k : {"rope_type", "type"}) {
    const json::Value* t = rs.find(k);
    if (t == nullptr || t->is_null()) continue;
    MAMMOTH_CHECK(t->is_string()) << where << ": " << k << " must be a string";
    MAMMOTH_CHECK(kind.empty() || kind == t->as_string())
        << where << ": rope_type '" << kind << "' and type '" << t->as_string() << "' disagree";
    kind = t->as_string();
  }
  MAMMOTH_CHECK(!kind.empty()) << where << " has no rope_type";
  std::set<std::string> keys = {"rope_type", "type"};
  using S = ModelConfig::RopeScaling;
  if (kind == "default") {
    c.rope_scaling = S::kNone;
  } else if (kind == "linear" || kind == "dynamic" || kind == "llama3") {
    c.rope_scaling = kind == "linear" ? S::kLinear : (kind == "dynamic" ? S::kDynamic : S::kLlama3);
    MAMMOTH_CHECK(rs.find("factor") != nullptr) << where << " '" << kind << "' needs a factor";
    c.rope_factor = rs.at("factor").as_double();
    keys.insert("factor");
    if (kind == "llama3") {
      for (const char* k :
           {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"})
        MAMMOTH_CHECK(rs.find(k) != nullptr) << where << " 'llama3' needs " << k;
      c.rope_low_freq_factor = rs.at("low_freq_factor").as_double();
      c.rope_high_freq_factor = rs.at("high_freq_factor").as_double();
      c.rope_original_max_seq = rs.at("original_max_position_embeddings").as_int();
      keys.insert({"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
    } else if (kind == "dynamic" && rs.find("original_max_position_embeddings") != nullptr) {
      // transformers 4.44 ignores it (dynamic NTK scales from max_position_embeddings); later
      // versions use it, so only the value on which both agree is accepted.
      const int64_t o = rs.at("original_max_position_embeddings").as_int();
      MAMMOTH_CHECK(o == c.max_seq)
          << where << " 'dynamic': original_max_position_embeddings " << o
          << " != max_position_embeddings " << c.max_seq << " is not supported";
      keys.insert("original_max_position_embeddings");
    }
  } else {
    MAMMOTH_THROW() << where << " '" << kind
                    << "' is not supported (default, linear, dynamic, llama3)";
  }
  for (const json::Value& m : rs) {
    MAMMOTH_CHECK(keys.count(m.key()))
        << where << " '" << kind << "': key '" << m.key() << "' is not supported";
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
    // summary_*: GPT2DoubleHeadsModel's multiple-choice head, which GPT2LMHeadModel lacks;
    // n_ctx: an old alias transformers no longer reads; reorder_and_upcast_attn: f32 scores
    // (the same computation, ours are f32 already).
    check_keys(hf,
               with_common({"vocab_size",
                            "n_positions",
                            "n_ctx",
                            "n_embd",
                            "n_layer",
                            "n_head",
                            "n_inner",
                            "layer_norm_epsilon",
                            "resid_pdrop",
                            "embd_pdrop",
                            "attn_pdrop",
                            "activation_function",
                            "tie_word_embeddings",
                            "scale_attn_weights",
                            "scale_attn_by_inverse_layer_idx",
                            "reorder_and_upcast_attn",
                            "summary_type",
                            "summary_use_proj",
                            "summary_activation",
                            "summary_proj_to_labels",
                            "summary_first_dropout"}),
               type, what);
    check_common(hf, false, what);
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
    // One dropout rate serves the embeddings, the residual branches and the MLP.
    const double embd = get_double(hf, "embd_pdrop", 0.1);
    MAMMOTH_CHECK(embd == c.dropout)
        << "[config_from_hf_json] " << what << ": embd_pdrop " << embd << " != resid_pdrop "
        << c.dropout << " is not supported (one rate for embeddings and residuals)";
    c.tie_embeddings = get_bool(hf, "tie_word_embeddings", true);
    check_activation(hf, "activation_function", {"gelu_new", "gelu_pytorch_tanh"}, what);
    require_bool(hf, "scale_attn_weights", true, what);
    require_bool(hf, "scale_attn_by_inverse_layer_idx", false, what);
  } else if (type == "llama" || type == "mistral" || type == "qwen2") {
    // pretraining_tp: transformers then slices the projections into that many matmuls and sums
    // them, the same computation in another order. Mistral and Qwen2 (transformers 4.44) read
    // a subset of LLaMA's keys plus their own: no rope_scaling, no attention/mlp_bias.
    using V = ModelConfig::LlamaVariant;
    const V variant = type == "mistral" ? V::kMistral : (type == "qwen2" ? V::kQwen2 : V::kLlama);
    std::set<std::string> keys = {"vocab_size",
                                  "hidden_size",
                                  "num_hidden_layers",
                                  "num_attention_heads",
                                  "num_key_value_heads",
                                  "intermediate_size",
                                  "max_position_embeddings",
                                  "rms_norm_eps",
                                  "rope_theta",
                                  "attention_dropout",
                                  "tie_word_embeddings",
                                  "hidden_act"};
    if (variant == V::kLlama)
      keys.insert({"rope_scaling", "head_dim", "attention_bias", "mlp_bias", "pretraining_tp"});
    if (variant == V::kMistral) keys.insert({"head_dim", "sliding_window"});
    if (variant == V::kQwen2)
      keys.insert({"use_sliding_window", "sliding_window", "max_window_layers"});
    check_keys(hf, with_common(keys), type, what);
    check_common(hf, false, what);
    c.family = Family::kLlama;
    c.llama_variant = variant;
    if (variant == V::kMistral) {
      // null: full causal attention (transformers' own reading).
      c.sliding_window = get_int(hf, "sliding_window", 0);
      MAMMOTH_CHECK(c.sliding_window >= 0)
          << "[config_from_hf_json] " << what << ": sliding_window must be positive or null, got "
          << c.sliding_window;
    }
    if (variant == V::kQwen2) {
      // transformers 4.44 applies Qwen2's window only in its flash-attention path, to layers
      // >= max_window_layers; its eager attention ignores it. Without a reference that agrees,
      // the window is refused; with use_sliding_window false the other two keys mean nothing.
      MAMMOTH_CHECK(!get_bool(hf, "use_sliding_window", false))
          << "[config_from_hf_json] " << what
          << ": use_sliding_window=true is not supported for qwen2 (sliding_window and "
             "max_window_layers are then ignored only when it is false)";
      c.qkv_bias = true;
    }
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
    // Qwen2Config's default is false too; small Qwen2 checkpoints say true.
    c.tie_embeddings = get_bool(hf, "tie_word_embeddings", false);
    check_activation(hf, "hidden_act", {"silu"}, what);
    if (const json::Value* rs = hf.find("rope_scaling"); rs != nullptr && !rs->is_null())
      read_rope_scaling(*rs, c, what);
    // An explicit head_dim: the projections are n_head * head_dim wide, whatever hidden_size.
    if (int64_t hd = get_int(hf, "head_dim", 0); hd > 0 && hd * c.n_head != c.d_model)
      c.head_size = hd;
    require_bool(hf, "attention_bias", false, what);
    require_bool(hf, "mlp_bias", false, what);
  } else if (type == "mixtral") {
    // router_jitter_noise: HF multiplies the router input by noise while training (refused
    // unless 0); sliding_window: only null (Mixtral's published configs) is implemented.
    check_keys(hf,
               with_common({"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "intermediate_size", "max_position_embeddings",
                            "rms_norm_eps", "rope_theta", "attention_dropout",
                            "tie_word_embeddings", "hidden_act", "sliding_window",
                            "num_local_experts", "num_experts_per_tok", "output_router_logits",
                            "router_aux_loss_coef", "router_z_loss_coef", "router_jitter_noise"}),
               type, what);
    check_common(hf, false, what);
    c.family = Family::kMixtral;
    c.vocab_size = hf.at("vocab_size").as_int();
    c.d_model = hf.at("hidden_size").as_int();
    c.n_layer = hf.at("num_hidden_layers").as_int();
    c.n_head = hf.at("num_attention_heads").as_int();
    c.n_kv_head = get_int(hf, "num_key_value_heads", c.n_head);
    c.d_ff = hf.at("intermediate_size").as_int();
    c.max_seq = get_int(hf, "max_position_embeddings", 4096 * 32);
    c.norm_eps = get_double(hf, "rms_norm_eps", 1e-5);
    c.rope_base = get_double(hf, "rope_theta", 1e6);
    c.attn_dropout = get_double(hf, "attention_dropout", 0.0);
    c.tie_embeddings = get_bool(hf, "tie_word_embeddings", false);
    check_activation(hf, "hidden_act", {"silu"}, what);
    c.moe_experts = get_int(hf, "num_local_experts", 8);
    c.moe_top_k = get_int(hf, "num_experts_per_tok", 2);
    c.moe_aux_loss = get_bool(hf, "output_router_logits", false);
    c.moe_aux_loss_coef = get_double(hf, "router_aux_loss_coef", 0.001);
    c.moe_z_loss_coef = get_double(hf, "router_z_loss_coef", 0.0);
    const double jitter = get_double(hf, "router_jitter_noise", 0.0);
    MAMMOTH_CHECK(jitter == 0.0) << "[config_from_hf_json] " << what << ": router_jitter_noise "
                                 << jitter << " is not supported (only 0)";
    if (const json::Value* sw = hf.find("sliding_window"); sw != nullptr && !sw->is_null()) {
      MAMMOTH_THROW() << "[config_from_hf_json] " << what << ": sliding_window " << sw->as_int()
                      << " is not supported for mixtral (only null: full attention)";
    }
  } else if (type == "bert" || type == "vit") {
    const bool bert = type == "bert";
    // encoder_stride: ViTForMaskedImageModeling's decoder only.
    const std::set<std::string> shared = {"hidden_size",         "num_hidden_layers",
                                          "num_attention_heads", "intermediate_size",
                                          "hidden_act",          "hidden_dropout_prob",
                                          "layer_norm_eps",      "attention_probs_dropout_prob"};
    std::set<std::string> keys =
        bert ? std::set<std::string>{"vocab_size",         "max_position_embeddings",
                                     "type_vocab_size",    "position_embedding_type",
                                     "classifier_dropout", "tie_word_embeddings"}
             : std::set<std::string>{"image_size", "patch_size",     "num_channels",
                                     "qkv_bias",   "encoder_stride", "tie_word_embeddings"};
    keys.insert(shared.begin(), shared.end());
    check_keys(hf, with_common(keys), type, what);
    check_common(hf, true, what);
    c.family = bert ? Family::kBert : Family::kVit;
    c.d_model = hf.at("hidden_size").as_int();
    c.n_layer = hf.at("num_hidden_layers").as_int();
    c.n_head = c.n_kv_head = hf.at("num_attention_heads").as_int();
    c.d_ff = hf.at("intermediate_size").as_int();
    c.norm_eps = get_double(hf, "layer_norm_eps", 1e-12);
    c.dropout = get_double(hf, "hidden_dropout_prob", bert ? 0.1 : 0.0);
    c.attn_dropout = get_double(hf, "attention_probs_dropout_prob", bert ? 0.1 : 0.0);
    check_activation(hf, "hidden_act", {"gelu", "gelu_python"}, what);
    c.num_labels = num_labels_of(hf, 2);
    if (bert) {
      c.vocab_size = hf.at("vocab_size").as_int();
      c.max_seq = get_int(hf, "max_position_embeddings", 512);
      c.type_vocab_size = get_int(hf, "type_vocab_size", 2);
      c.tie_embeddings = true;
      require_bool(hf, "tie_word_embeddings", true, what);  // the MLM decoder is tied
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
      // The classifier's dropout is hidden_dropout_prob (transformers' default for null).
      const double cd = get_double(hf, "classifier_dropout", c.dropout);
      MAMMOTH_CHECK(cd == c.dropout)
          << "[config_from_hf_json] " << what << ": classifier_dropout " << cd
          << " != hidden_dropout_prob " << c.dropout << " is not supported";
    } else {
      c.image_size = get_int(hf, "image_size", 224);
      c.patch_size = get_int(hf, "patch_size", 16);
      c.num_channels = get_int(hf, "num_channels", 3);
      c.tie_embeddings = false;  // no LM head: tie_word_embeddings means nothing here
      require_bool(hf, "qkv_bias", true, what);
    }
  } else {
    MAMMOTH_THROW() << "[config_from_hf_json] " << what << ": model_type '" << type
                    << "' is not supported (gpt2, llama, mistral, qwen2, bert, vit, mixtral)";
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
      v.set("tie_word_embeddings", c.tie_embeddings);
      break;
    case Family::kLlama: {
      using V = ModelConfig::LlamaVariant;
      const V variant = c.llama_variant;
      v.set("model_type", variant == V::kMistral ? "mistral"
                          : variant == V::kQwen2 ? "qwen2"
                                                 : "llama");
      v.set("architectures",
            json::Value::array().push_back(variant == V::kMistral ? "MistralForCausalLM"
                                           : variant == V::kQwen2 ? "Qwen2ForCausalLM"
                                                                  : "LlamaForCausalLM"));
      if (variant == V::kMistral) {
        v.set("sliding_window",
              c.sliding_window > 0 ? json::Value(c.sliding_window) : json::Value());
      }
      if (variant == V::kQwen2) v.set("use_sliding_window", false);
      v.set("vocab_size", c.vocab_size).set("hidden_size", c.d_model);
      v.set("num_hidden_layers", c.n_layer).set("num_attention_heads", c.n_head);
      v.set("num_key_value_heads", c.n_kv_head).set("intermediate_size", c.d_ff);
      v.set("max_position_embeddings", c.max_seq).set("rms_norm_eps", c.norm_eps);
      v.set("rope_theta", c.rope_base).set("hidden_act", "silu");
      if (c.head_size > 0) v.set("head_dim", c.head_size);
      if (c.rope_scaling != ModelConfig::RopeScaling::kNone) {
        json::Value rs = json::Value::object();
        rs.set("rope_type", rope_scaling_name(c.rope_scaling)).set("factor", c.rope_factor);
        if (c.rope_scaling == ModelConfig::RopeScaling::kLlama3) {
          rs.set("low_freq_factor", c.rope_low_freq_factor)
              .set("high_freq_factor", c.rope_high_freq_factor)
              .set("original_max_position_embeddings", c.rope_original_max_seq);
        }
        v.set("rope_scaling", std::move(rs));
      }
      v.set("tie_word_embeddings", c.tie_embeddings);
      v.set("attention_dropout", c.attn_dropout);
      break;
    }
    case Family::kMixtral:
      // moe_capacity_factor is a Mammoth option, not part of the model: transformers would
      // ignore the key and run dropless, so it is not written.
      v.set("architectures", json::Value::array().push_back("MixtralForCausalLM"));
      v.set("vocab_size", c.vocab_size).set("hidden_size", c.d_model);
      v.set("num_hidden_layers", c.n_layer).set("num_attention_heads", c.n_head);
      v.set("num_key_value_heads", c.n_kv_head).set("intermediate_size", c.d_ff);
      v.set("max_position_embeddings", c.max_seq).set("rms_norm_eps", c.norm_eps);
      v.set("rope_theta", c.rope_base).set("hidden_act", "silu");
      v.set("tie_word_embeddings", c.tie_embeddings);
      v.set("attention_dropout", c.attn_dropout).set("sliding_window", nullptr);
      v.set("num_local_experts", c.moe_experts).set("num_experts_per_tok", c.moe_top_k);
      v.set("output_router_logits", c.moe_aux_loss);
      v.set("router_aux_loss_coef", c.moe_aux_loss_coef);
      if (c.moe_z_loss_coef > 0) v.set("router_z_loss_coef", c.moe_z_loss_coef);
      v.set("router_jitter_noise", 0.0);
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
  if (o.moe_capacity_factor) {
    MAMMOTH_CHECK(c.family == Family::kMixtral)
        << "[models] " << c.name << ": a capacity factor needs a mixture-of-experts model, not "
        << family_name(c.family);
    c.moe_capacity_factor = *o.moe_capacity_factor;
  }
  if (o.moe_aux_loss_coef) {
    MAMMOTH_CHECK(c.family == Family::kMixtral)
        << "[models] " << c.name << ": an auxiliary-loss coefficient needs a mixture-of-experts "
        << "model, not " << family_name(c.family);
    c.moe_aux_loss_coef = *o.moe_aux_loss_coef;
    c.moe_aux_loss = c.moe_aux_loss_coef > 0;
  }
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
    case Family::kMixtral:
      m = std::make_shared<Mixtral>(config);
      break;
  }
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
  if (!options.labels.empty()) {
    MAMMOTH_CHECK(config.family == Family::kBert || config.family == Family::kVit)
        << "[save_pretrained] class labels are for BERT and ViT classifiers, not "
        << family_name(config.family);
    MAMMOTH_CHECK(static_cast<int64_t>(options.labels.size()) == config.num_labels)
        << "[save_pretrained] " << options.labels.size() << " class labels for a model with "
        << config.num_labels;
    if (config.family == Family::kBert) {
      const auto mlm_head = [](const std::string& name) { return name.rfind("cls.", 0) == 0; };
      std::erase_if(params, [&](const auto& p) { return mlm_head(p.first); });
      std::erase_if(layout.params, [&](const HfParam& p) { return mlm_head(p.param); });
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
      if (config.family == Family::kBert)
        hf.set("architectures", json::Value::array().push_back("BertForSequenceClassification"));
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
