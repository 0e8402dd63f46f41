// Model weights <-> safetensors files, with Hugging Face names and layouts.
//
// Loading maps every parameter to its name in the file through the model's HfLayout (accepting
// the family's alternative prefixes, e.g. GPT-2's bare "h.0..." and "transformer.h.0..."),
// checks every name, shape and dtype, and reports ALL problems in one error before changing
// anything: missing tensors, wrong shapes, wrong dtypes, and tensors that belong to nothing.
//
//   models::load_weights(*model, "gpt2/model.safetensors");
//   models::save_weights(*model, "out.safetensors");   // opens in transformers / safetensors
#pragma once

#include <map>
#include <string>
#include <vector>

#include "engine/io/safetensors.h"
#include "engine/nn/module.h"
#include "models/model.h"

namespace mammoth::models {

struct LoadOptions {
  // Converts floating file dtypes to the parameter dtype (a bf16 checkpoint into an f32 model).
  // When false a dtype difference is a mismatch.
  bool allow_cast = true;
  // Accept tensors that map to no parameter and are not in the layout's ignored list.
  bool allow_unexpected = false;
};

struct LoadReport {
  std::vector<std::string> loaded;            // our parameter names
  std::vector<std::string> missing_optional;  // optional parameters kept as initialised
  std::vector<std::string> ignored;           // file names skipped by the layout (buffers, ties)
  std::vector<std::string> unexpected;        // only with allow_unexpected
};

// Loads `params` (our names) laid out by `layout` from `file`. Throws one Error listing every
// mismatch; on error no parameter has changed.
LoadReport load_named(const engine::nn::NamedTensors& params, const HfLayout& layout,
                      const io::SafetensorsFile& file, const LoadOptions& options = {});
LoadReport load_weights(const Model& model, const io::SafetensorsFile& file,
                        const LoadOptions& options = {});
LoadReport load_weights(const Model& model, const std::string& path,
                        const LoadOptions& options = {});

// Writes the parameters under their HF names and layouts (Conv1D weights transposed back),
// with metadata {"format": "pt"} as transformers expects, plus `metadata`.
void save_named(const engine::nn::NamedTensors& params, const HfLayout& layout,
                const std::string& path, std::map<std::string, std::string> metadata = {});
void save_weights(const Model& model, const std::string& path,
                  std::map<std::string, std::string> metadata = {});

// The candidate file names of a HF name under the layout's prefix aliases (canonical first).
std::vector<std::string> hf_name_candidates(const HfLayout& layout, const std::string& hf_name);
// Whether `file_name` is matched by the layout's ignored patterns.
bool hf_is_ignored(const HfLayout& layout, const std::string& file_name);

}  // namespace mammoth::models
