// engine/data/image_folder.h: PNG / JPEG decoding with libpng and libjpeg-turbo, class folders,
// and the files and layouts that are refused by name.
#include "engine/data/image_folder.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "base/error.h"
#include "test/testing/test_dir.h"

namespace mammoth::data {
namespace {

// A smooth pattern (JPEG keeps it within a few levels), interleaved [h, w, c].
std::vector<uint8_t> pattern(int64_t h, int64_t w, int64_t c, int shift) {
  std::vector<uint8_t> p(static_cast<size_t>(h * w * c));
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int64_t k = 0; k < c; ++k)
        p[(y * w + x) * c + k] = static_cast<uint8_t>((x * 4 + y * 2 + k * 60 + shift) % 256);
  return p;
}

uint8_t at_hwc(const std::vector<uint8_t>& p, int64_t w, int64_t c, int64_t y, int64_t x,
               int64_t k) {
  return p[(y * w + x) * c + k];
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("PNG round-trips exactly and comes back channel-major") {
  testing::TestDir dir;
  const int64_t h = 5, w = 7;
  for (int64_t c : {1, 3}) {
    const std::vector<uint8_t> hwc = pattern(h, w, c, 3);
    const std::string path = dir.file("p" + std::to_string(c) + ".png");
    write_png(path, hwc.data(), h, w, c);
    int64_t gh = 0, gw = 0;
    const std::vector<uint8_t> chw = decode_image(path, c, &gh, &gw);
    REQUIRE(gh == h);
    REQUIRE(gw == w);
    for (int64_t k = 0; k < c; ++k)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t x = 0; x < w; ++x)
          REQUIRE(chw[(k * h + y) * w + x] == at_hwc(hwc, w, c, y, x, k));
  }
}

TEST_CASE("JPEG decodes close to what was encoded") {
  testing::TestDir dir;
  const int64_t h = 16, w = 16, c = 3;
  const std::vector<uint8_t> hwc = pattern(h, w, c, 0);
  const std::string path = dir.file("a.JPG");  // extensions are case-insensitive
  write_jpeg(path, hwc.data(), h, w, c, 100);
  int64_t gh = 0, gw = 0;
  const std::vector<uint8_t> chw = decode_image(path, c, &gh, &gw);
  REQUIRE((gh == h && gw == w));
  double err = 0;
  for (int64_t k = 0; k < c; ++k)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x)
        err += std::abs(chw[(k * h + y) * w + x] - at_hwc(hwc, w, c, y, x, k));
  CHECK(err / static_cast<double>(h * w * c) < 4.0);
  // An RGB file asked for as gray is converted, not refused.
  const std::vector<uint8_t> gray = decode_image(path, 1, &gh, &gw);
  CHECK(gray.size() == static_cast<size_t>(h * w));
}

TEST_CASE("a folder per class: sorted classes, labels, normalised pixels") {
  testing::TestDir dir;
  const int64_t s = 4;
  std::filesystem::create_directories(dir.file("zebra"));
  std::filesystem::create_directories(dir.file("apple"));
  std::vector<uint8_t> white(static_cast<size_t>(s * s * 3), 255), black(white.size(), 0);
  write_png(dir.file("zebra/1.png"), white.data(), s, s, 3);
  write_png(dir.file("apple/b.png"), black.data(), s, s, 3);
  write_jpeg(dir.file("apple/a.jpeg"), black.data(), s, s, 3);
  const ImageExamples e = ImageExamples::open_folder(dir.path(), 3, s);
  REQUIRE(e.size() == 3);
  REQUIRE(e.classes() == std::vector<std::string>{"apple", "zebra"});
  const ExampleBatch b = e.read({2, 0});
  REQUIRE(b.shape == std::vector<int64_t>{2, 3, s, s});
  REQUIRE(b.labels == std::vector<int64_t>{1, 0});
  CHECK(b.pixels.front() == 1.0f);  // white: (1 - 0.5) / 0.5
  CHECK(b.pixels.back() == -1.0f);  // black (a.jpeg, first of apple)
  CHECK(e.describe().find("3 images 3x4x4, 2 classes") != std::string::npos);
}

TEST_CASE("refused by name: corrupt, non-image, stray file, empty class; other sizes resized") {
  testing::TestDir dir;
  const int64_t s = 4;
  std::vector<uint8_t> px(static_cast<size_t>(s * s * 3), 9);
  auto fresh = [&] {
    std::filesystem::remove_all(dir.path());
    std::filesystem::create_directories(dir.file("a"));
    std::filesystem::create_directories(dir.file("b"));
    write_png(dir.file("a/ok.png"), px.data(), s, s, 3);
    write_png(dir.file("b/ok.png"), px.data(), s, s, 3);
  };
  auto open = [&] { ImageExamples::open_folder(dir.path(), 3, s); };
  fresh();
  REQUIRE_NOTHROW(open());

  dir.write("b/broken.png", "not a png at all");
  CHECK_THAT(error_of(open), Catch::Contains("b/broken.png") && Catch::Contains("PNG"));
  fresh();
  dir.write("a/broken.jpg", std::string("\xff\xd8\xff\xe0 truncated", 14));
  CHECK_THAT(error_of(open), Catch::Contains("a/broken.jpg") && Catch::Contains("JPEG"));
  fresh();
  dir.write("a/notes.txt", "hello");
  CHECK_THAT(error_of(open), Catch::Contains("a/notes.txt") && Catch::Contains("not an image"));
  fresh();
  // Another size is resized (pixels checked against Pillow in image_resize_interop_test): a
  // constant image stays constant.
  std::vector<uint8_t> big(static_cast<size_t>(8 * 8 * 3), 77);
  write_png(dir.file("a/big.png"), big.data(), 8, 8, 3);
  {
    const ImageExamples e = ImageExamples::open_folder(dir.path(), 3, s);
    CHECK_THAT(e.describe(), Catch::Contains("1 resized"));
    const std::vector<uint8_t> r = resize_bilinear(big, 3, 8, 8, 3, 5);
    CHECK(r == std::vector<uint8_t>(static_cast<size_t>(3 * 3 * 5), 77));
  }
  fresh();
  dir.write("README", "x");
  CHECK_THAT(error_of(open), Catch::Contains("README") && Catch::Contains("class directory"));
  fresh();
  std::filesystem::create_directories(dir.file("c"));
  CHECK_THAT(error_of(open), Catch::Contains("/c has no images"));
}

TEST_CASE("an image shard as examples, its size checked") {
  testing::TestDir dir;
  const std::string path = dir.file("s.shard");
  write_synthetic_image_shard(path, 6, 3, 3, 8, 1);
  const ImageExamples e = ImageExamples::open_shard(path, 3, 8);
  REQUIRE(e.size() == 6);
  REQUIRE(e.num_classes() == 3);
  const ImageShard shard = ImageShard::open(path);
  std::vector<float> px;
  std::vector<int64_t> labels;
  shard.read(4, 1, &px, &labels);
  const ExampleBatch b = e.read({4});
  CHECK(b.pixels == px);
  CHECK(b.labels == labels);
  CHECK_THAT(error_of([&] { ImageExamples::open_shard(path, 3, 16); }),
             Catch::Contains("s.shard") && Catch::Contains("3x8x8"));
}

TEST_CASE("preprocessor_config.json: ViTImageProcessor's steps honoured, others refused by name") {
  testing::TestDir dir;
  CHECK(image_processor_resizes(dir.path(), 3, 32));  // no file: transformers' defaults
  auto with = [&](const std::string& json) {
    dir.write("preprocessor_config.json", json);
    return image_processor_resizes(dir.path(), 3, 32);
  };
  // As google/vit-base-patch16-224 writes it (at its own size).
  CHECK(with(R"({"do_normalize": true, "do_rescale": true, "do_resize": true,
                 "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "ViTImageProcessor",
                 "image_std": [0.5, 0.5, 0.5], "resample": 2,
                 "rescale_factor": 0.00392156862745098, "size": {"height": 32, "width": 32}})"));
  CHECK(with(R"({"feature_extractor_type": "ViTFeatureExtractor", "size": 32})"));
  CHECK_FALSE(with(R"({"do_resize": false})"));
  auto refused = [&](const std::string& json) {
    try {
      with(json);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  CHECK_THAT(refused(R"({"image_mean": [0.485, 0.456, 0.406]})"),
             Catch::Contains("image_mean [0.485,0.456,0.406]"));
  CHECK_THAT(refused(R"({"size": {"height": 224, "width": 224}})"),
             Catch::Contains("is not the model's image_size 32"));
  CHECK_THAT(refused(R"({"resample": 3})"), Catch::Contains("resample 3"));
  CHECK_THAT(refused(R"({"rescale_factor": 1})"), Catch::Contains("rescale_factor 1"));
  CHECK_THAT(refused(R"({"do_center_crop": true})"), Catch::Contains("do_center_crop"));
  CHECK_THAT(refused(R"({"image_processor_type": "DeiTImageProcessor"})"),
             Catch::Contains("DeiTImageProcessor"));
  CHECK_THAT(refused(R"({"do_normalize": false})"), Catch::Contains("do_normalize false"));

  // do_resize false: another size is refused, naming the file.
  const int64_t s = 4;
  std::vector<uint8_t> px(static_cast<size_t>(8 * 8 * 3), 9);
  std::filesystem::create_directories(dir.file("img/a"));
  std::filesystem::create_directories(dir.file("img/b"));
  write_png(dir.file("img/a/x.png"), px.data(), 8, 8, 3);
  write_png(dir.file("img/b/y.png"), px.data(), 8, 8, 3);
  CHECK_THROWS_WITH(ImageExamples::open_folder(dir.file("img"), 3, s, false),
                    Catch::Contains("a/x.png is 8x8") && Catch::Contains("do_resize false"));
  CHECK(ImageExamples::open_folder(dir.file("img"), 3, s, true).size() == 2);
}
}  // namespace
}  // namespace mammoth::data
