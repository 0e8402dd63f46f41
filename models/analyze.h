// Size and cost of a model from its config alone (so 70B shapes can be planned on a laptop):
// parameter count, FLOPs per token for forward and training, and memory for weights,
// gradients and optimizer states per storage dtype.
//
// FLOPs count matrix multiplications only, 2 per multiply-add (biases, norms, activations and
// softmax are lower order). Attention scores and the weighted sum cost 2*T*d_attn each per
// token and layer over the full T x T square (as Megatron-LM and PaLM count, not exploiting the
// causal mask). Training = 3 x forward (backward computes input and weight gradients).
// Memory assumes AdamW: two fp32 moments per parameter, plus an fp32 master copy when weights
// are stored in bf16/f16 (mixed precision, 16 bytes/param in total; ZeRO paper's K = 12).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/json.h"
#include "models/config.h"

namespace mammoth::models {

struct MemoryEstimate {
  DType dtype = DType::kF32;  // weight and gradient storage
  int64_t weights_bytes = 0;
  int64_t grads_bytes = 0;
  int64_t optimizer_bytes = 0;  // AdamW moments (+ fp32 master weights for 16-bit dtypes)
  int64_t total_bytes() const { return weights_bytes + grads_bytes + optimizer_bytes; }
};

struct ModelAnalysis {
  ModelConfig config;
  int64_t params = 0;            // every trainable parameter (tied weights once)
  int64_t embedding_params = 0;  // token, position and token-type tables (lookups, no FLOPs)
  int64_t seq_len = 0;           // context length the FLOPs assume (ViT: patches + 1)
  double flops_per_token_forward = 0;
  double flops_per_token_train = 0;  // forward + backward
  // The forward's parts (pipeline stages are balanced with these): one transformer block, and
  // the head (LM head / MLM transform / ViT patch projection and classifier).
  double block_flops_per_token_forward = 0;
  double head_flops_per_token_forward = 0;
  std::vector<MemoryEstimate> memory;  // f32, bf16, f16
};

// seq_len 0: the config's max_seq (ViT: num_patches + 1).
ModelAnalysis analyze(const ModelConfig& config, int64_t seq_len = 0);

// Parameter count alone (matches Module::num_parameters() of the built model).
int64_t count_parameters(const ModelConfig& config);

json::Value analysis_to_json(const ModelAnalysis& a);

// Where parameters (W), gradients (G) and AdamW states with fp32 masters (O) must fit under
// each offload setting of `mammoth train` (engine/offload), activations not counted:
//   none          W + G + O on the device
//   host          W + G on the device, O in host memory (CPU AdamW)
//   nvme          W + G on the device, O on NVMe (host holds 2 staging chunks)
//   host-paged    W + G + O homed in host memory; the device caches >= 4 chunks
//   nvme-paged    W + G homed in host memory, O on NVMe; the device caches >= 2 chunks and
//                 the host 2 staging chunks more
// A budget of 0 means unlimited (NVMe is always taken as unlimited). Under data parallelism
// (dp > 1; engine/offload shards the AdamW states by chunk, ZeRO-Offload style) each rank holds
// O / dp plus up to one chunk of each state list, and 4 chunk-sized host buffers for the
// gradient averages; W and G stay whole on every rank. The bytes are per rank.
struct OffloadFit {
  std::string setting;
  int64_t device_bytes = 0;  // needed on each tier by this model
  int64_t host_bytes = 0;
  int64_t nvme_bytes = 0;
  bool fits = false;
  // The deepest model of this family and width (n_layer varied) that fits; 0 when even one
  // layer does not.
  int64_t max_layers = 0;
  int64_t max_params = 0;
};
std::vector<OffloadFit> offload_fits(const ModelConfig& config, int64_t device_mem,
                                     int64_t host_mem, int64_t chunk_bytes, int dp = 1);
json::Value offload_fits_to_json(const std::vector<OffloadFit>& fits, int64_t device_mem,
                                 int64_t host_mem);

}  // namespace mammoth::models
