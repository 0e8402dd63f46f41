// Training checkpoints: one directory per step, written so that a crash never loses the last
// good checkpoint.
//
//   SAVE_DIR/step_00000100/model.safetensors      parameters under their (HF-style) names
//                          optimizer.safetensors  optimizer state tensors
//                          state.json             step, data position, RNG, loss scale, config
//                          manifest.json          size and CRC-32C of every file above
//   SAVE_DIR/latest                               "step_00000100\n", replaced atomically
//
// A checkpoint is written into a temporary directory, every file and the directory fsynced,
// then renamed into place; only then is `latest` replaced (write + fsync + rename) and the
// oldest checkpoints beyond keep_last removed. Loading verifies the manifest first, so a
// flipped byte or truncated file is reported by name instead of being trained on.
//
// Distributed runs write the sharded form instead: no rank ever holds the whole model or
// optimizer state, each writes what it holds.
//
//   SAVE_DIR/step_00000100/shard_00003.safetensors  rank 3's pieces, one 1-D tensor each,
//                                                    named "<tensor>@<flat offset>"
//                          index.json               every single-process tensor's dtype and
//                                                    shape, the shard files, the run's layout
//                          state.json, manifest.json as above (the manifest lists every file)
//
// A piece is a flat range of a single-process tensor ("h.0.attn.c_attn.weight" or
// "h.0.attn.c_attn.weight.exp_avg", row-major), so ZeRO shards that cut through a parameter,
// a pipeline stage's whole parameters and replicated copies written once all fit, and a
// checkpoint loads into any other layout (another dp size or ZeRO stage, other pipeline
// stages, one process): each rank asks for the ranges it holds and they are cut out of
// whichever pieces cover them. load_checkpoint_pieces reads both forms.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/json.h"
#include "engine/io/safetensors.h"
#include "engine/nn/module.h"
#include "engine/train/distributed.h"

namespace mammoth::engine::train {

struct CheckpointContents {
  const nn::NamedTensors* model = nullptr;
  const nn::NamedTensors* optimizer = nullptr;
  json::Value state;  // an object
};

// Writes checkpoint `step` under save_dir and returns its directory.
std::string save_checkpoint(const std::string& save_dir, int64_t step,
                            const CheckpointContents& contents, int keep_last);

// The directory `latest` points to, or nullopt when save_dir has no checkpoint yet.
std::optional<std::string> latest_checkpoint(const std::string& save_dir);

// Checks every file of the manifest (sizes and CRC-32C); throws naming the first bad file.
void verify_checkpoint(const std::string& dir);

// ---- sharded checkpoints ----

// Writing is three steps around two barriers of all ranks:
//   lead:  tmp = begin_sharded_checkpoint(save_dir, step)            -- barrier --
//   all:   write_checkpoint_shard(sharded_checkpoint_tmp(save_dir, step), rank, pieces)
//                                                                     -- barrier --
//   lead:  commit_sharded_checkpoint(...)
// The lead creates the temporary directory and records its name for the others.
std::string begin_sharded_checkpoint(const std::string& save_dir, int64_t step);
std::string sharded_checkpoint_tmp(const std::string& save_dir, int64_t step);
// Writes shard_<rank>.safetensors (fsynced) and its size and CRC-32C for the manifest.
void write_checkpoint_shard(const std::string& tmp_dir, int rank,
                            const std::vector<CheckpointPiece>& pieces);
struct ShardedLayout {
  int world = 1;             // shard files 0..world-1
  nn::NamedTensors tensors;  // every single-process tensor (dtype, shape; values unused)
  json::Value layout;        // the run's parallel layout, for people reading the index
};
// Checks that the shards cover every tensor of `layout` exactly once, writes index.json,
// state.json and the manifest, moves the checkpoint into place and updates `latest`.
std::string commit_sharded_checkpoint(const std::string& save_dir, int64_t step,
                                      const std::string& tmp_dir, const ShardedLayout& layout,
                                      const json::Value& state, int keep_last);

// Verifies the checkpoint, then fills every piece of `into` (its name, offset and size say
// which range) from the checkpoint, whichever form and layout wrote it, and returns
// state.json. Throws naming the tensor when a range is not covered or shapes/dtypes differ.
// `whole`: `into` is the whole model and optimizer (one process), so a tensor of the
// checkpoint that nothing asks for (another model's) is an error too.
json::Value load_checkpoint_pieces(const std::string& dir, const std::vector<CheckpointPiece>& into,
                                   bool whole = false);

// ---- a checkpoint as a whole (`mammoth ckpt`) ----

// Every check verify_checkpoint makes (manifest, sizes, CRC-32C of every file), collecting all
// failures instead of stopping at the first. A corrupt safetensors file is narrowed to the
// tensors whose per-tensor CRC-32C (recorded in the manifest) no longer matches.
std::vector<std::string> checkpoint_problems(const std::string& dir);

struct CheckpointTensorInfo {
  std::string name;  // the single-process tensor
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  int64_t bytes = 0;
  int pieces = 0;                  // 1 in the single form
  std::vector<std::string> files;  // the files holding its pieces
};
struct CheckpointInfo {
  std::string dir;
  bool sharded = false;
  std::string format;
  int64_t step = 0;
  json::Value layout;  // index.json's "layout" (the writing run's), {} for the single form
  json::Value state;   // state.json
  json::Value files;   // manifest.json's "files": bytes, crc32c, tensor_crc32c per file
  std::vector<CheckpointTensorInfo> tensors;  // sorted by name
};
// Reads the manifest, index, state and the shards' headers; checks that the pieces cover
// every tensor once, but not the CRCs (checkpoint_problems does).
CheckpointInfo inspect_checkpoint(const std::string& dir);

// Every tensor of the checkpoint whole, in its single-process shape, whichever form and
// layout wrote it (verified first); `state` receives state.json.
nn::NamedTensors load_whole_checkpoint(const std::string& dir, json::Value* state);

// Whether tensor `name` of a checkpoint holding `names` is optimizer state ("<param>.<suffix>")
// rather than a parameter: what goes into optimizer.safetensors of the single form.
bool is_optimizer_state(const std::string& name, const std::set<std::string>& names);

// An exclusive claim on a --save-dir for the life of a job: a second job that would write
// checkpoints into the same directory is refused instead of interleaving its steps with ours.
// It is an flock(2) on SAVE_DIR/.lock, which the kernel drops when the holder exits or dies,
// so a crashed job never leaves it stuck; the file names the holder (pid, host, start time)
// for the refusal's message. Throws naming the directory and the holder when it is taken.
class SaveDirLock {
 public:
  explicit SaveDirLock(const std::string& save_dir);
  ~SaveDirLock();
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace mammoth::engine::train
