// Writes a learnable labelled image set for the ViT training tests:
//   image_tool folder DIR CLASSES PER_CLASS SIZE SEED
// DIR/class_<k>/img_<i>.png|.jpg (even i PNG, odd i JPEG): gray noise with a square of class
// k's colour at a seeded random place, so a small ViT must find the square to tell the classes
// apart. Deterministic in SEED.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/data/image_folder.h"
#include "engine/data/sampler.h"

namespace {

int run(int argc, char** argv) {
  using namespace mammoth;  // NOLINT: a test tool's main
  if (argc != 7 || std::string(argv[1]) != "folder") {
    std::fprintf(stderr, "usage: image_tool folder DIR CLASSES PER_CLASS SIZE SEED\n");
    return 2;
  }
  const std::string dir = argv[2];
  const int64_t classes = std::atoll(argv[3]), per_class = std::atoll(argv[4]),
                size = std::atoll(argv[5]);
  uint64_t state = std::strtoull(argv[6], nullptr, 10);
  static const uint8_t kColours[8][3] = {{230, 30, 30},  {30, 200, 40},  {40, 60, 230},
                                         {240, 220, 30}, {220, 40, 220}, {30, 210, 220},
                                         {250, 140, 20}, {120, 60, 20}};
  MAMMOTH_CHECK(classes >= 2 && classes <= 8) << "image_tool: 2..8 classes";
  const int64_t side = size / 2;
  for (int64_t k = 0; k < classes; ++k) {
    const std::string cdir = dir + "/class_" + std::to_string(k);
    std::filesystem::create_directories(cdir);
    for (int64_t i = 0; i < per_class; ++i) {
      std::vector<uint8_t> px(static_cast<size_t>(size * size * 3));
      for (uint8_t& p : px) p = static_cast<uint8_t>(60 + data::uniform_below(&state, 120));
      const int64_t y0 = static_cast<int64_t>(data::uniform_below(&state, size - side + 1));
      const int64_t x0 = static_cast<int64_t>(data::uniform_below(&state, size - side + 1));
      for (int64_t y = y0; y < y0 + side; ++y)
        for (int64_t x = x0; x < x0 + side; ++x)
          for (int c = 0; c < 3; ++c) px[(y * size + x) * 3 + c] = kColours[k][c];
      const std::string name = cdir + "/img_" + std::to_string(i);
      if (i % 2 == 0) {
        data::write_png(name + ".png", px.data(), size, size, 3);
      } else {
        data::write_jpeg(name + ".jpg", px.data(), size, size, 3, 90);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
