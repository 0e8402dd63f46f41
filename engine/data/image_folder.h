// Labelled images for ViT classification: a folder of PNG / JPEG files per class, or an image
// shard (image_shard.h), both as LabelledExamples (examples.h) for the training loop.
//
// A folder DIR holds one subdirectory per class, DIR/<class>/*.png|*.jpg|*.jpeg; classes are
// the subdirectory names sorted bytewise (label k = the k-th), files within a class sorted by
// name. Files are decoded once at open with Debian's libpng and libjpeg-turbo into 8-bit RGB
// (channels 3) or grayscale (channels 1), whatever their own colour type (palette, gray,
// alpha and 16-bit PNGs are converted; alpha is dropped). An image whose size is not the
// model's image_size x image_size is resized to it as transformers' ViTImageProcessor does
// (Pillow's bilinear resample, aspect ratio not kept), to the same 8-bit pixels; describe()
// counts them. Refused, naming the file: another extension, a file the decoder rejects
// (corrupt, truncated, not an image), a class directory with no images, and a plain file at the
// top level.
//
// Pixels map to model inputs as image shards do: (p / 255 - 0.5) / 0.5, channel-major [C, H, W].
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/data/examples.h"
#include "engine/data/image_shard.h"

namespace mammoth::data {

class ImageExamples final : public LabelledExamples {
 public:
  // DIR/<class>/*.png|jpg|jpeg, decoded to `channels` (1 or 3), resized to `size` x `size`
  // (without `resize`, another size is refused naming the file).
  static ImageExamples open_folder(const std::string& dir, int64_t channels, int64_t size,
                                   bool resize = true);
  // An image shard whose images must be `channels` x `size` x `size` (checked, named).
  static ImageExamples open_shard(const std::string& path, int64_t channels, int64_t size);

  int64_t size() const override { return count_; }
  int64_t num_classes() const override { return static_cast<int64_t>(classes_.size()); }
  ExampleBatch read(const std::vector<int64_t>& which) const override;
  std::string describe() const override;
  // Class names in label order ("0", "1", ... for a shard).
  const std::vector<std::string>& classes() const { return classes_; }

 private:
  const uint8_t* pixels(int64_t i) const;
  int32_t label(int64_t i) const;

  std::string source_;
  int64_t channels_ = 0, image_size_ = 0, count_ = 0;
  std::vector<std::string> classes_;
  std::optional<ImageShard> shard_;  // open_shard: read in place
  std::vector<uint8_t> pixels_;      // open_folder: count * C * H * W, CHW per image
  std::vector<int32_t> labels_;
  int64_t resized_ = 0;
};

// One PNG or JPEG file (by its extension) as 8-bit pixels, channel-major [channels, h, w].
// Throws naming the file when it cannot be decoded.
std::vector<uint8_t> decode_image(const std::string& path, int64_t channels, int64_t* height,
                                  int64_t* width);

// A model directory's preprocessor_config.json (none: true). What it asks ViTImageProcessor to
// do must be what open_folder does: resize to the model's image_size with bilinear resampling
// (or no resize), rescale by 1/255, normalise with mean and std 0.5. Returns its do_resize;
// anything else (another processor type, size, resample filter, factor, mean or std, or an
// unknown key) is refused naming the key and the value.
bool image_processor_resizes(const std::string& model_dir, int64_t channels, int64_t image_size);

// Pillow's bilinear resize (Image.resize(..., BILINEAR)) of 8-bit channel-major pixels: the
// same bytes, antialiased when shrinking.
std::vector<uint8_t> resize_bilinear(const std::vector<uint8_t>& chw, int64_t channels,
                                     int64_t height, int64_t width, int64_t out_height,
                                     int64_t out_width);

// Writes pixels interleaved [h, w, channels] (channels 1 or 3) as PNG / as JPEG of `quality`.
void write_png(const std::string& path, const uint8_t* hwc, int64_t height, int64_t width,
               int64_t channels);
void write_jpeg(const std::string& path, const uint8_t* hwc, int64_t height, int64_t width,
                int64_t channels, int quality = 95);

}  // namespace mammoth::data
