// Named model configurations and Hugging Face model directories.
//
// A model is named either by a registered config ("gpt2-tiny", "gpt2", "llama-7b", "bert-base",
// "vit-base-patch16-224", ...) or by a directory in Hugging Face's layout: config.json (its
// model_type picks the family) beside its weights, model.safetensors or a sharded set
// (model.safetensors.index.json + the shards it names). A registered name is freshly
// initialised; a directory without weights is an error unless fresh initialisation is asked for
// (ModelOptions::fresh_init), so that random weights are never trained or evaluated by mistake.
// create_model says on stderr where the weights came from ("[model] NAME: weights: ...").
//
// Every config.json key is either honoured, known not to change the computation (token ids,
// architectures, torch_dtype, ...), or refused by name: a config the family cannot reproduce
// (rope_scaling yarn, another activation, an unknown key) is an error, never silently ignored.
//
//   auto m = models::create_language_model("gpt2-tiny", {.vocab_size = 4096, .seed = 1});
//   auto v = models::create_model("/data/vit-base-patch16-224");  // loads model.safetensors
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/json.h"
#include "models/config.h"
#include "models/model.h"

namespace mammoth::models {

// Changes applied on top of the named or loaded config.
struct ModelOptions {
  std::optional<int64_t> vocab_size;  // e.g. the trainer's tokenizer size
  std::optional<int64_t> max_seq;
  std::optional<double> dropout;      // sets dropout and attn_dropout
  std::optional<int64_t> num_labels;  // BERT / ViT classification head
  std::optional<DType> dtype;         // parameter storage dtype
  uint64_t seed = 0;                  // init(seed) when no weights are loaded
  // false: create_model loads nothing and says nothing; the caller loads weights itself.
  bool load_weights = true;
  // Initialise from `seed` even for a directory (whose weights, if any, are not read). Without
  // it a directory with neither model.safetensors nor model.safetensors.index.json is an error.
  bool fresh_init = false;
  // Load this file (.safetensors) or sharded index (.json) instead of the directory's weights;
  // also for a registered name.
  std::string weights;
  bool announce = true;  // print "[model] NAME: weights: ..." on stderr
  // Replaces the config's special tokens (e.g. a vocabulary extended by [MASK]).
  std::optional<SpecialTokenIds> special_tokens;
  // Mixture of experts: tokens per expert capped at this factor (0: dropless; models/mixtral).
  std::optional<double> moe_capacity_factor;
  // Mixture of experts: the load-balancing loss's coefficient (HF router_aux_loss_coef); a value
  // turns the loss on (HF output_router_logits), 0 turns it off.
  std::optional<double> moe_aux_loss_coef;
};

// Where a directory's weights are: DIR/model.safetensors, else DIR/model.safetensors.index.json.
// Throws naming both (and any other weight files the directory holds) when it has neither.
std::string find_weights(const std::string& dir);

// Registered config names, in registration order.
std::vector<std::string> registered_names();
// True when `name` is a registered config.
bool is_registered(const std::string& name);

// The config for a registered name or a model directory (throws listing the known names).
ModelConfig resolve_config(const std::string& name_or_dir);
// Applies options' overrides and validates.
ModelConfig apply_options(ModelConfig config, const ModelOptions& options);

// Hugging Face config.json <-> ModelConfig. `what` names the source in errors.
ModelConfig config_from_hf_json(const json::Value& hf, const std::string& what);
json::Value config_to_hf_json(const ModelConfig& config);

// A freshly initialised (init(seed)) model of `config`'s family.
std::shared_ptr<Model> build_model(const ModelConfig& config, uint64_t seed = 0);

// The model for a name or directory. Weights: options.weights when set; else a registered name
// or options.fresh_init initialises from options.seed; else the directory's weights
// (find_weights), which must exist. Prints the source on stderr (options.announce).
std::shared_ptr<Model> create_model(const std::string& name_or_dir,
                                    const ModelOptions& options = {});
// As create_model, for causal/masked LMs (GPT-2, LLaMA, BERT); throws for ViT.
std::shared_ptr<LanguageModel> create_language_model(const std::string& name_or_dir,
                                                     const ModelOptions& options = {});

struct SavePretrainedOptions {
  // > 0: above this many weight bytes, transformers' sharded form instead of one file:
  // model-0000k-of-0000n.safetensors of at most this much each (a larger tensor alone) and
  // model.safetensors.index.json. Either form removes the other's files.
  int64_t max_shard_bytes = 0;
  // The weights' dtype in the files (and config.json's torch_dtype); unset: the parameters'.
  std::optional<DType> dtype;
  // A sequence or image classifier's class names, id order (BERT, ViT): config.json names them
  // (id2label / label2id) and BERT is written as BertForSequenceClassification, without its
  // masked-LM head (cls.*), which classification neither trains nor saves in checkpoints.
  std::vector<std::string> labels;
};
// Writes DIR/config.json and DIR/model.safetensors (HF names and layouts), creating DIR.
void save_pretrained(const Model& model, const std::string& dir,
                     const SavePretrainedOptions& options = {});

}  // namespace mammoth::models
