// libFuzzer target: ViT image shards (256-int32 header, int32 labels, uint8 CHW pixels). The
// input is the whole file; a shard that opens must read every label and image in bounds.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/data/image_shard.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mammoth::fuzz::write_scratch("images.bin", data, size);
  try {
    auto s = mammoth::data::ImageShard::open(path);
    const auto& in = s.info();
    const int64_t P = in.pixels_per_image();
    if (static_cast<size_t>(1024 + in.count * 4 + in.count * P) != size) {
      mammoth::fuzz::invariant_failed("image_shard: header disagrees with the file size");
    }
    for (int64_t i = 0; i < in.count; ++i) {
      const int32_t label = s.label(i);
      if (label < 0 || label >= in.num_classes) {
        mammoth::fuzz::invariant_failed("image_shard: label out of range");
      }
      mammoth::fuzz::touch(s.pixels(i), static_cast<size_t>(P));
    }
    std::vector<float> pixels;
    std::vector<int64_t> labels;
    s.read(0, in.count, &pixels, &labels);
    for (float p : pixels) {
      if (!(p >= -1.0f && p <= 1.0f)) mammoth::fuzz::invariant_failed("image_shard: pixel range");
    }
  } catch (const mammoth::Error&) {
  }
  return 0;
}
