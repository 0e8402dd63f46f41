// ModelConfig: the shape and hyperparameters of every model family in the zoo.
//
// One struct for all families so that tools (train, analyze, plan) can reason about a model
// without knowing its class. Field names follow the transformer vocabulary; registry.cc maps
// Hugging Face config.json keys (n_embd, hidden_size, ...) onto them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"

namespace mammoth::models {

// A model family's tag. Each family declares the rest in its spec (models/family.h), registered
// from its own folder; the names here are the tags of the families the tree ships with. A new
// family names its own tag beside its spec (`constexpr Family kPhi{5};`, any value not taken:
// the underlying type is fixed, so every int is a valid tag) and register_family refuses a
// duplicate.
enum class Family : int { kGpt2, kLlama, kBert, kVit, kMixtral };

// The registered family's name, its own Hugging Face model_type ("gpt2", "llama", ...).
const char* family_name(Family f);
Family family_from_name(const std::string& name);  // throws naming the value

// A tokenizer's special token ids (-1: none): Hugging Face's pad/unk/cls/sep/mask_token_id.
struct SpecialTokenIds {
  int64_t pad = -1;
  int64_t unk = -1;
  int64_t cls = -1;
  int64_t sep = -1;
  int64_t mask = -1;
  // The ids that are set (>= 0), in the order pad, unk, cls, sep, mask.
  std::vector<int64_t> ids() const {
    std::vector<int64_t> out;
    for (int64_t id : {pad, unk, cls, sep, mask})
      if (id >= 0) out.push_back(id);
    return out;
  }
  bool operator==(const SpecialTokenIds&) const = default;
};

struct ModelConfig {
  std::string name;  // registry name or the directory it came from
  Family family = Family::kGpt2;
  int64_t vocab_size = 0;      // token embedding rows (ViT: unused, 0)
  int64_t n_layer = 0;         // transformer blocks
  int64_t n_head = 0;          // query heads
  int64_t n_kv_head = 0;       // key/value heads (grouped-query attention); == n_head except LLaMA
  int64_t d_model = 0;         // hidden size
  int64_t d_ff = 0;            // MLP inner size (GPT-2: 4 d_model; LLaMA: SwiGLU width)
  int64_t max_seq = 0;         // learned position table size (GPT-2, BERT); LLaMA: context length
  double norm_eps = 1e-5;      // LayerNorm / RMSNorm epsilon
  double rope_base = 10000.0;  // LLaMA rotary base (rope_theta)
  // LLaMA's rope_scaling (config.json; transformers' rope_type), see models/llama/rope.h.
  // kLinear divides every frequency by rope_factor; kDynamic (NTK) raises the base once a
  // sequence is longer than max_seq (which it may then exceed); kLlama3 divides the frequencies
  // whose wavelength exceeds rope_original_max_seq / rope_low_freq_factor by rope_factor and
  // blends those between that and rope_original_max_seq / rope_high_freq_factor.
  enum class RopeScaling { kNone, kLinear, kDynamic, kLlama3 };
  RopeScaling rope_scaling = RopeScaling::kNone;
  double rope_factor = 1.0;
  double rope_low_freq_factor = 1.0;   // kLlama3
  double rope_high_freq_factor = 4.0;  // kLlama3
  int64_t rope_original_max_seq = 0;   // kLlama3: the context length before scaling
  // LLaMA's explicit head_dim (config.json), which may differ from d_model / n_head; 0: none.
  int64_t head_size = 0;
  // LLaMA-like configs (Family::kLlama) read from their own HF model_type and written back as
  // it: Mistral adds a sliding window, Qwen2 a bias on q/k/v.
  enum class LlamaVariant { kLlama, kMistral, kQwen2 };
  LlamaVariant llama_variant = LlamaVariant::kLlama;
  int64_t sliding_window = 0;  // > 0: query i sees keys (i - sliding_window, i]; 0: all of [0, i]
  bool qkv_bias = false;       // q_proj, k_proj, v_proj carry a bias
  bool tie_embeddings = true;  // LM head shares the token embedding (GPT-2, BERT MLM)
  double dropout = 0.0;  // residual/embedding/MLP dropout (GPT-2 resid/embd_pdrop, BERT hidden)
  double attn_dropout = 0.0;  // dropout on attention probabilities
  // BERT only.
  int64_t type_vocab_size = 0;  // token-type (segment) embeddings
  // The tokenizer's special tokens. Masked-LM training and evaluation
  // (engine/data/masking.h) replace with special_tokens.mask and never choose any of them.
  SpecialTokenIds special_tokens;
  // BERT / ViT classification head (0: no head).
  int64_t num_labels = 0;
  // ViT only.
  int64_t image_size = 0;
  int64_t patch_size = 0;
  int64_t num_channels = 0;
  // Mixture of experts (Mixtral, models/mixtral): each block's MLP is moe_experts SwiGLU
  // experts of width d_ff, each token routed to moe_top_k of them (HF num_local_experts,
  // num_experts_per_tok). The loss adds moe_aux_loss_coef times HF's load-balancing loss when
  // moe_aux_loss is set (HF router_aux_loss_coef, output_router_logits), and moe_z_loss_coef
  // times the router z-loss (router_z_loss_coef; 0 when absent). moe_capacity_factor 0 is
  // dropless (HF); > 0 caps each expert at ceil(factor * tokens * top_k / experts) tokens per
  // forward and drops the rest (a Mammoth option, never written to config.json).
  int64_t moe_experts = 0;
  int64_t moe_top_k = 0;
  bool moe_aux_loss = false;
  double moe_aux_loss_coef = 0.0;
  double moe_z_loss_coef = 0.0;
  double moe_capacity_factor = 0.0;
  // Storage dtype of the parameters.
  DType dtype = DType::kF32;

  int64_t head_dim() const {
    if (head_size > 0) return head_size;
    return n_head > 0 ? d_model / n_head : 0;
  }
  // ViT: patches per image (without the class token).
  int64_t num_patches() const {
    return patch_size > 0 ? (image_size / patch_size) * (image_size / patch_size) : 0;
  }
  // Positions one sequence may hold: max_seq, except under LLaMA's dynamic NTK rope scaling,
  // which exists to run past max_position_embeddings (no limit).
  int64_t position_limit() const {
    return rope_scaling == RopeScaling::kDynamic ? INT64_MAX : max_seq;
  }
  // Throws Error naming the first inconsistent field (d_model % n_head, n_head % n_kv_head...).
  void validate() const;
};

// transformers' rope_type names: "default", "linear", "dynamic", "llama3".
const char* rope_scaling_name(ModelConfig::RopeScaling s);

}  // namespace mammoth::models
