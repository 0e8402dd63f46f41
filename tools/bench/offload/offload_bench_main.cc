// Standalone `mammoth bench offload` (same code as the subcommand).
#include <cstdio>
#include <string>
#include <vector>

#include "base/error.h"
#include "tools/bench/offload_bench.h"

int main(int argc, char** argv) {
  try {
    return mammoth::tools::run_offload_bench(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
