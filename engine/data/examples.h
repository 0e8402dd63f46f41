// Labelled examples for classification training: what the training loop's example batches
// (engine/train/trainer.h) read, whatever the examples are. Images (image_folder.h, image
// shards) give normalised f32 pixels [n, C, H, W]; texts (text_classification.h) give token ids
// [n, T]. Every example has one label in [0, num_classes()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mammoth::data {

struct ExampleBatch {
  std::vector<int64_t> shape;   // of the inputs: [n, ...]
  std::vector<float> pixels;    // f32 inputs (images), row-major in `shape`
  std::vector<int64_t> ids;     // integer inputs (token ids), row-major in `shape`
  std::vector<int64_t> labels;  // [n]
};

class LabelledExamples {
 public:
  virtual ~LabelledExamples() = default;
  virtual int64_t size() const = 0;
  virtual int64_t num_classes() const = 0;
  // The inputs and labels of examples `which` (each in [0, size())), in that order.
  virtual ExampleBatch read(const std::vector<int64_t>& which) const = 0;
  // What the examples are ("images 32x32x3 from DIR, 400 examples, 4 classes"): stored in
  // checkpoints, so a resumed run must read the same data.
  virtual std::string describe() const = 0;
};

}  // namespace mammoth::data
