// Sharding policies (the Shardformer idea): turn a single-device zoo model into its tensor /
// sequence parallel form, so that model code never branches on the parallel layout.
//
// A policy per family builds the same module tree from parallel layers (column-/row-parallel
// linear, vocab-parallel embedding and loss, Ulysses or ring attention), with the single-device
// parameter names, and copies this rank's shard of every weight from the model it is given
// (built with the same seed on every rank). Every family's blocks are written once: the
// policy builds the family's own blocks from Layers(tp, mode) (models/layers.h), adds only the
// sharded top (vocab-parallel embedding and head or loss, the ViT class-token classifier, the
// sequence plan each block gets as a SeqContext) and reads the specs off the layers
// (set_layer_specs). The bookkeeping
// every family shares (specs, load/gather/shard of tensors, gradient sums, sequence plans) is
// ShardLayout, a mixin of both ShardedLanguageModel and ShardedVit (an image classifier).
//
//   auto model = models::create_language_model("gpt2-tiny", {.seed = 1});
//   parallel::DeviceMesh mesh(parallel::mpi_world(), {.dp = 2, .tp = 2});
//   auto sharded = models::apply_policy(*model, mesh, {.sp_mode = models::SpMode::kSplitGather});
//   Tensor loss = sharded->loss(ids);     // ids: the whole [B, T] batch of this dp rank
//   loss.backward();
//   sharded->sync_grads();                // sequence-partial gradients -> full (tp / sp groups)
//   ... dp all-reduce (DataParallel), optimizer over sharded->named_parameters() ...
//   auto full = sharded->full_parameters();  // unpadded single-device tensors, for checkpoints
//
//   auto vit = std::dynamic_pointer_cast<models::Vit>(models::create_model("vit-tiny"));
//   auto sharded_vit = models::vit_policy(*vit, mesh, {.sp_mode = models::SpMode::kRing});
//   Tensor l = sharded_vit->loss(pixels, labels);  // the same sync_grads / full_parameters
//
// Layouts: tp splits heads, MLP width and vocabulary over the mesh's tp axis. Sequence modes:
//   split_gather  Megatron SP on the tp group: norms/residuals hold T/tp positions, all-gather
//                 before column-parallel layers, reduce-scatter after row-parallel ones;
//   ulysses       on the sp axis: all-to-all between sequence and heads around attention;
//   ring          on the sp axis: ring attention over a zigzag (load-balanced) layout.
// Vocabulary sizes and sequence lengths that do not divide are padded; padding never reaches
// the loss, and full_parameters() returns the unpadded tensors. The sharded model takes over
// the model's training mode and activation checkpointing (each block recomputed in backward,
// its collectives with it).
//
// Grouped-query attention (LLaMA) under tp: the H query heads must divide by tp. The Hk key/value
// heads are split over tp when Hk % tp == 0; when there are fewer of them than ranks and
// tp % Hk == 0, rank r holds a copy of KV head r / (tp / Hk) (the one its H/tp query heads use;
// set_replicated_heads) and sync_grads sums the copies' gradients. Any other Hk (neither divides
// the other, e.g. Hk = 3 at tp = 2) is refused with an error naming the sizes: a rank's query
// heads would then need parts of two KV heads, whose copies would differ in size between ranks.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/module.h"
#include "models/layers.h"
#include "models/model.h"
#include "parallel/mesh.h"
#include "parallel/sequence_parallel/sequence_parallel.h"
#include "parallel/tensor_parallel/layers.h"

namespace mammoth::models {

struct ShardOptions {
  SpMode sp_mode = SpMode::kNone;
};

// The sharding bookkeeping of a model in its tp/sp form, shared by every family's sharded
// model (ShardedLanguageModel, ShardedVit): which parameters are split and how, moving tensors
// between the single-device and the sharded form, the gradient sums the sequence split needs,
// and the sequence layout. It needs only the parameters and the mesh, so it is a mixin beside
// the Model base rather than a Model itself; `self` is the sharded module whose
// named_parameters() it manages (the object that derives from this).
class ShardLayout {
 public:
  ShardLayout(const engine::nn::Module& self, const parallel::DeviceMesh& mesh,
              const ShardOptions& options);
  virtual ~ShardLayout() = default;
  ShardLayout(const ShardLayout&) = delete;
  ShardLayout& operator=(const ShardLayout&) = delete;

  const ShardOptions& shard_options() const { return options_; }
  const parallel::DeviceMesh& mesh() const { return mesh_; }

  // How each parameter is split over the tp group (not sharded when absent). Careful: a
  // replicated KV head (GQA, fewer KV heads than tp) has no spec either, yet holds one head,
  // not the whole tensor; holds_full() tells the two apart.
  parallel::ShardSpec spec(const std::string& name) const;
  // Whether this rank's `name` is the whole single-device tensor (neither sharded nor one
  // replicated KV head): what a checkpoint writer may save from one rank as it is.
  bool holds_full(const std::string& name) const;
  // Copies this rank's shard of every parameter of `full` (the same family and config).
  void load_from(const Model& full);
  // The single-device parameters, unpadded, gathered over tp (collective over the tp group).
  engine::nn::NamedTensors full_parameters() const;
  // The same for one tensor shaped like parameter `name`'s shard (the parameter itself, or
  // its optimizer state): the single-device tensor, unpadded (collective over tp).
  engine::Tensor full_tensor(const std::string& name, const engine::Tensor& local) const;
  // This rank's shard of a single-device tensor shaped like parameter `name` (a copy).
  engine::Tensor shard_of(const std::string& name, const engine::Tensor& full) const;
  // After backward: sums the gradients that are partial because each rank saw only part of
  // the sequence (replicated parameters under split_gather over tp; all under ulysses/ring
  // over sp). Collective; call on every rank before the dp reduction and the optimizer.
  // Parameters without a gradient (unused by the loss) are left without one.
  void sync_grads() const;
  // The same for one parameter `t` named `name` (of this model): what data parallelism runs
  // on each parameter of a gradient bucket just before reducing it, so that the sums and the
  // dp reduction overlap the backward (DataParallel::set_grad_sync). Collective over the
  // groups above: every rank of them must call it for the same parameters in the same order.
  void sync_grad(const std::string& name, const engine::Tensor& t) const;
  // Whether this tp rank counts `name`'s gradient in a global norm (summed over tp afterwards):
  // sharded parameters on every rank, a replicated KV head on the first rank holding it, other
  // replicated parameters on tp rank 0.
  bool grad_owner(const std::string& name) const;

 protected:
  void set_spec(const std::string& name, const parallel::ShardSpec& spec) { specs_[name] = spec; }
  // `name` holds `heads` heads of `head_rows` rows each along dim 0, fewer heads than tp ranks
  // (tp % heads == 0): rank r holds a copy of head r / (tp / heads) (GQA's KV projections).
  void set_replicated_heads(const std::string& name, int64_t heads, int64_t head_rows);
  // The same for a LLaMA-style attention at `prefix` ("model.layers.3.self_attn."): its k_proj
  // and v_proj weights, and their biases when the config has them (Qwen2).
  void set_replicated_kv_heads(const std::string& prefix, const ModelConfig& c);
  // The specs of every parallel layer below `self`, by its parameters' names: a column-parallel
  // linear's weight and bias (split by output rows), a row-parallel linear's weight (split by
  // input columns; its bias is whole), a vocab-parallel embedding's table. Parameters already
  // given replicated heads are left to those, so call set_replicated_heads first.
  void set_layer_specs();

  // How a batch of T positions is laid out under the sequence mode (shared by the families).
  struct SeqPlan {
    std::shared_ptr<parallel::SequenceLayout> layout;
    int part = 0;                // this rank's part of the layout
    std::vector<int64_t> local;  // global positions this rank holds (>= T: padding)
    std::vector<int64_t> every;  // 0 .. padded - 1
  };
  bool sequence_on_sp() const {
    return options_.sp_mode == SpMode::kUlysses || options_.sp_mode == SpMode::kRing;
  }
  // split_gather: T/tp contiguous positions per tp rank; ulysses: T/sp contiguous per sp rank;
  // ring: a zigzag pair of chunks per sp rank; none: the whole sequence.
  SeqPlan plan_sequence(int64_t T) const;
  // The group the sequence is split over: tp under split_gather, sp under ulysses/ring, else
  // a group of one (sp, whose size is then 1).
  parallel::Communicator& sequence_group() const;
  // The SeqContext of a bidirectional encoder's blocks (BERT, ViT) for `batch` sequences laid
  // out by `plan`: a key mask [batch, padded] on `device` hiding split_gather's padded positions
  // and, when `attention_mask` [batch, T] is given, the positions it holds 0 at, in every sp
  // mode (ulysses and ring attention hide the layout's padding themselves).
  SeqContext encoder_context(const SeqPlan& plan, int64_t batch, Device device,
                             const engine::Tensor& attention_mask = engine::Tensor()) const;

  const parallel::DeviceMesh& mesh_;
  ShardOptions options_;

 private:
  struct ReplicatedHeads {
    int64_t heads = 0, head_rows = 0;
  };
  const ReplicatedHeads* replicated_heads(const std::string& name) const;

  const engine::nn::Module& self_;
  std::map<std::string, parallel::ShardSpec> specs_;
  std::map<std::string, ReplicatedHeads> replicated_;
};

// A language model in its tp/sp form. Its parameters are this rank's shards, named like the
// single-device model's.
class ShardedLanguageModel : public LanguageModel, public ShardLayout {
 public:
  ShardedLanguageModel(const parallel::DeviceMesh& mesh, const ShardOptions& options);

 protected:
  // Token ids [B, |pos|] of `pos` from ids [B, T] (padding positions: token 0).
  static engine::Tensor ids_at(const engine::Tensor& ids, const std::vector<int64_t>& pos);
  // The mean loss of a batch from this rank's vocab-parallel logits [B, n, Vp/tp], whose rows
  // are the global positions `rows` (>= T: padding): next-token targets from ids, or `targets`
  // (-100: no loss); the sum is reduced over sp when the sequence is on sp.
  engine::Tensor loss_from_local(const engine::Tensor& logits, const std::vector<int64_t>& rows,
                                 const engine::Tensor& ids, const engine::Tensor& targets,
                                 int64_t vocab_start, int64_t vocab_size) const;
  // The full logits [B, T, V] (gathered over tp's vocabulary and sp's sequence) from this
  // rank's [B, n, Vp/tp] rows `rows` in `plan`.
  engine::Tensor gather_logits(const engine::Tensor& logits, const SeqPlan& plan, int64_t T,
                               int64_t vocab_size) const;
};

// A decoder-only language model (GPT-2, LLaMA) in its tp/sp form, written as the pipeline's
// pieces: the whole forward is pipeline_embed, every pipeline_block, then local_logits (the
// final norm and this rank's vocabulary-parallel head). forward, loss and pipeline_loss follow
// from those, once for every family.
class ShardedDecoder : public ShardedLanguageModel {
 public:
  ShardedDecoder(const ModelConfig& config, const parallel::DeviceMesh& mesh,
                 const ShardOptions& options);
  const ModelConfig& config() const override { return config_; }
  // The single-device layout: full_parameters() are what a checkpoint holds.
  HfLayout hf_layout() const override;
  engine::Tensor forward(const engine::Tensor& ids) override;
  engine::Tensor loss(const engine::Tensor& ids, const engine::Tensor& targets) override;
  bool supports_pipeline() const override { return true; }
  engine::Tensor pipeline_loss(const engine::Tensor& x, const engine::Tensor& ids) override;

  // Serving under tp (serve/): every rank runs the same step on its heads, its KV cache holding
  // only those (kv_cache_heads), and gets the whole logits [S, V] (gathered over the
  // vocabulary). A family serves once it implements paged_embed and paged_block (and says so in
  // supports_paged_kv); sequence parallelism is refused.
  engine::Tensor forward_paged(const engine::Tensor& ids, const std::vector<PagedSequence>& seqs,
                               PagedKVCache* cache) override;
  // A KV head split over tp, or (GQA with fewer KV heads than ranks) the one copy a rank holds.
  int64_t kv_cache_heads() const override;

 protected:
  // ids [N] at positions pos [N] -> the first block's input [1, N, C].
  virtual engine::Tensor paged_embed(const engine::Tensor& ids, const engine::Tensor& pos);
  // Block l over x [1, N, C], the new tokens of `seqs` (LanguageModel::forward_paged).
  virtual engine::Tensor paged_block(int64_t l, const engine::Tensor& x,
                                     const std::vector<PagedSequence>& seqs, PagedKVCache* cache);
  // This rank's logits [B, n, Vp/tp] from the last block's output.
  virtual engine::Tensor local_logits(const engine::Tensor& x) const = 0;
  // The first id of this rank's vocabulary shard.
  virtual int64_t vocab_start() const = 0;
  // The rows local_logits covers: every position under split_gather, this rank's otherwise.
  const std::vector<int64_t>& logit_rows(const SeqPlan& plan) const;

  ModelConfig config_;

 private:
  struct Local {
    engine::Tensor logits;      // [B, n, Vp/tp]: the rows of `rows`
    std::vector<int64_t> rows;  // global positions (>= T: padding)
    SeqPlan plan;
  };
  Local run(const engine::Tensor& ids);
};

class Vit;

// ViT (models/vit) in its tp/sp form: an image classifier, not a language model, so it has its
// own base. forward and loss take the whole batch of this dp rank on every tp/sp rank and give
// the same result on all of them.
class ShardedVit : public Model, public ShardLayout {
 public:
  ShardedVit(const parallel::DeviceMesh& mesh, const ShardOptions& options);
  // pixels [B, C, H, W] -> class logits [B, num_labels].
  virtual engine::Tensor forward(const engine::Tensor& pixels) = 0;
  // Mean cross-entropy of forward(pixels) against labels i64 [B].
  virtual engine::Tensor loss(const engine::Tensor& pixels, const engine::Tensor& labels) = 0;
};

// BERT's sequence classification in its tensor/sequence-parallel form (tp, split_gather over
// it, Ulysses and ring over sp): BertForSequenceClassification's logits [B, num_labels], the
// same on every rank, from ids i64 [B, T] and attention_mask [B, T] (nonzero: a real token;
// undefined: every token), which is the key mask in every mode.
class ShardedSequenceClassifier {
 public:
  virtual ~ShardedSequenceClassifier() = default;
  virtual engine::Tensor classify(const engine::Tensor& ids,
                                  const engine::Tensor& attention_mask) = 0;
};

// A family policy's last step: `sharded` (built for `model`'s config) takes this rank's shards
// of `model`'s weights, its training mode and its activation checkpointing.
template <class Sharded>
std::shared_ptr<Sharded> adopt(std::shared_ptr<Sharded> sharded, const Model& model) {
  sharded->load_from(model);
  sharded->train(model.is_training());
  sharded->set_recompute_blocks(model.recompute_blocks());
  return sharded;
}

// The policy of `model`'s family (throws naming the family when it has none yet).
std::shared_ptr<ShardedLanguageModel> apply_policy(const Model& model,
                                                   const parallel::DeviceMesh& mesh,
                                                   const ShardOptions& options = {});

// A language-model family's tensor/sequence-parallel form, as apply_policy calls it.
using PolicyFn = std::shared_ptr<ShardedLanguageModel> (*)(const Model& model,
                                                           const parallel::DeviceMesh& mesh,
                                                           const ShardOptions& options);
// Makes `policy` apply_policy's form of `family`; throws when the family has one already.
// Returns true, so that each family's policy file registers itself with one namespace-scope
// line (this library is linked whole, models/policies/BUILD.bazel):
//   [[maybe_unused]] const bool kRegistered = register_policy(Family::kGpt2, gpt2_policy);
bool register_policy(Family family, PolicyFn policy);

// Family policies (one file each).
std::shared_ptr<ShardedLanguageModel> gpt2_policy(const Model& model,
                                                  const parallel::DeviceMesh& mesh,
                                                  const ShardOptions& options);
std::shared_ptr<ShardedLanguageModel> bert_policy(const Model& model,
                                                  const parallel::DeviceMesh& mesh,
                                                  const ShardOptions& options);
std::shared_ptr<ShardedLanguageModel> llama_policy(const Model& model,
                                                   const parallel::DeviceMesh& mesh,
                                                   const ShardOptions& options);
// Tensor parallelism inside attention, the experts replicated over tp; no sequence modes.
std::shared_ptr<ShardedLanguageModel> mixtral_policy(const Model& model,
                                                     const parallel::DeviceMesh& mesh,
                                                     const ShardOptions& options);
// ViT's policy (vit_policy.cc); apply_policy refuses ViT, which is not a language model.
std::shared_ptr<ShardedVit> vit_policy(const Vit& model, const parallel::DeviceMesh& mesh,
                                       const ShardOptions& options = {});

}  // namespace mammoth::models
