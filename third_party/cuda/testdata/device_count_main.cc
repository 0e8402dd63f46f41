// Prints how many CUDA devices this machine has, through a cuda_library built by nvcc:
// "no CUDA device (<reason>)" without a driver or GPU, else "CUDA devices: N, kernel: 42".
#include <cstdio>
#include <exception>
#include <string>

#ifdef MAMMOTH_TEST_CUDA
#include "third_party/cuda/testdata/device_count.h"
#endif

int main() {
#ifdef MAMMOTH_TEST_CUDA
  try {
    std::string reason;
    const int count = mammoth::testdata::cuda_device_count(&reason);
    if (count == 0) {
      std::printf("no CUDA device (%s)\n", reason.c_str());
      return 0;
    }
    std::printf("CUDA devices: %d, kernel: %d\n", count, mammoth::testdata::cuda_answer());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
#else
  std::printf("CUDA disabled (no toolkit)\n");
#endif
  return 0;
}
