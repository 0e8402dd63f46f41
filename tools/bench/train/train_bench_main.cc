// The standalone form of `mammoth bench train` (same flags):
// bazel-bin/tools/bench/train/train_bench
#include <cstdio>
#include <string>
#include <vector>

#include "base/error.h"
#include "tools/bench/train/train_bench.h"

int main(int argc, char** argv) {
  try {
    return mammoth::tools::run_train_bench(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const mammoth::Error& e) {
    std::fprintf(stderr, "train_bench: error: %s\n", e.message().c_str());
    return 1;
  }
}
