#include "models/analyze.h"

#include <algorithm>

namespace mammoth::models {
namespace {

// Parameters of one transformer block; `active`: those one token uses (a mixture of experts'
// top-k experts and its router, not the others).
int64_t block_params(const ModelConfig& c, bool active = false) {
  const int64_t d = c.d_model, f = c.d_ff;
  const int64_t kv = c.n_kv_head * c.head_dim();
  switch (c.family) {
    case Family::kLlama:
      return 2 * d                                                  // two RMSNorm weights
             + d * d + 2 * d * kv + d * d                           // q, k, v, o
             + (c.qkv_bias ? c.n_head * c.head_dim() + 2 * kv : 0)  // Qwen2's q, k, v biases
             + 3 * d * f;                                           // gate, up, down
    case Family::kMixtral:
      return 2 * d + d * d + 2 * d * kv + d * d                     // as LLaMA's
             + d * c.moe_experts                                    // router
             + (active ? c.moe_top_k : c.moe_experts) * 3 * d * f;  // w1, w2, w3 per expert
    case Family::kGpt2:
    case Family::kBert:
    case Family::kVit:
      return 2 * 2 * d                     // two LayerNorms
             + 4 * (d * d + d)             // q, k, v, o with biases
             + (d * f + f) + (f * d + d);  // MLP with biases
  }
  return 0;
}

// Matmul FLOPs per token of one block, forward.
double block_flops(const ModelConfig& c, int64_t T) {
  const double d = c.d_model, f = c.d_ff;
  const double kv = static_cast<double>(c.n_kv_head * c.head_dim());
  const double attn_dim = static_cast<double>(c.n_head * c.head_dim());
  const bool llama = c.family == Family::kLlama || c.family == Family::kMixtral;
  const double proj = llama ? d * attn_dim + 2 * d * kv + attn_dim * d : 4 * d * d;
  // A mixture of experts: the router and the top-k experts each token goes through.
  const double mlp = c.family == Family::kMixtral
                         ? d * static_cast<double>(c.moe_experts) + c.moe_top_k * 3 * d * f
                         : (llama ? 3 * d * f : 2 * d * f);
  // A sliding window (Mistral) bounds the keys each query scores.
  const int64_t keys = c.sliding_window > 0 ? std::min(T, c.sliding_window) : T;
  return 2 * (proj + mlp) + 2 * 2 * static_cast<double>(keys) * attn_dim;
}

}  // namespace

int64_t count_parameters(const ModelConfig& c) {
  const int64_t d = c.d_model, V = c.vocab_size;
  int64_t n = c.n_layer * block_params(c);
  switch (c.family) {
    case Family::kGpt2:
      n += V * d + c.max_seq * d + 2 * d + (c.tie_embeddings ? 0 : V * d);  // wte, wpe, ln_f, head
      break;
    case Family::kLlama:
    case Family::kMixtral:
      n += V * d + d + (c.tie_embeddings ? 0 : V * d);  // embed, norm, lm_head
      break;
    case Family::kBert:
      n += (V + c.max_seq + c.type_vocab_size) * d + 2 * d;  // embeddings + LayerNorm
      n += d * d + d;                                        // pooler
      n += d * d + d + 2 * d + V;                            // MLM transform + decoder bias
      if (c.num_labels > 0) n += c.num_labels * d + c.num_labels;
      break;
    case Family::kVit:
      n += d + (c.num_patches() + 1) * d;                         // cls, positions
      n += d * c.num_channels * c.patch_size * c.patch_size + d;  // patch projection
      n += 2 * d + c.num_labels * d + c.num_labels;               // layernorm, classifier
      break;
  }
  return n;
}

ModelAnalysis analyze(const ModelConfig& c, int64_t seq_len) {
  ModelAnalysis a;
  a.config = c;
  a.params = count_parameters(c);
  a.active_params = a.params - c.n_layer * (block_params(c) - block_params(c, true));
  const int64_t d = c.d_model, V = c.vocab_size;
  a.seq_len = seq_len > 0 ? seq_len : (c.family == Family::kVit ? c.num_patches() + 1 : c.max_seq);
  const int64_t T = a.seq_len;
  double head = 0;
  switch (c.family) {
    case Family::kGpt2:
      a.embedding_params = (V + c.max_seq) * d;
      head = 2.0 * d * V;
      break;
    case Family::kLlama:
    case Family::kMixtral:
      a.embedding_params = V * d;
      head = 2.0 * d * V;
      break;
    case Family::kBert:
      a.embedding_params = (V + c.max_seq + c.type_vocab_size) * d;
      head = 2.0 * d * d + 2.0 * d * V;  // MLM transform + decoder on every token
      break;
    case Family::kVit:
      // Patch projection on every patch token; the classifier once per image, amortised.
      a.embedding_params = (c.num_patches() + 1) * d;
      head = 2.0 * d * c.num_channels * c.patch_size * c.patch_size *
                 (static_cast<double>(c.num_patches()) / T) +
             2.0 * d * c.num_labels / T;
      break;
  }
  a.block_flops_per_token_forward = block_flops(c, T);
  a.head_flops_per_token_forward = head;
  a.flops_per_token_forward = c.n_layer * block_flops(c, T) + head;
  a.flops_per_token_train = 3 * a.flops_per_token_forward;
  return a;
}

json::Value analysis_to_json(const ModelAnalysis& a) {
  json::Value v = json::Value::object();
  v.set("model", a.config.name).set("family", family_name(a.config.family));
  v.set("params", a.params).set("active_params", a.active_params);
  v.set("embedding_params", a.embedding_params);
  v.set("seq_len", a.seq_len);
  v.set("flops_per_token_forward", a.flops_per_token_forward);
  v.set("flops_per_token_train", a.flops_per_token_train);
  return v;
}

}  // namespace mammoth::models
