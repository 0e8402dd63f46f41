#include "engine/data/image_shard.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "base/error.h"
#include "base/philox.h"

namespace mammoth::data {

namespace {
constexpr int64_t kHeaderInts = 256;
}

ImageShard ImageShard::open(const std::string& path) {
  ImageShard s;
  s.file_ = MappedFile::open(path, "image_shard");
  const size_t header_bytes = kHeaderInts * sizeof(int32_t);
  MAMMOTH_CHECK(s.file_.size() >= header_bytes)
      << "[image_shard] " << path << " is " << s.file_.size()
      << " bytes, shorter than the 1024-byte header";
  int32_t h[kHeaderInts];
  std::memcpy(h, s.file_.data(), header_bytes);
  MAMMOTH_CHECK(h[0] == kImageShardMagic) << "[image_shard] " << path << ": bad magic " << h[0]
                                          << " (expected " << kImageShardMagic << ")";
  MAMMOTH_CHECK(h[1] == kImageShardVersion)
      << "[image_shard] " << path << ": unsupported version " << h[1];
  ImageShardInfo& in = s.info_;
  in = {h[2], h[3], h[4], h[5], h[6]};
  MAMMOTH_CHECK(in.count >= 0 && in.channels > 0 && in.height > 0 && in.width > 0 &&
                in.num_classes > 0)
      << "[image_shard] " << path << ": invalid header (count " << in.count << ", channels "
      << in.channels << ", " << in.height << "x" << in.width << ", classes " << in.num_classes
      << ")";
  // Four int32 fields multiply past 2^64: compute the size with overflow checks, so a corrupt
  // header cannot wrap around to the file's size and pass.
  uint64_t pixel_bytes = 0, expected = 0;
  const bool fits =
      !__builtin_mul_overflow(static_cast<uint64_t>(in.channels), static_cast<uint64_t>(in.height),
                              &pixel_bytes) &&
      !__builtin_mul_overflow(pixel_bytes, static_cast<uint64_t>(in.width), &pixel_bytes) &&
      // One image's C*H*W must fit pixels_per_image()'s int64 even when count is 0.
      pixel_bytes <= static_cast<uint64_t>(INT64_MAX) &&
      !__builtin_mul_overflow(pixel_bytes, static_cast<uint64_t>(in.count), &pixel_bytes) &&
      !__builtin_add_overflow(header_bytes + static_cast<uint64_t>(in.count) * sizeof(int32_t),
                              pixel_bytes, &expected);
  MAMMOTH_CHECK(fits && s.file_.size() == expected)
      << "[image_shard] " << path << " is " << s.file_.size() << " bytes but its header describes "
      << (fits ? std::to_string(expected)
               : std::string("an impossible size (over 2^63 bytes an image or 2^64 in all)"))
      << " (truncated or not an image shard)";
  s.labels_ = reinterpret_cast<const int32_t*>(s.file_.data() + header_bytes);
  s.pixels_ = s.file_.data() + header_bytes + in.count * sizeof(int32_t);
  for (int64_t i = 0; i < in.count; ++i) {
    MAMMOTH_CHECK(s.labels_[i] >= 0 && s.labels_[i] < in.num_classes)
        << "[image_shard] " << path << ": label " << s.labels_[i] << " of image " << i
        << " is outside [0, " << in.num_classes << ")";
  }
  return s;
}

int32_t ImageShard::label(int64_t i) const {
  MAMMOTH_CHECK(i >= 0 && i < info_.count) << "[image_shard] image " << i << " out of range";
  return labels_[i];
}

const uint8_t* ImageShard::pixels(int64_t i) const {
  MAMMOTH_CHECK(i >= 0 && i < info_.count) << "[image_shard] image " << i << " out of range";
  return pixels_ + i * info_.pixels_per_image();
}

void ImageShard::read(int64_t first, int64_t n, std::vector<float>* pixels,
                      std::vector<int64_t>* labels) const {
  MAMMOTH_CHECK(first >= 0 && n >= 0 && first + n <= info_.count)
      << "[image_shard] images [" << first << ", " << first + n << ") outside the " << info_.count
      << " in " << file_.path();
  const int64_t P = info_.pixels_per_image();
  pixels->resize(static_cast<size_t>(n * P));
  labels->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    (*labels)[i] = labels_[first + i];
    const uint8_t* src = pixels_ + (first + i) * P;
    for (int64_t k = 0; k < P; ++k) (*pixels)[i * P + k] = (src[k] / 255.0f - 0.5f) / 0.5f;
  }
}

void write_image_shard(const std::string& path, const ImageShardInfo& info,
                       const std::vector<int32_t>& labels, const std::vector<uint8_t>& pixels) {
  MAMMOTH_CHECK(static_cast<int64_t>(labels.size()) == info.count &&
                static_cast<int64_t>(pixels.size()) == info.count * info.pixels_per_image())
      << "[image_shard] " << labels.size() << " labels and " << pixels.size()
      << " pixels do not match " << info.count << " images of " << info.pixels_per_image();
  int32_t h[kHeaderInts] = {};
  h[0] = kImageShardMagic;
  h[1] = kImageShardVersion;
  h[2] = static_cast<int32_t>(info.count);
  h[3] = static_cast<int32_t>(info.channels);
  h[4] = static_cast<int32_t>(info.height);
  h[5] = static_cast<int32_t>(info.width);
  h[6] = static_cast<int32_t>(info.num_classes);
  AtomicFileWriter w(path, "image_shard");
  w.write(h, sizeof(h));
  w.write(labels.data(), labels.size() * sizeof(int32_t));
  w.write(pixels.data(), pixels.size());
  w.commit();
}

void write_synthetic_image_shard(const std::string& path, int64_t count, int64_t num_classes,
                                 int64_t channels, int64_t size, uint64_t seed) {
  MAMMOTH_CHECK(count > 0 && num_classes > 0 && channels > 0 && size > 0)
      << "[image_shard] synthetic images need positive count, classes, channels and size";
  const ImageShardInfo info{count, channels, size, size, num_classes};
  std::vector<int32_t> labels(static_cast<size_t>(count));
  std::vector<uint8_t> pixels(static_cast<size_t>(count * info.pixels_per_image()));
  auto uniform = [&](uint64_t counter, int lane) {
    return philox_uniform(philox4x32(counter, 0, seed).v[lane]);
  };
  for (int64_t i = 0; i < count; ++i) {
    const int32_t k =
        static_cast<int32_t>(uniform(static_cast<uint64_t>(i) << 20, 0) * num_classes) %
        static_cast<int32_t>(num_classes);
    labels[i] = k;
    const double angle = M_PI * k / num_classes;
    const double freq = 2.0 * M_PI * (1.0 + k % 3) / size;
    const double phase = 2.0 * M_PI * uniform(static_cast<uint64_t>(i) << 20, 1);
    const double contrast = 0.3 + 0.2 * uniform(static_cast<uint64_t>(i) << 20, 2);
    for (int64_t c = 0; c < channels; ++c) {
      for (int64_t y = 0; y < size; ++y) {
        for (int64_t x = 0; x < size; ++x) {
          const uint64_t at = (static_cast<uint64_t>(i) << 20) + 1 +
                              static_cast<uint64_t>((c * size + y) * size + x);
          const double noise = 0.1 * (uniform(at, 3) - 0.5);
          const double v =
              0.5 +
              contrast * std::sin(freq * (x * std::cos(angle) + y * std::sin(angle)) + phase + c) +
              noise;
          pixels[static_cast<size_t>(((i * channels + c) * size + y) * size + x)] =
              static_cast<uint8_t>(std::lround(255.0 * std::clamp(v, 0.0, 1.0)));
        }
      }
    }
  }
  write_image_shard(path, info, labels, pixels);
}

}  // namespace mammoth::data
