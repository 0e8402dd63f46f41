// The one main() for Catch2 tests: link "//test/testing:catch_main" instead of defining
// CATCH_CONFIG_MAIN in a test file, so each test binary compiles Catch2's runner once.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
