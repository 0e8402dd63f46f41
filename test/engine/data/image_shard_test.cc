// Labelled image shards: round trip, the synthetic generator, and clear errors for bad files.
#include "engine/data/image_shard.h"

#include <catch2/catch.hpp>
#include <fstream>

#include "base/error.h"
#include "test/testing/test_dir.h"

using namespace mammoth;
using mammoth::testing::TestDir;

TEST_CASE("image shards round trip and normalise like the HF ViT processor") {
  TestDir dir;
  const data::ImageShardInfo info{3, 2, 2, 2, 4};
  std::vector<int32_t> labels{0, 3, 1};
  std::vector<uint8_t> pixels(24);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 10);
  data::write_image_shard(dir.file("a.bin"), info, labels, pixels);
  const data::ImageShard s = data::ImageShard::open(dir.file("a.bin"));
  CHECK(s.info().count == 3);
  CHECK(s.info().num_classes == 4);
  CHECK(s.label(1) == 3);
  CHECK(s.pixels(2)[0] == 160);
  std::vector<float> px;
  std::vector<int64_t> lb;
  s.read(1, 2, &px, &lb);
  CHECK(lb == std::vector<int64_t>{3, 1});
  REQUIRE(px.size() == 16);
  CHECK(px[0] == Approx((80 / 255.0 - 0.5) / 0.5));
}

TEST_CASE("the synthetic generator is deterministic and uses every class") {
  TestDir dir;
  data::write_synthetic_image_shard(dir.file("a.bin"), 200, 5, 3, 8, 42);
  data::write_synthetic_image_shard(dir.file("b.bin"), 200, 5, 3, 8, 42);
  data::write_synthetic_image_shard(dir.file("c.bin"), 200, 5, 3, 8, 43);
  const auto a = data::ImageShard::open(dir.file("a.bin"));
  const auto b = data::ImageShard::open(dir.file("b.bin"));
  const auto c = data::ImageShard::open(dir.file("c.bin"));
  std::vector<int> seen(5, 0);
  bool differs = false;
  for (int64_t i = 0; i < 200; ++i) {
    CHECK(a.label(i) == b.label(i));
    CHECK(std::equal(a.pixels(i), a.pixels(i) + 192, b.pixels(i)));
    differs |= !std::equal(a.pixels(i), a.pixels(i) + 192, c.pixels(i));
    ++seen[a.label(i)];
  }
  CHECK(differs);
  for (int k = 0; k < 5; ++k) CHECK(seen[k] > 10);
}

TEST_CASE("bad image shards are clear errors") {
  TestDir dir;
  const std::string path = dir.file("x.bin");
  data::write_synthetic_image_shard(path, 4, 2, 1, 4, 1);
  // Truncate by one byte.
  {
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(dir.file("short.bin"), std::ios::binary) << bytes.substr(0, bytes.size() - 1);
    bytes[0] = 'X';
    std::ofstream(dir.file("magic.bin"), std::ios::binary) << bytes;
  }
  CHECK_THROWS_WITH(data::ImageShard::open(dir.file("short.bin")), Catch::Contains("truncated"));
  CHECK_THROWS_WITH(data::ImageShard::open(dir.file("magic.bin")), Catch::Contains("bad magic"));
  CHECK_THROWS_WITH(data::ImageShard::open(dir.file("missing.bin")),
                    Catch::Contains("missing.bin"));
  CHECK_THROWS_AS(data::write_image_shard(path, {2, 1, 1, 1, 2}, {0}, {1, 2}), Error);
}

TEST_CASE("an image shard header whose sizes overflow 64 bits is refused") {
  // test/fuzz/image_shard_fuzz.cc found count * C*H*W overflowing int64 (UBSan). With
  // 2^22 * 2^21 * 2^21 pixels per image the product wraps to 0, so a 1028-byte file (header
  // and one label) used to match the size its header described and open.
  TestDir dir;
  int32_t header[257] = {
      data::kImageShardMagic, data::kImageShardVersion, 1, 1 << 22, 1 << 21, 1 << 21, 2};
  header[256] = 0;  // the one label
  const std::string path =
      dir.write("wrap.bin", std::string(reinterpret_cast<const char*>(header), sizeof(header)));
  CHECK_THROWS_WITH(data::ImageShard::open(path), Catch::Contains("an impossible size"));
}

TEST_CASE("an empty image shard whose one image would not fit int64 is refused") {
  // The fuzz pass found this one: count 0 makes the file's size match (the header alone) while
  // C*H*W = 3670016 * 2097152 * 2097152 overflowed pixels_per_image() (UBSan).
  TestDir dir;
  int32_t header[256] = {
      data::kImageShardMagic, data::kImageShardVersion, 0, 3670016, 2097152, 2097152, 2};
  const std::string path =
      dir.write("empty.bin", std::string(reinterpret_cast<const char*>(header), sizeof(header)));
  CHECK_THROWS_WITH(data::ImageShard::open(path), Catch::Contains("an impossible size"));
}
