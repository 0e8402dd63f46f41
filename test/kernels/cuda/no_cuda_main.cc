// The CUDA kernel test in a build without the CUDA backend: says so and fails (never passes
// silently).
#include <cstdio>

int main() {
  std::printf(
      "[cuda_kernels_test] no CUDA device: this build has no CUDA backend (no toolkit, or "
      "--//third_party/cuda:enable_cuda=false)\n");
  return 1;
}
