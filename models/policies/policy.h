// Sharding policies (the Shardformer idea): turn a single-device zoo model into its tensor /
// sequence parallel form, so that model code never branches on the parallel layout.
//
// A policy per family builds the same module tree from parallel layers (column-/row-parallel
// linear, vocab-parallel embedding and loss, Ulysses or ring attention), with the single-device
// parameter names, and copies this rank's shard of every weight from the model it is given
// (built with the same seed on every rank). A new family needs only a policy.
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
// Layouts: tp splits heads, MLP width and vocabulary over the mesh's tp axis. Sequence modes:
//   split_gather  Megatron SP on the tp group: norms/residuals hold T/tp positions, all-gather
//                 before column-parallel layers, reduce-scatter after row-parallel ones;
//   ulysses       on the sp axis: all-to-all between sequence and heads around attention;
//   ring          on the sp axis: ring attention over a zigzag (load-balanced) layout.
// Vocabulary sizes and sequence lengths that do not divide are padded; padding never reaches
// the loss, and full_parameters() returns the unpadded tensors.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "engine/nn/module.h"
#include "models/model.h"
#include "parallel/mesh.h"
#include "parallel/tensor_parallel/layers.h"

namespace mammoth::models {

enum class SpMode { kNone, kSplitGather, kUlysses, kRing };
const char* sp_mode_name(SpMode mode);              // "none", "split_gather", "ulysses", "ring"
SpMode sp_mode_from_name(const std::string& name);  // throws naming the value

struct ShardOptions {
  SpMode sp_mode = SpMode::kNone;
};

// A language model in its tp/sp form. Its parameters are this rank's shards, named like the
// single-device model's.
class ShardedLanguageModel : public LanguageModel {
 public:
  ShardedLanguageModel(const parallel::DeviceMesh& mesh, const ShardOptions& options);
  const ShardOptions& shard_options() const { return options_; }
  const parallel::DeviceMesh& mesh() const { return mesh_; }

  // How each parameter is split over the tp group (replicated when absent).
  parallel::ShardSpec spec(const std::string& name) const;
  // Copies this rank's shard of every parameter of `full` (the same family and config).
  void load_from(const Model& full);
  // The single-device parameters, unpadded, gathered over tp (collective over the tp group).
  engine::nn::NamedTensors full_parameters() const;
  // After backward: sums the gradients that are partial because each rank saw only part of
  // the sequence (replicated parameters under split_gather over tp; all under ulysses/ring
  // over sp). Collective; call on every rank before the dp reduction and the optimizer.
  void sync_grads() const;

 protected:
  void set_spec(const std::string& name, const parallel::ShardSpec& spec) { specs_[name] = spec; }

  const parallel::DeviceMesh& mesh_;
  ShardOptions options_;

 private:
  std::map<std::string, parallel::ShardSpec> specs_;
};

// The policy of `model`'s family (throws naming the family when it has none yet).
std::shared_ptr<ShardedLanguageModel> apply_policy(const Model& model,
                                                   const parallel::DeviceMesh& mesh,
                                                   const ShardOptions& options = {});

// Family policies (one file each).
std::shared_ptr<ShardedLanguageModel> gpt2_policy(const Model& model,
                                                  const parallel::DeviceMesh& mesh,
                                                  const ShardOptions& options);

}  // namespace mammoth::models
