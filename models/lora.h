// LoRA (Hu et al. 2021) for every model family, with Hugging Face PEFT's names and files.
//
// apply_lora() wraps the Linear layers whose Hugging Face module path matches a target pattern
// (PEFT's rule: a list entry matches a path equal to it or ending in "." + it; a single string
// is a regular expression the whole path must match; "all-linear" is every Linear layer but the
// output head), so that
//
//   y = W x + b + (alpha / r) * B (A (dropout(x)))      A [r, in], B [out, r]
//
// with A drawn as PEFT draws it (kaiming_uniform_(a = sqrt(5)): U(-1/sqrt(in), 1/sqrt(in))) and
// B zero, so training starts from the base model's function. The adapters hang on the layers
// as engine::nn::LinearDelta, outside the model's parameter tree: the model's names, HF layout,
// weight files and export are unchanged, and every base parameter is frozen (requires_grad
// off: no gradient buffers, no optimizer states). What trains is LoraAdapters'
// named_parameters() ("h.0.attn.c_attn.lora_A.weight", our module path + PEFT's suffix).
//
// Module paths come from the model's HfLayout (models/weights.cc's map): a parameter's HF name
// as the causal-LM class spells it (the longest of its aliases: GPT2LMHeadModel wraps GPT2Model
// as "transformer."), minus ".weight". GPT-2's Conv1D layers store W as [in, out]; PEFT's
// lora_A / lora_B shapes are the same as for nn.Linear, and fan_in_fan_out records the
// layout for merging.
//
// Adapter directories are PEFT's: adapter_config.json + adapter_model.safetensors with keys
// "base_model.model.<module path>.lora_A.weight" / ".lora_B.weight".
//
//   auto lora = models::apply_lora(*model, {.rank = 8, .alpha = 16, .targets = {"c_attn"}});
//   ... train lora->named_parameters() ...
//   models::save_adapter(*lora, *model, "out/adapter", "path/to/base");
//   auto back = models::load_adapter(*other, "out/adapter");   // eval / generate / resume
//   models::merge_lora(*other, *back);                          // W += (alpha / r) B A
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/json.h"
#include "engine/nn/module.h"
#include "models/model.h"

namespace mammoth::models {

struct LoraOptions {
  int64_t rank = 0;  // r (> 0)
  double alpha = 0;  // lora_alpha; the update is scaled by alpha / r
  double dropout = 0;
  // PEFT target_modules: module-name suffixes, or with `regex` one pattern matched in full.
  std::vector<std::string> targets;
  bool regex = false;
  uint64_t seed = 0;  // A's draws (Philox, keyed by each adapter's name)
};

// One wrapped layer's A and B.
class LoraLinear : public engine::nn::Module, public engine::nn::LinearDelta {
 public:
  LoraLinear(int64_t in, int64_t out, const LoraOptions& options, DType dtype);
  engine::Tensor forward(const engine::Tensor& x, bool training) const override;
  // (alpha / r) B A [out, in], the merged update of the base weight.
  engine::Tensor delta_weight() const;
  engine::Tensor lora_a() const;  // [r, in]
  engine::Tensor lora_b() const;  // [out, r]
  double scale() const { return scale_; }

 private:
  std::shared_ptr<engine::nn::Module> a_, b_;
  double scale_, dropout_;
};

class LoraAdapters : public engine::nn::Module {
 public:
  struct Target {
    std::string param;  // our base weight's name ("h.0.attn.c_attn.weight")
    std::string path;   // its HF module path ("transformer.h.0.attn.c_attn")
    bool conv1d;        // HF stores the weight [in, out]
    std::shared_ptr<engine::nn::Linear> layer;
    std::shared_ptr<LoraLinear> lora;
  };
  explicit LoraAdapters(LoraOptions options) : options_(std::move(options)) {}
  const LoraOptions& options() const { return options_; }
  const std::vector<Target>& targets() const { return targets_; }
  void add(Target t);
  // How PEFT names the adapter tensors (base_model.model.<path>.lora_A.weight), as an HfLayout
  // over named_parameters(); aliases accept the base layout's other spellings.
  HfLayout peft_layout(const HfLayout& base) const;
  // adapter_config.json's content; `base_model` is base_model_name_or_path.
  json::Value peft_config(const std::string& base_model) const;

 private:
  LoraOptions options_;
  std::vector<Target> targets_;
};

// Parses --lora-targets ("q_proj,v_proj"); an empty entry is an error.
std::vector<std::string> parse_lora_targets(const std::string& list);

// Wraps `model`'s matching Linear layers, freezes every model parameter and initialises the
// adapters from options.seed. Throws naming the pattern when one matches no Linear layer, and
// on bad options (rank <= 0, alpha <= 0, dropout outside [0, 1)).
std::shared_ptr<LoraAdapters> apply_lora(Model& model, const LoraOptions& options);

// Removes the adapters from `model`'s layers (the base stays frozen).
void detach_lora(const LoraAdapters& adapters);

// W += (alpha / r) B A for every wrapped layer, then detaches the adapters: `model` then
// computes what it computed with them.
void merge_lora(Model& model, const LoraAdapters& adapters);

// Writes DIR/adapter_config.json and DIR/adapter_model.safetensors (creating DIR). Tensors are
// read through host copies: the adapters' own, or `values` (by the adapters' parameter names;
// every one must be there, whole) when given — a checkpoint's, where no rank holds the
// adapters whole (ZeRO-3).
void save_adapter(const LoraAdapters& adapters, const Model& model, const std::string& dir,
                  const std::string& base_model, const engine::nn::NamedTensors* values = nullptr);

// Reads DIR/adapter_config.json (refusing, by name, what it cannot honour: another peft_type,
// use_dora, use_rslora, bias other than none, modules_to_save, rank or alpha patterns, layer
// selections), wraps `model` with it and loads DIR/adapter_model.safetensors.
std::shared_ptr<LoraAdapters> load_adapter(Model& model, const std::string& dir);
// adapter_config.json's options (as load_adapter reads them) and base_model_name_or_path.
LoraOptions read_adapter_config(const std::string& dir, std::string* base_model = nullptr);

}  // namespace mammoth::models
