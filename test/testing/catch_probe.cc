// A test binary with one case, for catch_filter_test.sh.
#include <catch2/catch.hpp>

TEST_CASE("the probe's only case") { CHECK(1 + 1 == 2); }
