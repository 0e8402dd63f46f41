// Mixtral's family spec: LLaMA's decoder with a mixture of experts for the MLP.
#include <algorithm>
#include <memory>

#include "base/error.h"
#include "models/family.h"
#include "models/llama/llama_family.h"
#include "models/mixtral/mixtral.h"

namespace mammoth::models {
namespace {

// LLaMA's shape plus experts; the router's load-balancing loss on (HF's output_router_logits)
// at HF's default coefficient, no z-loss, dropless.
ModelConfig mixtral(const std::string& name, int64_t vocab, int64_t layers, int64_t heads,
                    int64_t kv_heads, int64_t d, int64_t ff, int64_t seq, int64_t experts,
                    int64_t top_k, double rope_base) {
  ModelConfig c = llama_config(name, vocab, layers, heads, kv_heads, d, ff, seq, 1e-5, rope_base);
  c.family = Family::kMixtral;
  c.moe_experts = experts;
  c.moe_top_k = top_k;
  c.moe_aux_loss = true;
  c.moe_aux_loss_coef = 0.001;
  return c;
}

void from_hf(const json::Value& hf, const std::string& type, const std::string& what,
             ModelConfig& c) {
  // router_jitter_noise: HF multiplies the router input by noise while training (refused
  // unless 0); sliding_window: only null (Mixtral's published configs) is implemented.
  hf::check_keys(
      hf,
      {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
       "num_key_value_heads", "intermediate_size", "max_position_embeddings", "rms_norm_eps",
       "rope_theta", "attention_dropout", "tie_word_embeddings", "hidden_act", "sliding_window",
       "num_local_experts", "num_experts_per_tok", "output_router_logits", "router_aux_loss_coef",
       "router_z_loss_coef", "router_jitter_noise"},
      type, what);
  hf::check_common(hf, false, what);
  c.vocab_size = hf.at("vocab_size").as_int();
  c.d_model = hf.at("hidden_size").as_int();
  c.n_layer = hf.at("num_hidden_layers").as_int();
  c.n_head = hf.at("num_attention_heads").as_int();
  c.n_kv_head = hf::get_int(hf, "num_key_value_heads", c.n_head);
  c.d_ff = hf.at("intermediate_size").as_int();
  c.max_seq = hf::get_int(hf, "max_position_embeddings", 4096 * 32);
  c.norm_eps = hf::get_double(hf, "rms_norm_eps", 1e-5);
  c.rope_base = hf::get_double(hf, "rope_theta", 1e6);
  c.attn_dropout = hf::get_double(hf, "attention_dropout", 0.0);
  c.tie_embeddings = hf::get_bool(hf, "tie_word_embeddings", false);
  hf::check_activation(hf, "hidden_act", {"silu"}, what);
  c.moe_experts = hf::get_int(hf, "num_local_experts", 8);
  c.moe_top_k = hf::get_int(hf, "num_experts_per_tok", 2);
  c.moe_aux_loss = hf::get_bool(hf, "output_router_logits", false);
  c.moe_aux_loss_coef = hf::get_double(hf, "router_aux_loss_coef", 0.001);
  c.moe_z_loss_coef = hf::get_double(hf, "router_z_loss_coef", 0.0);
  const double jitter = hf::get_double(hf, "router_jitter_noise", 0.0);
  MAMMOTH_CHECK(jitter == 0.0) << "[config_from_hf_json] " << what << ": router_jitter_noise "
                               << jitter << " is not supported (only 0)";
  if (const json::Value* sw = hf.find("sliding_window"); sw != nullptr && !sw->is_null()) {
    MAMMOTH_THROW() << "[config_from_hf_json] " << what << ": sliding_window " << sw->as_int()
                    << " is not supported for mixtral (only null: full attention)";
  }
}

void to_hf(const ModelConfig& c, json::Value& v) {
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
}

// One expert's weights: w1, w2, w3 (SwiGLU, no biases).
int64_t expert_size(const ModelConfig& c) { return 3 * c.d_model * c.d_ff; }

FamilyCost mixtral_cost() {
  FamilyCost k = llama_decoder_cost();
  k.block_params = [](const ModelConfig& c, bool active) {
    return llama_attention_params(c)                                   // as LLaMA's
           + c.d_model * c.moe_experts                                 // router
           + (active ? c.moe_top_k : c.moe_experts) * expert_size(c);  // the experts
  };
  k.expert_params = [](const ModelConfig& c) { return c.moe_experts * expert_size(c); };
  k.block_flops = [](const ModelConfig& c, int64_t T) {
    const double d = c.d_model, f = c.d_ff;
    // The router and the top-k experts each token goes through.
    const double mlp = d * static_cast<double>(c.moe_experts) + c.moe_top_k * 3 * d * f;
    return cost::block_flops(c, T, llama_projection_flops(c), mlp);
  };
  // Under tp the attention splits as LLaMA's and the experts and router stay whole on every
  // rank (models/policies/mixtral_policy.cc).
  const auto llama_split = k.tp_split;
  k.tp_split = [llama_split](const ModelConfig& c, int tp, int64_t Vp, int64_t outside) {
    TpParamSplit s = llama_split(c, tp, Vp, outside);
    const int64_t d = c.d_model, f = c.d_ff;
    s.replicated += d * c.moe_experts + c.moe_experts * expert_size(c);  // router, experts
    s.largest_block = std::max(s.largest_block, d * f);
    return s;
  };
  k.activations = [](const ModelConfig& c, const ActivationSizes& s) {
    FamilyActivations a;
    // As LLaMA's, with the four d_ff-wide tensors for each of the N * k routed rows (whole
    // under tp: the experts are not split), plus the gathered rows, the experts' outputs and
    // the router's logits and probabilities (f32).
    const int64_t rows = s.N * c.moe_top_k;
    a.block = (2 * s.Ns + 2 * s.N) * s.C * s.e + s.attn + 4 * rows * c.d_ff * s.e + 2 * s.Ns * s.e +
              2 * rows * s.C * s.e + 2 * s.N * c.moe_experts * 4;
    a.block_bwd = cost::mlp_block_bwd(s);
    a.head = cost::final_norm_head(s);
    return a;
  };
  return k;
}

FamilySpec mixtral_family() {
  FamilySpec f;
  f.family = Family::kMixtral;
  f.name = "mixtral";
  f.hf_model_types = {"mixtral"};
  f.rotary = true;
  f.experts = true;
  f.title = "Mixtral";
  f.router_losses = true;
  f.pipeline = PipelineForm::kNextToken;  // one-device stages only (plan/parallel_plan.cc)
  f.build = [](const ModelConfig& c) { return std::make_shared<Mixtral>(c); };
  f.from_hf = from_hf;
  f.to_hf = to_hf;
  f.configs = {
      mixtral("mixtral-tiny", 512, 2, 4, 2, 64, 96, 128, 4, 2, 10000.0),
      mixtral("mixtral-8x7b", 32000, 32, 32, 8, 4096, 14336, 32768, 8, 2, 1e6),
  };
  f.cost = mixtral_cost();
  return f;
}

[[maybe_unused]] const bool kRegistered = register_family(mixtral_family());

}  // namespace
}  // namespace mammoth::models
