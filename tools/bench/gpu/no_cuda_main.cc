// gpu_bench in a build without the CUDA backend.
#include <cstdio>

int main() {
  std::fprintf(stderr, "[gpu_bench] no CUDA device: this build has no CUDA backend\n");
  return 1;
}
