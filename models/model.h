// The interfaces every model of the zoo implements: Model (config + Hugging Face weight layout)
// and LanguageModel (token ids -> logits, a loss, and incremental decoding with a KV cache).
//
//   std::shared_ptr<LanguageModel> m = create_language_model("gpt2-tiny");   // registry.h
//   Tensor logits = m->forward(ids);          // ids i64 [B, T] -> [B, T, V]
//   Tensor loss = m->loss(ids);               // next-token cross-entropy
//   loss.backward();
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/nn/module.h"
#include "engine/tensor.h"
#include "models/config.h"

namespace mammoth::models {

// Where one of our parameters lives in a Hugging Face checkpoint.
struct HfParam {
  std::string param;        // our name, as in named_parameters()
  std::string hf_name;      // the canonical name in HF files (what save writes)
  bool transposed = false;  // the file holds the 2-D weight as [in, out] (GPT-2's Conv1D)
  bool optional = false;    // may be missing on load (a task head HF would "newly initialise")
};

// A family's mapping between our parameters and a Hugging Face state dict.
struct HfLayout {
  std::vector<HfParam> params;
  // (from, to): a file name may also spell a hf_name that starts with `from` as `to` + rest.
  // GPT-2 {"", "transformer."} accepts GPT2LMHeadModel's prefixed names besides GPT2Model's.
  std::vector<std::pair<std::string, std::string>> prefix_aliases;
  // Tensors that may sit in a file without being parameters: buffers (attn.bias masks,
  // position_ids, rotary inv_freq), tied copies (lm_head.weight), heads we do not build.
  // An entry ending in '*' matches a prefix; one starting with '*' matches a suffix.
  std::vector<std::string> ignored;
};

// Every zoo model: a Module with a config and a Hugging Face weight layout.
class Model : public engine::nn::Module {
 public:
  virtual const ModelConfig& config() const = 0;
  // Default: every parameter under its own name, none transposed.
  virtual HfLayout hf_layout() const;
  // Activation checkpointing while training (engine/nn/checkpoint.h): the first `blocks`
  // transformer blocks (-1: every block; 0: none) keep only their input and are recomputed in
  // backward (Megatron's "block" recompute method: the first blocks, whose activations live
  // longest under a pipeline schedule).
  void set_recompute_blocks(int64_t blocks) { recompute_blocks_ = blocks; }
  int64_t recompute_blocks() const { return recompute_blocks_; }
  // Whether block `layer` is recomputed (while training).
  bool recomputes(int64_t layer) const {
    return is_training() && (recompute_blocks_ < 0 || layer < recompute_blocks_);
  }

  // Pipeline stages (models/pipeline/pipeline.h): the forward cut into embedding, blocks and
  // head, and which part uses each parameter. A family that implements these trains under
  // --pp; the defaults throw naming the family. A stage receives one tensor per micro-batch:
  // next-token windows [B, T + 1] for causal LMs, and a family's own packing otherwise (BERT's
  // masked LM, ViT's pixels and labels).
  virtual bool supports_pipeline() const { return false; }
  // The micro-batch -> the first block's input.
  virtual engine::Tensor pipeline_embed(const engine::Tensor& ids);
  // Block l on x; ids is the micro-batch (for position-dependent layouts).
  virtual engine::Tensor pipeline_block(int64_t l, const engine::Tensor& x,
                                        const engine::Tensor& ids);
  // The last block's output -> the loss (causal LMs: logits[:, :-1] against ids[:, 1:]).
  virtual engine::Tensor pipeline_loss(const engine::Tensor& x, const engine::Tensor& ids);
  // Which parts use parameter `name`: the embedding, the head (both for tied embeddings),
  // or block `block` (>= 0).
  struct PipelinePart {
    bool embed = false, head = false;
    int64_t block = -1;
  };
  virtual PipelinePart pipeline_part(const std::string& name) const;
  // A classifier's micro-batch as the one tensor its stages receive, from the trainer's input
  // and target (FamilySpec::classifier_pipeline); the default throws naming the family.
  virtual engine::Tensor pipeline_batch(const engine::Tensor& input,
                                        const engine::Tensor& target) const;

 protected:
  int64_t recompute_blocks_ = 0;
};

// Runs one transformer block, through engine::nn::checkpoint when `recompute` is set (and a
// graph is being recorded); otherwise directly.
engine::Tensor run_block(bool recompute,
                         const std::function<engine::Tensor(const engine::Tensor&)>& block,
                         const engine::Tensor& x);

// Keys and values of past positions, per layer, for incremental decoding.
struct KVCache {
  std::vector<engine::Tensor> k, v;  // per layer [B, Hk, capacity, head_dim]
  int64_t length = 0;                // positions filled
  int64_t capacity = 0;

  // Appends k, v [B, Hk, t, D] of `layer` at position `length` (no autograd) and returns the
  // keys and values of positions [0, length + t). The caller advances `length` once per step.
  std::pair<engine::Tensor, engine::Tensor> append(int64_t layer, const engine::Tensor& k_new,
                                                   const engine::Tensor& v_new);
};

// Keys and values of many sequences in fixed-size blocks from one pool (serving: serve/). Block b
// holds positions [b * block_size, (b + 1) * block_size) of whichever sequence owns it; a
// sequence's block table lists its blocks in position order, so position p lives in row
// table[p / block_size] * block_size + p % block_size (dim 1) of every layer's k and v.
struct PagedKVCache {
  // Per layer [Hk, num_blocks * block_size, head_dim]: heads outermost, so a sequence's keys
  // gathered in position order are already attention's contiguous [Hk, T, D].
  std::vector<engine::Tensor> k, v;
  int64_t block_size = 16;
  int64_t num_blocks = 0;
};

// One sequence's share of a forward_paged step: `count` new tokens at positions
// [start, start + count), after the `start` positions its blocks already hold.
struct PagedSequence {
  const std::vector<int64_t>* blocks = nullptr;  // covers at least start + count positions
  int64_t start = 0;
  int64_t count = 0;
};

// forward_paged's plumbing, shared by the families. paged_append writes one sequence's new keys
// and values k_new, v_new [1, Hk, count, D] into its blocks of `layer` (no autograd) and returns
// all its keys and values [1, Hk, start + count, D], gathered from the blocks in position order.
std::pair<engine::Tensor, engine::Tensor> paged_append(PagedKVCache* cache, int64_t layer,
                                                       const PagedSequence& seq,
                                                       const engine::Tensor& k_new,
                                                       const engine::Tensor& v_new);
// Causal attention of each sequence over its paged keys and values: q [1, N, H, D] and k, v
// [1, N, Hk, D] are every sequence's new rows in the order of `seqs` (rotated already, where the
// family rotates); k and v are written to the blocks of `layer`. Returns [1, N, H * D]. The
// tensor-parallel forms (models/policies) call it with this rank's heads. `window` > 0: a
// sliding window (Mistral's sliding_window), as engine::AttentionOptions::window.
engine::Tensor paged_attention(PagedKVCache* cache, int64_t layer,
                               const std::vector<PagedSequence>& seqs, const engine::Tensor& q,
                               const engine::Tensor& k, const engine::Tensor& v,
                               int64_t window = 0);
// Checks ids [N] against `seqs` and the pool, names `who`; returns the positions i64 [N].
engine::Tensor paged_positions(const engine::Tensor& ids, const std::vector<PagedSequence>& seqs,
                               const PagedKVCache& cache, int64_t max_seq, const char* who);
// x [1, N, C] -> [1, S, C]: the row of each sequence's last new token.
engine::Tensor paged_last_rows(const engine::Tensor& x, const std::vector<PagedSequence>& seqs);

class LanguageModel : public Model {
 public:
  // ids i64 [B, T] -> logits [B, T, V]
  virtual engine::Tensor forward(const engine::Tensor& ids) = 0;
  // Mean cross-entropy. Without targets: next-token prediction, logits[:, :-1] against
  // ids[:, 1:] (T-1 predictions per row). With targets i64 [B, T]: logits against targets,
  // positions with -100 ignored (BERT's masked-LM labels).
  virtual engine::Tensor loss(const engine::Tensor& ids,
                              const engine::Tensor& targets = engine::Tensor());

  // Causal models: logits [B, t, V] for `ids` [B, t] that continue the positions already in
  // `cache`; appends their keys and values and advances cache->length by t.
  virtual bool supports_kv_cache() const { return false; }
  virtual engine::Tensor forward_cached(const engine::Tensor& ids, KVCache* cache);
  // An empty cache for `batch` sequences of up to `capacity` positions.
  KVCache make_cache(int64_t batch, int64_t capacity) const;

  // Continuous batching: one step over sequences of different lengths whose keys and values
  // live in `cache`'s blocks. ids i64 [N] are every sequence's new tokens, concatenated in the
  // order of `seqs` (N = sum of counts); their keys and values are written to the blocks, and
  // the result is the logits [S, V] of each sequence's last new token. Projections and MLPs
  // run once over all N tokens; attention runs per sequence over its own positions.
  virtual bool supports_paged_kv() const { return false; }
  virtual engine::Tensor forward_paged(const engine::Tensor& ids,
                                       const std::vector<PagedSequence>& seqs, PagedKVCache* cache);
  // An empty pool of `num_blocks` blocks of `block_size` positions, beside the weights.
  PagedKVCache make_paged_cache(int64_t num_blocks, int64_t block_size) const;
  // The key/value heads this model's caches hold: config().n_kv_head, or a tensor-parallel
  // rank's share of them.
  virtual int64_t kv_cache_heads() const { return config().n_kv_head; }
};

}  // namespace mammoth::models
