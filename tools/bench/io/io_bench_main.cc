// Standalone `io_bench` binary: the same benchmark as `mammoth bench io` (tools/bench/io_bench.h).
#include <cstdio>
#include <string>
#include <vector>

#include "base/error.h"
#include "tools/bench/io_bench.h"

int main(int argc, char** argv) {
  try {
    return mammoth::tools::run_io_bench(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const mammoth::Error& e) {
    std::fprintf(stderr, "%s\n", e.message().c_str());
    return 1;
  }
}
