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
#pragma once

#include <optional>
#include <string>

#include "base/json.h"
#include "engine/io/safetensors.h"
#include "engine/nn/module.h"

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

// Verifies the manifest, then restores the tensors in place and returns state.json.
// Throws mammoth::Error naming the file and the problem.
json::Value load_checkpoint(const std::string& dir, const nn::NamedTensors& model,
                            const nn::NamedTensors& optimizer);

// Checks every file of the manifest (sizes and CRC-32C); throws naming the first bad file.
void verify_checkpoint(const std::string& dir);

}  // namespace mammoth::engine::train
