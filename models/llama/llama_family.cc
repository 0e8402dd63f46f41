// LLaMA's family spec (with its Mistral and Qwen2 variants): config.json, registered sizes,
// costs.
#include "models/llama/llama_family.h"

#include <algorithm>
#include <memory>
#include <set>

#include "base/error.h"
#include "models/llama/llama.h"

namespace mammoth::models {

ModelConfig llama_config(const std::string& name, int64_t vocab, int64_t layers, int64_t heads,
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

int64_t llama_attention_params(const ModelConfig& c) {
  const int64_t d = c.d_model, kv = c.n_kv_head * c.head_dim();
  return 2 * d                          // two RMSNorm weights
         + d * d + 2 * d * kv + d * d;  // q, k, v, o
}

double llama_projection_flops(const ModelConfig& c) {
  const double d = c.d_model;
  const double kv = static_cast<double>(c.n_kv_head * c.head_dim());
  const double attn_dim = static_cast<double>(c.n_head * c.head_dim());
  return d * attn_dim + 2 * d * kv + attn_dim * d;
}

FamilyCost llama_decoder_cost() {
  FamilyCost k;
  k.outside_params = [](const ModelConfig& c) {
    const int64_t d = c.d_model, V = c.vocab_size;
    return V * d + d + (c.tie_embeddings ? 0 : V * d);  // embed, norm, lm_head
  };
  k.embedding_params = [](const ModelConfig& c) { return c.vocab_size * c.d_model; };
  k.head_flops = [](const ModelConfig& c, int64_t) { return 2.0 * c.d_model * c.vocab_size; };
  k.default_seq_len = [](const ModelConfig& c) { return c.max_seq; };
  k.tp_split = [](const ModelConfig& c, int tp, int64_t Vp, int64_t) {
    const int64_t d = c.d_model;
    TpParamSplit s;
    s.replicated = 2 * d;  // two RMSNorm weights
    s.tied = c.tie_embeddings ? Vp * d / tp : 0;
    s.embed = c.tie_embeddings ? 0 : Vp * d / tp;
    s.head = d + (c.tie_embeddings ? 0 : Vp * d / tp);
    s.largest_block = d * std::max(c.d_ff, d) / tp;
    return s;
  };
  return k;
}

namespace {

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

void from_hf(const json::Value& hf, const std::string& type, const std::string& what,
             ModelConfig& c) {
  // pretraining_tp: transformers then slices the projections into that many matmuls and sums
  // them, the same computation in another order. Mistral and Qwen2 (transformers 4.44) read
  // a subset of LLaMA's keys plus their own: no rope_scaling, no attention/mlp_bias.
  using V = ModelConfig::LlamaVariant;
  const V variant = type == "mistral" ? V::kMistral : (type == "qwen2" ? V::kQwen2 : V::kLlama);
  std::set<std::string> keys = {
      "vocab_size",          "hidden_size",       "num_hidden_layers",       "num_attention_heads",
      "num_key_value_heads", "intermediate_size", "max_position_embeddings", "rms_norm_eps",
      "rope_theta",          "attention_dropout", "tie_word_embeddings",     "hidden_act"};
  if (variant == V::kLlama)
    keys.insert({"rope_scaling", "head_dim", "attention_bias", "mlp_bias", "pretraining_tp"});
  if (variant == V::kMistral) keys.insert({"head_dim", "sliding_window"});
  if (variant == V::kQwen2)
    keys.insert({"use_sliding_window", "sliding_window", "max_window_layers"});
  hf::check_keys(hf, keys, type, what);
  hf::check_common(hf, false, what);
  c.llama_variant = variant;
  if (variant == V::kMistral) {
    // null: full causal attention (transformers' own reading).
    c.sliding_window = hf::get_int(hf, "sliding_window", 0);
    MAMMOTH_CHECK(c.sliding_window >= 0)
        << "[config_from_hf_json] " << what << ": sliding_window must be positive or null, got "
        << c.sliding_window;
  }
  if (variant == V::kQwen2) {
    // transformers 4.44 applies Qwen2's window only in its flash-attention path, to layers
    // >= max_window_layers; its eager attention ignores it. Without a reference that agrees,
    // the window is refused; with use_sliding_window false the other two keys mean nothing.
    MAMMOTH_CHECK(!hf::get_bool(hf, "use_sliding_window", false))
        << "[config_from_hf_json] " << what
        << ": use_sliding_window=true is not supported for qwen2 (sliding_window and "
           "max_window_layers are then ignored only when it is false)";
    c.qkv_bias = true;
  }
  c.vocab_size = hf.at("vocab_size").as_int();
  c.d_model = hf.at("hidden_size").as_int();
  c.n_layer = hf.at("num_hidden_layers").as_int();
  c.n_head = hf.at("num_attention_heads").as_int();
  c.n_kv_head = hf::get_int(hf, "num_key_value_heads", c.n_head);
  c.d_ff = hf.at("intermediate_size").as_int();
  c.max_seq = hf::get_int(hf, "max_position_embeddings", 2048);
  c.norm_eps = hf::get_double(hf, "rms_norm_eps", 1e-6);
  c.rope_base = hf::get_double(hf, "rope_theta", 10000.0);
  c.attn_dropout = hf::get_double(hf, "attention_dropout", 0.0);
  // Qwen2Config's default is false too; small Qwen2 checkpoints say true.
  c.tie_embeddings = hf::get_bool(hf, "tie_word_embeddings", false);
  hf::check_activation(hf, "hidden_act", {"silu"}, what);
  if (const json::Value* rs = hf.find("rope_scaling"); rs != nullptr && !rs->is_null())
    read_rope_scaling(*rs, c, what);
  // An explicit head_dim: the projections are n_head * head_dim wide, whatever hidden_size.
  if (int64_t hd = hf::get_int(hf, "head_dim", 0); hd > 0 && hd * c.n_head != c.d_model)
    c.head_size = hd;
  hf::require_bool(hf, "attention_bias", false, what);
  hf::require_bool(hf, "mlp_bias", false, what);
}

void to_hf(const ModelConfig& c, json::Value& v) {
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
    v.set("sliding_window", c.sliding_window > 0 ? json::Value(c.sliding_window) : json::Value());
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
}

FamilyCost llama_cost() {
  FamilyCost k = llama_decoder_cost();
  k.block_params = [](const ModelConfig& c, bool) {
    const int64_t kv = c.n_kv_head * c.head_dim();
    return llama_attention_params(c) +
           (c.qkv_bias ? c.n_head * c.head_dim() + 2 * kv : 0)  // Qwen2's q, k, v biases
           + 3 * c.d_model * c.d_ff;                            // gate, up, down
  };
  k.block_flops = [](const ModelConfig& c, int64_t T) {
    const double d = c.d_model, f = c.d_ff;
    return cost::block_flops(c, T, llama_projection_flops(c), 3 * d * f);
  };
  k.activations = [](const ModelConfig&, const ActivationSizes& s) {
    FamilyActivations a;
    // Input and h (the RMSNorms' inputs), the norm outputs the projections save; gate,
    // silu(gate), up (mul's operands) and their product (down's input).
    a.block = (2 * s.Ns + 2 * s.N) * s.C * s.e + s.attn + 4 * s.N * s.Fl * s.e + 2 * s.Ns * s.e;
    // After down_proj's backward, mul's backward makes both operands' gradients while down_proj's
    // input gradient (mul's output gradient) is live and down_proj's saved input is gone.
    a.block_bwd = s.Ns * s.C * s.e + std::max(2 * s.N * s.Fl, s.N * s.Fl + s.C * s.Fl) * s.e;
    a.head = cost::final_norm_head(s);
    return a;
  };
  return k;
}

FamilySpec llama_family() {
  FamilySpec f;
  f.family = Family::kLlama;
  f.name = "llama";
  f.hf_model_types = {"llama", "mistral", "qwen2"};
  f.rotary = true;
  f.llama_variants = true;
  f.title = "LLaMA";
  f.pipeline = PipelineForm::kNextToken;
  f.lora_targets = "q_proj,v_proj";  // PEFT's default for llama
  // rms norm; q, k, v: linear, view, permute (+ rope on q and k); attention; merge (permute,
  // reshape); o; add; rms norm; gate, silu, up, mul, down; add.
  f.time_shape.calls = {23, 7, 9, 3};
  f.time_shape.separate_qkv = true;
  f.time_shape.gated_mlp = true;
  f.build = [](const ModelConfig& c) { return std::make_shared<Llama>(c); };
  f.from_hf = from_hf;
  f.to_hf = to_hf;
  f.configs = {
      llama_config("llama-tiny", 512, 2, 4, 2, 64, 172, 128, 1e-6, 10000.0),
      llama_config("llama-7b", 32000, 32, 32, 32, 4096, 11008, 4096, 1e-5, 10000.0),
      llama_config("llama-13b", 32000, 40, 40, 40, 5120, 13824, 4096, 1e-5, 10000.0),
      llama_config("llama-70b", 32000, 80, 64, 8, 8192, 28672, 4096, 1e-5, 10000.0),
      llama_config("llama3-8b", 128256, 32, 32, 8, 4096, 14336, 8192, 1e-5, 500000.0),
      llama_config("llama3-70b", 128256, 80, 64, 8, 8192, 28672, 8192, 1e-5, 500000.0),
      // Tiny LLaMA-like variants for tests; mistral-tiny's window (16) is shorter than the
      // sequences its tests train on, so the window shapes the result.
      mistral(llama_config("mistral-tiny", 512, 2, 4, 2, 64, 172, 128, 1e-6, 10000.0), 16),
      qwen2(llama_config("qwen2-tiny", 512, 2, 4, 2, 64, 172, 128, 1e-6, 10000.0), true),
  };
  f.cost = llama_cost();
  return f;
}

[[maybe_unused]] const bool kRegistered = register_family(llama_family());

}  // namespace
}  // namespace mammoth::models
