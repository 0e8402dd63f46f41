#include "models/config.h"

#include "base/error.h"
#include "models/family.h"

namespace mammoth::models {

const char* family_name(Family f) {
  for (const FamilySpec& s : families())
    if (s.family == f) return s.name;
  return "?";
}

Family family_from_name(const std::string& name) {
  std::string known;
  for (const FamilySpec& s : families()) {
    if (name == s.name) return s.family;
    known += (known.empty() ? "" : ", ") + std::string(s.name);
  }
  MAMMOTH_THROW() << "[models] unknown model family '" << name << "' (known: " << known << ")";
}

const char* rope_scaling_name(ModelConfig::RopeScaling s) {
  switch (s) {
    case ModelConfig::RopeScaling::kNone:
      return "default";
    case ModelConfig::RopeScaling::kLinear:
      return "linear";
    case ModelConfig::RopeScaling::kDynamic:
      return "dynamic";
    case ModelConfig::RopeScaling::kLlama3:
      return "llama3";
  }
  return "?";
}

void ModelConfig::validate() const {
  const std::string where = "[ModelConfig] " + name + ": ";
  const FamilySpec& spec = family_spec(family);
  MAMMOTH_CHECK(n_layer > 0) << where << "n_layer must be positive, got " << n_layer;
  MAMMOTH_CHECK(n_head > 0) << where << "n_head must be positive, got " << n_head;
  // An explicit head_dim (LLaMA) frees d_model from being n_head * head_dim.
  MAMMOTH_CHECK(d_model > 0 && (head_size > 0 || d_model % n_head == 0))
      << where << "d_model " << d_model << " must be a positive multiple of n_head " << n_head;
  MAMMOTH_CHECK(head_size >= 0 && (head_size == 0 || spec.llama_variants))
      << where << "an explicit head_dim (" << head_size << ") is supported for llama only";
  MAMMOTH_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0)
      << where << "n_head " << n_head << " must be a multiple of n_kv_head " << n_kv_head;
  MAMMOTH_CHECK(d_ff > 0) << where << "d_ff must be positive, got " << d_ff;
  MAMMOTH_CHECK(norm_eps > 0) << where << "norm_eps must be positive, got " << norm_eps;
  MAMMOTH_CHECK(dropout >= 0 && dropout < 1 && attn_dropout >= 0 && attn_dropout < 1)
      << where << "dropout must be in [0, 1), got " << dropout << " / " << attn_dropout;
  MAMMOTH_CHECK(is_floating(dtype)) << where << "dtype must be floating, got " << dtype_name(dtype);
  if (spec.token_vocabulary) {
    MAMMOTH_CHECK(vocab_size > 0) << where << "vocab_size must be positive, got " << vocab_size;
    MAMMOTH_CHECK(max_seq > 0) << where << "max_seq must be positive, got " << max_seq;
  }
  MAMMOTH_CHECK(spec.llama_variants ||
                (llama_variant == LlamaVariant::kLlama && sliding_window == 0 && !qkv_bias))
      << where << "sliding_window and qkv_bias are LLaMA-family fields";
  MAMMOTH_CHECK(sliding_window >= 0)
      << where << "sliding_window must be >= 0 (0: none), got " << sliding_window;
  if (spec.rotary) {
    MAMMOTH_CHECK(head_dim() % 2 == 0)
        << where << "rotary embeddings need an even head_dim, got " << head_dim();
    MAMMOTH_CHECK(rope_base > 0) << where << "rope_theta must be positive, got " << rope_base;
    if (rope_scaling != RopeScaling::kNone) {
      MAMMOTH_CHECK(rope_factor > 0) << where << "rope_scaling '" << rope_scaling_name(rope_scaling)
                                     << "': factor must be positive, got " << rope_factor;
    }
    if (rope_scaling == RopeScaling::kLlama3) {
      // The blend divides by high - low.
      MAMMOTH_CHECK(rope_low_freq_factor > 0 && rope_high_freq_factor > rope_low_freq_factor)
          << where << "rope_scaling 'llama3': need 0 < low_freq_factor < high_freq_factor, got "
          << rope_low_freq_factor << " and " << rope_high_freq_factor;
      MAMMOTH_CHECK(rope_original_max_seq > 0)
          << where
          << "rope_scaling 'llama3': original_max_position_embeddings must be positive, got "
          << rope_original_max_seq;
    }
  } else {
    MAMMOTH_CHECK(rope_scaling == RopeScaling::kNone)
        << where << family_name(family) << " has no rotary embeddings to scale";
    MAMMOTH_CHECK(n_kv_head == n_head)
        << where << family_name(family) << " has no grouped-query attention: n_kv_head "
        << n_kv_head << " != n_head " << n_head;
  }
  if (spec.experts) {
    MAMMOTH_CHECK(moe_experts > 0 && moe_top_k > 0 && moe_top_k <= moe_experts)
        << where << "need 0 < num_experts_per_tok (" << moe_top_k << ") <= num_local_experts ("
        << moe_experts << ")";
    MAMMOTH_CHECK(moe_aux_loss_coef >= 0 && moe_z_loss_coef >= 0 && moe_capacity_factor >= 0)
        << where << "router_aux_loss_coef " << moe_aux_loss_coef << ", router_z_loss_coef "
        << moe_z_loss_coef << " and the capacity factor " << moe_capacity_factor << " must be >= 0";
  } else {
    MAMMOTH_CHECK(moe_experts == 0 && moe_top_k == 0 && moe_capacity_factor == 0)
        << where << family_name(family) << " has no experts (mixture-of-experts fields are set)";
  }
  if (spec.validate) spec.validate(*this, where);
  MAMMOTH_CHECK(num_labels >= 0) << where << "num_labels must be >= 0, got " << num_labels;
}

}  // namespace mammoth::models
