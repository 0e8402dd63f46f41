// Labelled image shards for ViT: a simple array format, memory-mapped, plus a synthetic
// generator (no downloads: a test or a first run needs images it can learn from).
//
// Layout (little-endian): a header of 256 int32 — magic 20241130, version 1, count N,
// channels C, height H, width W, num_classes K — then N int32 labels in [0, K), then N*C*H*W
// uint8 pixels (image-major, CHW). Pixels map to model inputs as (p / 255 - 0.5) / 0.5, the
// normalisation of Hugging Face's ViT image processor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/mapped_file.h"

namespace mammoth::data {

inline constexpr int32_t kImageShardMagic = 20241130;
inline constexpr int32_t kImageShardVersion = 1;

struct ImageShardInfo {
  int64_t count = 0, channels = 0, height = 0, width = 0, num_classes = 0;
  int64_t pixels_per_image() const { return channels * height * width; }
};

class ImageShard {
 public:
  // Maps and validates the file; errors name the file and the field.
  static ImageShard open(const std::string& path);
  const ImageShardInfo& info() const { return info_; }
  int32_t label(int64_t i) const;
  const uint8_t* pixels(int64_t i) const;  // C*H*W bytes
  // Images [first, first + n) as normalised f32 [n, C, H, W] values and i64 labels.
  void read(int64_t first, int64_t n, std::vector<float>* pixels,
            std::vector<int64_t>* labels) const;

 private:
  MappedFile file_;
  ImageShardInfo info_;
  const int32_t* labels_ = nullptr;
  const uint8_t* pixels_ = nullptr;
};

// Writes a shard atomically. labels.size() == info.count, pixels.size() == count * C*H*W.
void write_image_shard(const std::string& path, const ImageShardInfo& info,
                       const std::vector<int32_t>& labels, const std::vector<uint8_t>& pixels);

// `count` images of `num_classes` classes: class k is a grating whose orientation and
// frequency depend on k, with seeded random phase, contrast and noise, so a small ViT can tell
// them apart. Deterministic in `seed`.
void write_synthetic_image_shard(const std::string& path, int64_t count, int64_t num_classes,
                                 int64_t channels, int64_t size, uint64_t seed);

}  // namespace mammoth::data
