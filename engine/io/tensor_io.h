// Named tensors -> safetensors, under our own parameter names (checkpoints; they are read back
// piecewise by engine/train/checkpoint.h). Model weights with Hugging Face layouts go through
// models/weights.h, which adds name mapping on top.
#pragma once

#include <string>
#include <vector>

#include "engine/io/safetensors.h"
#include "engine/nn/module.h"

namespace mammoth::io {

// Views of contiguous CPU tensors for write_safetensors (the tensors must outlive the views).
std::vector<TensorView> views_of(const engine::nn::NamedTensors& tensors);

// Writes `tensors` atomically (tmp + fsync + rename).
void save_tensors(const std::string& path, const engine::nn::NamedTensors& tensors,
                  const std::map<std::string, std::string>& metadata = {});

}  // namespace mammoth::io
