// The one main() for Catch2 tests: link "//test/testing:catch_main" instead of defining
// CATCH_CONFIG_MAIN in a test file, so each test binary compiles Catch2's runner once. A run
// whose test-case filter matches nothing fails (catch_args.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "test/testing/catch_args.h"

int main(int argc, char** argv) {
  std::vector<char*> args = mammoth::testing::catch_args(argc, argv);
  return Catch::Session().run(static_cast<int>(args.size()), args.data());
}
