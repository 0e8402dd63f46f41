// What a model family declares, once, next to its model: its name and Hugging Face model_types,
// how to build it, its part of config.json (read and write), its registered configs, what its
// configs use (validate() refuses the fields it does not), and its costs (parameters, FLOPs,
// activation bytes) for analyze and the planner's memory model, and how it trains (objective,
// pipeline form, LoRA targets, the time model's block shape, what its classifier and its plan
// rules allow). The generic code (registry, analyze, config validation, plan/, runtime/, the
// tools) looks the spec up by ModelConfig::family and never compares the tag with a family's.
//
// A family registers its spec in its own folder with one line (models/gpt2/gpt2_family.cc):
//
//   [[maybe_unused]] const bool kRegistered = register_family(gpt2_family());
//
// Families register during static initialisation, before anything looks them up. The library
// is linked whole (models/BUILD.bazel alwayslink), so a registration line is never
// dropped by the linker. A tensor/sequence-parallel form registers separately, in
// models/policies (policy.h: register_policy), which sits above this layer.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/json.h"
#include "models/config.h"
#include "models/model.h"

namespace mammoth::models {

// One tp rank's parameters as the sharding policies split them (plan/memory_model): a block's
// replicated vectors (norms, row-parallel biases; the rest of the block divides by tp), the
// parts outside the blocks, and the block's largest matrix.
struct TpParamSplit {
  int64_t replicated = 0;     // replicated elements of one block
  int64_t tied = 0;           // a table both the first and the last stage use
  int64_t embed = 0;          // first stage's, besides `tied`
  int64_t head = 0;           // last stage's, besides `tied`
  int64_t largest_block = 0;  // the largest parameter of a block on one rank
};

// The sizes plan/memory_model gives a family to count one micro-batch's activation bytes on one
// rank (the formula's terms are named after the forward code that saves them).
struct ActivationSizes {
  int64_t N = 0;     // tokens this rank computes
  int64_t Ns = 0;    // tokens held between blocks (split_gather: N / tp)
  int64_t C = 0;     // d_model
  int64_t Fl = 0;    // d_ff on one tp rank
  int64_t e = 0;     // bytes per activation element
  int64_t attn = 0;  // what one block's attention saves (q, k, v, output, merged heads, lse)
};

// A family's activation bytes per micro-batch; the memory model adds the generic terms (the
// logits and the loss's rows, the vocab-parallel embedding's product, attention dropout).
struct FamilyActivations {
  int64_t block = 0;      // one block's saved tensors
  int64_t block_bwd = 0;  // extra live inside one block's backward
  int64_t embed = 0;      // saved by the family's embeddings beyond the lookup
  int64_t head = 0;       // saved by the head, before its logits
};

struct FamilyCost {
  // Parameters of one block; `active`: those one token computes with (MoE: top-k experts).
  std::function<int64_t(const ModelConfig&, bool active)> block_params;
  // Of one block's parameters, its experts' (what --ep splits over the expert group; whole on
  // every tp rank). Families without experts keep the default.
  std::function<int64_t(const ModelConfig&)> expert_params = [](const ModelConfig&) {
    return int64_t{0};
  };
  // Parameters outside the blocks (tied tables once).
  std::function<int64_t(const ModelConfig&)> outside_params;
  // Of all parameters, the lookup tables (token, position, token type; no FLOPs).
  std::function<int64_t(const ModelConfig&)> embedding_params;
  // Forward matmul FLOPs per token at T positions: one block, and the head.
  std::function<double(const ModelConfig&, int64_t T)> block_flops;
  std::function<double(const ModelConfig&, int64_t T)> head_flops;
  // The positions analyze assumes when given none.
  std::function<int64_t(const ModelConfig&)> default_seq_len;
  // One tp rank's split: `Vp` is the vocabulary padded to a multiple of tp, `outside` the
  // unsharded parameters outside the blocks.
  std::function<TpParamSplit(const ModelConfig&, int tp, int64_t Vp, int64_t outside)> tp_split;
  std::function<FamilyActivations(const ModelConfig&, const ActivationSizes&)> activations;
};

// What `mammoth train` / `eval` optimise for a family's model without --task / --images.
enum class Objective {
  kCausalLm,         // next-token prediction
  kMaskedLm,         // masked positions predicted (eval: masked-LM loss)
  kImageClassifier,  // no language-model objective: trains with --images only
};

// How a plan's pipeline stages (--pp) cut the family's model.
enum class PipelineForm {
  kNone,           // no stages: --pp is refused
  kNextToken,      // stages carry each window as one row of seq_len + 1 tokens
  kOneDeviceOnly,  // stages of the one-device blocks, without --tp / --sp
};

// Engine calls one transformer block makes per micro-batch, counted in the model code (the
// families' blocks and models/layers.cc): ops recorded in the autograd graph forward (each has
// one backward), linear layers (one GEMM each forward, two backward), and parameter tensors
// (the optimizer's calls). plan/time_model charges a calibrated machine's overheads on them.
// The defaults are the LayerNorm block's (GPT-2): layer norm; c_attn; split; q, k, v: reshape,
// permute; attention; merge (permute, reshape); c_proj; add; layer norm; c_fc; gelu; c_proj;
// add.
struct BlockCalls {
  double ops = 19, linears = 4, param_tensors = 12, outside_tensors = 4;
};

// The block's shape as plan/time_model sees it: its calls, and which linears a calibrated GEMM
// rate is looked up for (in the order the block calls them).
struct TimeShape {
  BlockCalls calls;
  bool separate_qkv = false;  // q, k and v projections apart (else one fused q|k|v linear)
  bool gated_mlp = false;     // SwiGLU: gate, up, down, three d_ff-wide activations (else two)
};

struct FamilySpec {
  Family family = Family::kGpt2;  // the tag configs carry (unique among the families)
  const char* name = "";          // family_name(): the family's own HF model_type
  // The config.json model_types it reads (name first; LLaMA: also mistral, qwen2).
  std::vector<std::string> hf_model_types;
  // What its configs use; validate() refuses the others' fields being set.
  bool language_model = true;    // token ids in, logits out (create_language_model)
  bool token_vocabulary = true;  // needs vocab_size and max_seq
  bool rotary = false;           // rotary embeddings (rope_* fields), grouped-query attention
  bool llama_variants = false;   // llama_variant, sliding_window, qkv_bias, head_size
  bool experts = false;          // mixture-of-experts fields
  bool causal = true;            // attention masks future positions
  bool classifier = false;       // may carry a classification head (num_labels)
  // save_pretrained with class labels: the architecture written instead of the spec's (empty:
  // keep), and the parameter prefix a classifier's export leaves out (the MLM head).
  std::string classifier_architecture;
  std::string classifier_drops_prefix;
  // How messages name the family ("GPT-2"; the HF model_type is `name`).
  const char* title = "";
  Objective objective = Objective::kCausalLm;
  PipelineForm pipeline = PipelineForm::kNone;
  // PEFT's default LoRA targets for its model_type (empty: LoRA is refused for the family).
  std::string lora_targets;
  // Its tensor-parallel form shards the tied embedding as the LM head: untied, it has none.
  bool tp_needs_tied_head = false;
  // Router losses over every token of every layer (mixture of experts): no sequence split,
  // pipeline stages or recomputed blocks, and the step logs the experts' load and the losses.
  bool router_losses = false;
  // Classification (`classifier`, runtime/): the policies give the classifier a tp/sp form
  // (every sp mode); its blocks recompute under --recompute-blocks; it has one-device pipeline
  // stages, a micro-batch packed by Model::pipeline_batch.
  bool classifier_sharded = false;
  bool classifier_recompute = false;
  bool classifier_pipeline = false;
  TimeShape time_shape;

  // A model of `config` (not yet initialised).
  std::function<std::shared_ptr<Model>(const ModelConfig&)> build;
  // Its part of config_from_hf_json: the fields of a config.json of one of hf_model_types
  // (`type`), refusing unknown keys by name (hf::check_keys). `what` names the source.
  std::function<void(const json::Value& hf, const std::string& type, const std::string& what,
                     ModelConfig& c)>
      from_hf;
  // Its part of config_to_hf_json: `v` holds model_type (= name) already; torch_dtype follows.
  std::function<void(const ModelConfig& c, json::Value& v)> to_hf;
  // After a directory's config.json is read: what else the directory says (BERT's special
  // tokens from its tokenizer files). May be empty.
  std::function<void(const std::string& dir, ModelConfig& c)> from_dir;
  // Checks of its own fields, after the shared ones (may be empty). `where` starts messages.
  std::function<void(const ModelConfig& c, const std::string& where)> validate;
  // Registered names, in order.
  std::vector<ModelConfig> configs;
  FamilyCost cost;
};

// Adds a family; throws when its tag, name or a model_type is taken, or a function is missing.
// Returns true, so that a namespace-scope constant can hold the call.
bool register_family(FamilySpec spec);
// Every registered family, in tag order.
const std::vector<FamilySpec>& families();
// The family of a tag / of a config.json model_type (nullptr when none).
const FamilySpec& family_spec(Family f);  // throws naming the tag
const FamilySpec* family_for_model_type(const std::string& type);

// Cost terms families share: the transformer block with LayerNorms and biases (GPT-2, BERT,
// ViT) and the matmul FLOPs of a block from its projections and MLP.
namespace cost {
// A family of such blocks: block_params, block_flops, activations and default_seq_len (max_seq)
// set; the family adds the parts outside the blocks (and may replace any).
FamilyCost layer_norm_cost();
// Their tp split within a block (replicated vectors, largest matrix); the rest is left 0.
TpParamSplit layer_norm_tp_split(const ModelConfig& c, int tp);
// An encoder's (BERT, ViT; no pipeline): the word table vocab-parallel, the rest of what is
// outside the blocks on the first stage.
TpParamSplit encoder_tp_split(const ModelConfig& c, int tp, int64_t Vp, int64_t outside);
int64_t layer_norm_block_params(const ModelConfig& c);
// 2 (proj + mlp) plus the attention scores and weighted sum over the keys a query sees.
double block_flops(const ModelConfig& c, int64_t T, double proj, double mlp);
double layer_norm_block_flops(const ModelConfig& c, int64_t T);
// GPT-2 / BERT / ViT: block with two LayerNorms, a GELU MLP.
FamilyActivations layer_norm_activations(const ActivationSizes& s);
// The backward extra of a block whose MLP ends in one d_ff -> d linear.
int64_t mlp_block_bwd(const ActivationSizes& s);
// A head after one final norm: the norm's input and statistics, and its output (which the LM
// head or the classifier's input saves, gathered to all positions of the group).
int64_t final_norm_head(const ActivationSizes& s);
}  // namespace cost

// config.json reading helpers the families' from_hf share (models/registry.cc).
namespace hf {
int64_t get_int(const json::Value& hf, const char* key, int64_t fallback);
double get_double(const json::Value& hf, const char* key, double fallback);
bool get_bool(const json::Value& hf, const char* key, bool fallback);
// `key` may be absent or null, or one of `same` (spellings of the one computation implemented).
void check_activation(const json::Value& hf, const char* key,
                      std::initializer_list<const char*> same, const std::string& what);
// A key that is honoured only at the value that means "the computation we implement".
void require_bool(const json::Value& hf, const char* key, bool only, const std::string& what);
// Refuses, by name, every key that is neither in `known` (plus the keys check_common reads)
// nor inert: an unknown key may change the computation, and ignoring it would be silent.
void check_keys(const json::Value& hf, std::set<std::string> known, const std::string& type,
                const std::string& what);
// Keys every family accepts at the value that changes nothing (`encoder`: BERT, ViT).
void check_common(const json::Value& hf, bool encoder, const std::string& what);
// id2label's size, else num_labels, else `fallback`.
int64_t num_labels_of(const json::Value& hf, int64_t fallback);
// The keys BERT and ViT share (BertConfig / ViTConfig): checks `keys` plus the shared ones and
// reads the shared fields (`dropout`: the dropouts' default).
void read_encoder(const json::Value& hf, std::set<std::string> keys, const std::string& type,
                  const std::string& what, double dropout, ModelConfig& c);
// Writes them, with `architecture` and LABEL_i names for the labels.
void write_encoder(const ModelConfig& c, const char* architecture, json::Value& v);
}  // namespace hf

}  // namespace mammoth::models
