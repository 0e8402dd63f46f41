// Model weights <-> safetensors files, with Hugging Face names and layouts.
//
// Loading maps every parameter to its name in the file through the model's HfLayout (accepting
// the family's alternative prefixes, e.g. GPT-2's bare "h.0..." and "transformer.h.0..."),
// checks every name, shape and dtype, and reports ALL problems in one error before changing
// anything: missing tensors, wrong shapes, wrong dtypes, and tensors that belong to nothing.
//
// A checkpoint is one safetensors file or a sharded set: an index JSON (Hugging Face's
// model.safetensors.index.json) whose "weight_map" names the shard file of every tensor. Both
// load through the same checks; a problem names the file that holds (or should hold) the tensor.
//
//   models::load_weights(*model, "gpt2/model.safetensors");
//   models::load_weights(*model, "llama/model.safetensors.index.json");   // every shard
//   models::save_weights(*model, "out.safetensors");   // opens in transformers / safetensors
#pragma once

#include <map>
#include <memory>
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

// The tensors of one safetensors file or of a sharded checkpoint, as one set of names. Shards are
// mapped read-only and stay mapped while the object lives.
class WeightFiles {
 public:
  // `path`: a .safetensors file, or an index (a .json file with "weight_map") whose shard names
  // are relative to its directory. A shard that does not exist, or a tensor found in two shards,
  // is recorded in problems() (reported with the load's other problems); a malformed index or
  // shard file throws. A tensor the index lists but no shard holds is missing only if the model
  // needs it (the message then names the shard the index gave); one a shard holds without the
  // index listing it loads like any other.
  static WeightFiles open(const std::string& path);
  // Borrows `file`, which must outlive the result.
  static WeightFiles borrow(const io::SafetensorsFile& file);

  const std::string& path() const { return path_; }
  bool sharded() const { return sharded_; }
  // Shard files named by the index (1 for a single file).
  size_t num_files() const { return sharded_ ? shard_names_.size() : 1; }
  size_t num_tensors() const { return by_name_.size(); }
  // nullptr when no opened file holds `name`.
  const io::TensorView* find(const std::string& name) const;
  // The file that holds `name`, or that the index says should hold it: a shard's name as the
  // index spells it, or path() for a single file; "" when neither.
  std::string file_of(const std::string& name) const;
  // Every tensor of every opened file, with its file (as file_of names it).
  std::vector<std::pair<const io::TensorView*, std::string>> tensors() const;
  // The index's own problems: missing shard files, tensors in two shards.
  const std::vector<std::string>& problems() const { return problems_; }
  // For logs: "DIR/model.safetensors (148 tensors)" or
  // "DIR/model.safetensors.index.json (2 shards, 148 tensors)".
  std::string describe() const;

 private:
  std::string path_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<io::SafetensorsFile>> owned_;
  std::vector<const io::SafetensorsFile*> files_;
  std::vector<std::string> file_names_;          // per entry of files_
  std::vector<std::string> shard_names_;         // every shard the index names, in order
  std::map<std::string, size_t> by_name_;        // tensor -> index into files_
  std::map<std::string, std::string> expected_;  // index: tensor -> shard name
  std::vector<std::string> problems_;
};

// Whether `path` is a sharded checkpoint's index (ends in ".json").
bool is_weight_index(const std::string& path);

// Loads `params` (our names) laid out by `layout` from `files` (one or every shard). Throws one
// Error listing every mismatch, with the index's own problems; on error no parameter has changed.
LoadReport load_named(const engine::nn::NamedTensors& params, const HfLayout& layout,
                      const WeightFiles& files, const LoadOptions& options = {});
// Loads `params` (our names) laid out by `layout` from `file`. Throws one Error listing every
// mismatch; on error no parameter has changed.
LoadReport load_named(const engine::nn::NamedTensors& params, const HfLayout& layout,
                      const io::SafetensorsFile& file, const LoadOptions& options = {});
LoadReport load_weights(const Model& model, const io::SafetensorsFile& file,
                        const LoadOptions& options = {});
// `path`: a .safetensors file or a sharded checkpoint's index (see WeightFiles::open).
LoadReport load_weights(const Model& model, const std::string& path,
                        const LoadOptions& options = {});
LoadReport load_weights(const Model& model, const WeightFiles& files,
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
