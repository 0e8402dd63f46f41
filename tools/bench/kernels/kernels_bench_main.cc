// The standalone kernels benchmark binary (the same code as `mammoth bench kernels`).
#include <string>
#include <vector>

#include "tools/bench/kernels_bench.h"

int main(int argc, char** argv) {
  return mammoth::tools::run_kernels_bench(std::vector<std::string>(argv + 1, argv + argc));
}
