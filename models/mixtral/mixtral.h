// Mixtral as in Hugging Face's MixtralForCausalLM (transformers 4.44 modeling_mixtral.py):
// LLaMA blocks (RMSNorm, rotary grouped-query attention: models/llama's LlamaAttention) whose
// MLP is a sparse mixture of SwiGLU experts.
//
// Routing, per token: router logits = gate(x) [E]; softmax (f32, f64 for f64 models); the top-k
// experts by probability (ties: the lower expert index); their probabilities renormalised to sum
// to 1 (Mixtral's rule). Expert e computes w2(silu(w1 x) * w3 x); the block's output is the
// weighted sum over the token's experts.
//
// Capacity (ModelConfig::moe_capacity_factor > 0, a Mammoth option; HF is dropless): each
// expert takes at most C = ceil(factor * N * k / E) of the N tokens of a forward, in token order
// (the first C tokens that chose it); a dropped (token, expert) pair contributes nothing, the
// surviving weights are not renormalised, and the residual carries the token on.
//
// Loss (Mixtral::loss): cross-entropy + moe_aux_loss_coef * HF's load_balancing_loss_func over
// every layer's router logits, concatenated (when moe_aux_loss, HF's output_router_logits) +
// moe_z_loss_coef * the router z-loss, mean over the same rows of logsumexp(logits)^2 (ST-MoE).
//
// The computation per layer: the N * k (token, expert) pairs that survive are sorted by expert
// (token order within one), their rows gathered (index_select), pushed through one grouped GEMM
// per projection (engine::grouped_matmul: all experts in one call) and scattered back with their
// routing weights (engine::moe_combine).
//
// Expert parallelism (Mixtral::set_expert_parallel, DeepSpeed's and Megatron's convention): the
// P ranks of an expert group split the experts, rank r computing experts [r*E/P, (r+1)*E/P).
// Each rank routes its own tokens (router, top-k and the capacity drop all happen before any
// exchange, so a rank drops exactly what one process given its micro-batch drops), then sends
// every peer the per-expert row counts (all_to_all) and the rows for that peer's experts
// (all_to_all_v), runs its local experts over what it received in one grouped GEMM per
// projection, and returns the outputs by the reverse all_to_all_v before moe_combine. The
// backward of each exchange is the reverse exchange. A rank that sends or receives no rows
// still joins every exchange (zero counts), so an expert or a rank without tokens cannot hang
// the group. The model keeps all E experts; this rank's forward uses only its own, so the
// others get no gradient (the training runtime frees their weights).
//
// Tensor parallelism (models/policies/mixtral_policy.cc): the decoder layer takes its attention
// from `Layers` like LLaMA's (heads split over tp); the MoE block stays whole on every tp rank.
// Its input, after the row-parallel all-reduce, is the same on every tp rank, so each routes
// identically and computes the same expert outputs and gradients: the experts need no tp sum,
// and the router losses are one process's. Sequence parallelism would split the tokens those
// losses average over, and is refused (plan/parallel_plan.cc). Under --ep with --tp every tp
// rank is an expert rank of its own expert group (dp ranks of one tp coordinate).
//
// Parameter names are HF's: "model.layers.0.block_sparse_moe.gate.weight",
// "model.layers.0.block_sparse_moe.experts.3.w1.weight", the rest as LLaMA's.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/nn/module.h"
#include "models/layers.h"
#include "models/llama/llama.h"
#include "models/model.h"
#include "parallel/comm/communicator.h"

namespace mammoth::models {

// What one MoE layer's router did in the last forward.
struct ExpertLoad {
  std::vector<int64_t> tokens;  // per expert: (token, expert) pairs routed to it, before capacity
  int64_t dropped = 0;          // pairs dropped by the capacity limit
};

class MixtralExpert : public engine::nn::Module {
 public:
  explicit MixtralExpert(const ModelConfig& c);
  std::shared_ptr<engine::nn::Linear> w1, w2, w3;  // gate, down, up (HF's names)
};

class MixtralSparseMoeBlock : public engine::nn::Module {
 public:
  explicit MixtralSparseMoeBlock(const ModelConfig& c);
  // x [B, T, C] -> [B, T, C]; keeps this forward's router probabilities and load.
  engine::Tensor forward(const engine::Tensor& x);
  // Computes only this rank's experts of `group` (nullptr: all experts, here).
  void set_expert_group(parallel::Communicator* group);
  // The experts this rank computes: [first_local_expert(), + local_experts()).
  int64_t first_local_expert() const;
  int64_t local_experts() const;
  std::shared_ptr<engine::nn::Linear> gate;
  std::shared_ptr<ModuleList<MixtralExpert>> experts;

  engine::Tensor router_logits;   // [N, E] of the last forward (with its graph while training)
  engine::Tensor router_probs;    // softmax of router_logits
  std::vector<int64_t> selected;  // [N * k]: the experts each token chose, by rank
  ExpertLoad load;

 private:
  // Rows xs [M, C] sorted by expert (offsets [E+1]) through the experts, computed by their ranks
  // of the expert group: ys [M, C] in the same order.
  engine::Tensor experts_forward(const engine::Tensor& xs, const std::vector<int64_t>& offsets);
  engine::Tensor experts_parallel(const engine::Tensor& xs, const std::vector<int64_t>& offsets);

  const ModelConfig& config_;
  parallel::Communicator* ep_group_ = nullptr;
};

class MixtralDecoderLayer : public engine::nn::Module {
 public:
  // `L` builds the attention (one device, or column / row parallel over tp); the MoE block is
  // whole either way.
  explicit MixtralDecoderLayer(const ModelConfig& c, const Layers& L = Layers());
  engine::Tensor forward(const engine::Tensor& x, KVCache* cache, int64_t layer) const;
  std::shared_ptr<engine::nn::RMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<LlamaAttention> self_attn;
  std::shared_ptr<MixtralSparseMoeBlock> block_sparse_moe;
};

// HF's MixtralModel: the decoder stack without the head.
class MixtralModel : public engine::nn::Module {
 public:
  explicit MixtralModel(const ModelConfig& c);
  // ids [B, T] -> final normed hidden states [B, T, C]
  engine::Tensor forward(const engine::Tensor& ids, KVCache* cache) const;
  std::shared_ptr<engine::nn::Embedding> embed_tokens;
  std::shared_ptr<ModuleList<MixtralDecoderLayer>> layers;
  std::shared_ptr<engine::nn::RMSNorm> norm;

 private:
  const ModelConfig& config_;
};

class Mixtral : public LanguageModel {
 public:
  explicit Mixtral(ModelConfig config);
  engine::Tensor forward(const engine::Tensor& ids) override;
  // Cross-entropy plus the router losses of this forward (see the top of this file).
  engine::Tensor loss(const engine::Tensor& ids,
                      const engine::Tensor& targets = engine::Tensor()) override;
  bool supports_kv_cache() const override { return true; }
  engine::Tensor forward_cached(const engine::Tensor& ids, KVCache* cache) override;
  const ModelConfig& config() const override { return config_; }
  HfLayout hf_layout() const override;

  // The router losses of the last forward: HF's load-balancing loss (unscaled) and the z-loss.
  engine::Tensor aux_loss() const;
  engine::Tensor z_loss() const;
  // Per layer, the last forward's expert load.
  std::vector<ExpertLoad> expert_load() const;

  // Pipeline stages: next-token windows [B, T + 1] as LLaMA's, the first T positions embedded
  // and routed; between stages the activation is one row [B * T * C + 2E + 2], the hidden
  // states then the router sums so far (probs, lse_sq, choices, rows), so the last stage adds
  // the router losses over every layer.
  bool supports_pipeline() const override { return true; }
  engine::Tensor pipeline_embed(const engine::Tensor& ids) override;
  engine::Tensor pipeline_block(int64_t l, const engine::Tensor& x,
                                const engine::Tensor& ids) override;
  engine::Tensor pipeline_loss(const engine::Tensor& x, const engine::Tensor& ids) override;
  PipelinePart pipeline_part(const std::string& name) const override;
  // Expert parallelism over `group` (see the top of this file); the experts must divide by its
  // size. nullptr: every expert here.
  void set_expert_parallel(parallel::Communicator* group);
  // The expert a parameter belongs to ("model.layers.0.block_sparse_moe.experts.3.w1.weight":
  // 3), -1 for the others.
  static int64_t expert_of(const std::string& param_name);

  std::shared_ptr<MixtralModel> model;
  std::shared_ptr<engine::nn::Linear> lm_head;  // null when tied to model.embed_tokens

 private:
  engine::Tensor run(const engine::Tensor& ids, KVCache* cache);
  ModelConfig config_;
};

// What the router losses read of a forward, summed over every layer's rows: one process adds
// the MoE blocks in layer order; pipeline stages carry the sums with the hidden states, so the
// last stage computes the losses of all layers and their gradients flow back to each router.
struct RouterSums {
  engine::Tensor probs;         // [E]: router probabilities summed over rows (with their graph)
  engine::Tensor lse_sq;        // [1]: logsumexp(router logits)^2 summed over rows (with graph)
  std::vector<double> choices;  // [E]: the top-k choices that went to each expert
  int64_t rows = 0;
  // Adds `block`'s last forward.
  void add(const MixtralSparseMoeBlock& block);
};
// HF's load-balancing loss (unscaled) and the z-loss of the sums.
engine::Tensor moe_aux_loss(const RouterSums& sums);
engine::Tensor moe_z_loss(const RouterSums& sums);
// `loss` (the cross-entropy) plus the router losses `c` asks for (Mixtral::loss's rule).
engine::Tensor with_router_losses(const engine::Tensor& loss, const ModelConfig& c,
                                  const RouterSums& sums);

// A pipeline stage's activation (Mixtral's and its sharded form's pipeline_*): the hidden
// states [B, T, C] and the router sums in one row of B*T*C + 2E + 2 values (f32 or f64), for a
// window `ids` [B, T + 1] whose first T positions are routed.
engine::Tensor pack_stage(const engine::Tensor& x, const RouterSums& sums, int64_t experts);
std::pair<engine::Tensor, RouterSums> unpack_stage(const engine::Tensor& packed,
                                                   const engine::Tensor& ids, const ModelConfig& c);

// What Mixtral and its sharded form (models/policies) share, over the MoE blocks below `model`
// in layer order. The router losses and loads are those of the last forward.
std::vector<MixtralSparseMoeBlock*> moe_blocks(const engine::nn::Module& model);
RouterSums router_sums(const engine::nn::Module& model);
engine::Tensor with_router_losses(const engine::Tensor& loss, const ModelConfig& c,
                                  const engine::nn::Module& model);
// The last forward's expert load per layer and router losses, for the metrics line. Under
// pipeline stages (`stages` non-null: collective over it) each stage ran its own layers' blocks
// and the figures are gathered over the stages.
struct RouterReport {
  std::vector<ExpertLoad> load;  // per layer
  double aux_loss = 0, z_loss = 0;
};
RouterReport router_report(const engine::nn::Module& model, parallel::Communicator* stages);
// Every MoE block's expert group (Mixtral::set_expert_parallel); throws when `model` has none.
void set_expert_parallel(const engine::nn::Module& model, parallel::Communicator* group);

}  // namespace mammoth::models
