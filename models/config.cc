#include "models/config.h"

#include "base/error.h"

namespace mammoth::models {

const char* family_name(Family f) {
  switch (f) {
    case Family::kGpt2:
      return "gpt2";
    case Family::kLlama:
      return "llama";
    case Family::kBert:
      return "bert";
    case Family::kVit:
      return "vit";
    case Family::kMixtral:
      return "mixtral";
  }
  return "?";
}

Family family_from_name(const std::string& name) {
  for (Family f : {Family::kGpt2, Family::kLlama, Family::kBert, Family::kVit, Family::kMixtral}) {
    if (name == family_name(f)) return f;
  }
  MAMMOTH_THROW() << "[models] unknown model family '" << name
                  << "' (known: gpt2, llama, bert, vit, mixtral)";
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
  MAMMOTH_CHECK(n_layer > 0) << where << "n_layer must be positive, got " << n_layer;
  MAMMOTH_CHECK(n_head > 0) << where << "n_head must be positive, got " << n_head;
  // An explicit head_dim (LLaMA) frees d_model from being n_head * head_dim.
  MAMMOTH_CHECK(d_model > 0 && (head_size > 0 || d_model % n_head == 0))
      << where << "d_model " << d_model << " must be a positive multiple of n_head " << n_head;
  MAMMOTH_CHECK(head_size >= 0 && (head_size == 0 || family == Family::kLlama))
      << where << "an explicit head_dim (" << head_size << ") is supported for llama only";
  MAMMOTH_CHECK(n_kv_head > 0 && n_head % n_kv_head == 0)
      << where << "n_head " << n_head << " must be a multiple of n_kv_head " << n_kv_head;
  MAMMOTH_CHECK(d_ff > 0) << where << "d_ff must be positive, got " << d_ff;
  MAMMOTH_CHECK(norm_eps > 0) << where << "norm_eps must be positive, got " << norm_eps;
  MAMMOTH_CHECK(dropout >= 0 && dropout < 1 && attn_dropout >= 0 && attn_dropout < 1)
      << where << "dropout must be in [0, 1), got " << dropout << " / " << attn_dropout;
  MAMMOTH_CHECK(is_floating(dtype)) << where << "dtype must be floating, got " << dtype_name(dtype);
  if (family != Family::kVit) {
    MAMMOTH_CHECK(vocab_size > 0) << where << "vocab_size must be positive, got " << vocab_size;
    MAMMOTH_CHECK(max_seq > 0) << where << "max_seq must be positive, got " << max_seq;
  }
  MAMMOTH_CHECK(family == Family::kLlama ||
                (llama_variant == LlamaVariant::kLlama && sliding_window == 0 && !qkv_bias))
      << where << "sliding_window and qkv_bias are LLaMA-family fields";
  MAMMOTH_CHECK(sliding_window >= 0)
      << where << "sliding_window must be >= 0 (0: none), got " << sliding_window;
  if (family == Family::kLlama || family == Family::kMixtral) {
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
  if (family == Family::kMixtral) {
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
  if (family == Family::kBert) {
    MAMMOTH_CHECK(type_vocab_size > 0)
        << where << "type_vocab_size must be positive, got " << type_vocab_size;
  }
  if (family == Family::kVit) {
    MAMMOTH_CHECK(patch_size > 0 && image_size > 0 && image_size % patch_size == 0)
        << where << "image_size " << image_size << " must be a positive multiple of patch_size "
        << patch_size;
    MAMMOTH_CHECK(num_channels > 0)
        << where << "num_channels must be positive, got " << num_channels;
  }
  MAMMOTH_CHECK(num_labels >= 0) << where << "num_labels must be >= 0, got " << num_labels;
}

}  // namespace mammoth::models
