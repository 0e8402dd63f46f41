// A GPU test in a build without the CUDA backend: says so and fails (never passes silently).
#include <cstdio>

int main() {
  std::printf(
      "[gpu test] no CUDA backend in this build (no toolkit, or "
      "--//third_party/cuda:enable_cuda=false)\n");
  return 1;
}
