// LoRA adapters (models/lora.h) on a model's tensor-parallel form (apply_policy), in the
// Megatron / PEFT-TP layout:
//
//   column-parallel base (W split by output rows):  A [r, in] replicated, B [out/tp, r] split
//                                                    exactly as W's rows (GPT-2's fused q|k|v:
//                                                    piece r of each segment)
//   row-parallel base (W split by input columns):    A [r, in/tp] split as W's columns,
//                                                    B [out, r] replicated
//
// A column layer adds B_r A x to its output shard; a row layer adds B A_r x_r to its partial
// product before the all-reduce (or reduce-scatter), so the partial updates sum to B A x as the
// partial products sum to W x. The replicated factor's gradient is then partial on every rank
// (column: A's, summed over the output shards; row: B's, over the input shards): sync_grad sums
// it over tp, so every rank's copy gets the same update and stays bitwise equal. Sequence
// parallelism needs nothing more under split_gather (a column layer's input is the gathered
// sequence, a row layer's partial is reduce-scattered with the base's); under ulysses / ring
// each sp rank sees part of the sequence, so every factor's gradient is also summed over sp.
//
// The parameters keep the single-process names ("h.0.attn.c_attn.lora_A.weight"); spec() says
// how each is split, for checkpoints (written as the whole single-process tensors) and gathers.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/nn/module.h"
#include "models/lora.h"
#include "models/policies/policy.h"

namespace mammoth::models {

class TpLora {
 public:
  // Hangs this rank's pieces of `full`'s adapters (wrapping the single-process model that
  // `sharded` was built from) on `sharded`'s parallel layers and freezes `sharded`. Throws
  // naming the layer for a target the layout cannot split (a replicated GQA KV head copy), and
  // for dropout > 0 (the mask of a split input or sequence would differ from one process's).
  TpLora(const LoraAdapters& full, ShardedLanguageModel& sharded);
  TpLora(const TpLora&) = delete;
  TpLora& operator=(const TpLora&) = delete;

  // This rank's pieces, by the single-process names (what the optimizer trains), on the host.
  engine::nn::NamedTensors& parameters() { return local_; }
  // The single-process adapter tensors (names, shapes, dtypes: what a checkpoint holds).
  const engine::nn::NamedTensors& single_process_parameters() const { return whole_; }
  bool has(const std::string& name) const { return specs_.count(name) > 0; }
  parallel::ShardSpec spec(const std::string& name) const;
  // Sums a replicated factor's gradient over tp (a split one is left as it is), and every
  // factor's over sp. Collective over tp and sp: every rank calls it for the same names in the
  // same order.
  void sync_grad(const std::string& name, const engine::Tensor& t) const;
  void sync_grads() const;
  // Whether this tp rank counts `name`'s gradient in a global norm: split factors on every
  // rank, replicated ones on tp rank 0.
  bool grad_owner(const std::string& name) const;
  // The whole single-process tensors (collective over tp).
  engine::nn::NamedTensors full_parameters() const;

 private:
  parallel::Communicator& tp_;
  parallel::Communicator& sp_;
  std::vector<std::shared_ptr<LoraLinear>> loras_;
  engine::nn::NamedTensors local_, whole_;
  std::map<std::string, parallel::ShardSpec> specs_;  // dim < 0: replicated
};

}  // namespace mammoth::models
