// The standalone gemm benchmark binary (the same code as `mammoth bench gemm`).
#include <string>
#include <vector>

#include "tools/bench/gemm_bench.h"

int main(int argc, char** argv) {
  return mammoth::tools::run_gemm_bench(std::vector<std::string>(argv + 1, argv + argc));
}
