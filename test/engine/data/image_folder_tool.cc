// Opens an image folder as `train --images DIR` does and writes every example's model inputs
// (f32, [C, SIZE, SIZE] each, in the folder's order) to OUT, and its describe() line to stdout
// (the C++ side of image_resize_interop_test, which compares them with ViTImageProcessor's):
//   image_folder_tool DIR CHANNELS SIZE OUT
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <numeric>
#include <vector>

#include "engine/data/image_folder.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: image_folder_tool DIR CHANNELS SIZE OUT\n");
    return 2;
  }
  try {
    const auto e = mammoth::data::ImageExamples::open_folder(argv[1], std::atoll(argv[2]),
                                                             std::atoll(argv[3]));
    std::vector<int64_t> all(static_cast<size_t>(e.size()));
    std::iota(all.begin(), all.end(), 0);
    const mammoth::data::ExampleBatch b = e.read(all);
    std::ofstream out(argv[4], std::ios::binary);
    out.write(reinterpret_cast<const char*>(b.pixels.data()),
              static_cast<std::streamsize>(b.pixels.size() * sizeof(float)));
    std::printf("%s\n", e.describe().c_str());
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "%s\n", ex.what());
    return 1;
  }
  return 0;
}
