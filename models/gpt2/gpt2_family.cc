// GPT-2's family spec: GPT2LMHeadModel's config.json, its registered sizes and its costs.
#include <memory>

#include "base/error.h"
#include "models/family.h"
#include "models/gpt2/gpt2.h"

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

void from_hf(const json::Value& hf, const std::string& type, const std::string& what,
             ModelConfig& c) {
  // summary_*: GPT2DoubleHeadsModel's multiple-choice head, which GPT2LMHeadModel lacks;
  // n_ctx: an old alias transformers no longer reads; reorder_and_upcast_attn: f32 scores
  // (the same computation, ours are f32 already).
  hf::check_keys(hf,
                 {"vocab_size",
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
                  "summary_first_dropout"},
                 type, what);
  hf::check_common(hf, false, what);
  c.vocab_size = hf.at("vocab_size").as_int();
  c.max_seq = hf.at("n_positions").as_int();
  c.d_model = hf.at("n_embd").as_int();
  c.n_layer = hf.at("n_layer").as_int();
  c.n_head = c.n_kv_head = hf.at("n_head").as_int();
  c.d_ff = hf::get_int(hf, "n_inner", 4 * c.d_model);
  c.norm_eps = hf::get_double(hf, "layer_norm_epsilon", 1e-5);
  c.dropout = hf::get_double(hf, "resid_pdrop", 0.1);
  c.attn_dropout = hf::get_double(hf, "attn_pdrop", 0.1);
  // One dropout rate serves the embeddings, the residual branches and the MLP.
  const double embd = hf::get_double(hf, "embd_pdrop", 0.1);
  MAMMOTH_CHECK(embd == c.dropout)
      << "[config_from_hf_json] " << what << ": embd_pdrop " << embd << " != resid_pdrop "
      << c.dropout << " is not supported (one rate for embeddings and residuals)";
  c.tie_embeddings = hf::get_bool(hf, "tie_word_embeddings", true);
  hf::check_activation(hf, "activation_function", {"gelu_new", "gelu_pytorch_tanh"}, what);
  hf::require_bool(hf, "scale_attn_weights", true, what);
  hf::require_bool(hf, "scale_attn_by_inverse_layer_idx", false, what);
}

void to_hf(const ModelConfig& c, json::Value& v) {
  v.set("architectures", json::Value::array().push_back("GPT2LMHeadModel"));
  v.set("vocab_size", c.vocab_size).set("n_positions", c.max_seq).set("n_ctx", c.max_seq);
  v.set("n_embd", c.d_model).set("n_layer", c.n_layer).set("n_head", c.n_head);
  v.set("n_inner", c.d_ff).set("layer_norm_epsilon", c.norm_eps);
  v.set("resid_pdrop", c.dropout).set("embd_pdrop", c.dropout);
  v.set("attn_pdrop", c.attn_dropout).set("activation_function", "gelu_new");
  v.set("tie_word_embeddings", c.tie_embeddings);
}

FamilyCost gpt2_cost() {
  FamilyCost k = cost::layer_norm_cost();
  k.outside_params = [](const ModelConfig& c) {
    const int64_t d = c.d_model, V = c.vocab_size;
    return V * d + c.max_seq * d + 2 * d + (c.tie_embeddings ? 0 : V * d);  // wte, wpe, ln_f, head
  };
  k.embedding_params = [](const ModelConfig& c) { return (c.vocab_size + c.max_seq) * c.d_model; };
  k.head_flops = [](const ModelConfig& c, int64_t) { return 2.0 * c.d_model * c.vocab_size; };
  k.tp_split = [](const ModelConfig& c, int tp, int64_t Vp, int64_t) {
    const int64_t d = c.d_model;
    TpParamSplit s = cost::layer_norm_tp_split(c, tp);
    s.tied = c.tie_embeddings ? Vp * d / tp : 0;
    s.embed = (c.tie_embeddings ? 0 : Vp * d / tp) + c.max_seq * d;
    s.head = 2 * d + (c.tie_embeddings ? 0 : Vp * d / tp);
    return s;
  };
  return k;
}

FamilySpec gpt2_family() {
  FamilySpec f;
  f.family = Family::kGpt2;
  f.name = "gpt2";
  f.hf_model_types = {"gpt2"};
  f.title = "GPT-2";
  f.pipeline = PipelineForm::kNextToken;
  f.lora_targets = "c_attn";  // PEFT's default for gpt2
  f.tp_needs_tied_head = true;
  f.build = [](const ModelConfig& c) { return std::make_shared<Gpt2>(c); };
  f.from_hf = from_hf;
  f.to_hf = to_hf;
  f.configs = {
      // The default model of `mammoth train` on a laptop's CPU: ~0.9M parameters.
      gpt2("gpt2-tiny", 1024, 4, 4, 128, 128, 0.0),
      gpt2("gpt2", 50257, 12, 12, 768, 1024, 0.1),
      gpt2("gpt2-medium", 50257, 24, 16, 1024, 1024, 0.1),
      gpt2("gpt2-large", 50257, 36, 20, 1280, 1024, 0.1),
      gpt2("gpt2-xl", 50257, 48, 25, 1600, 1024, 0.1),
  };
  f.cost = gpt2_cost();
  return f;
}

[[maybe_unused]] const bool kRegistered = register_family(gpt2_family());

}  // namespace
}  // namespace mammoth::models
