// Tests for base/error.h: MAMMOTH_CHECK / MAMMOTH_THROW build the message lazily, throw
// mammoth::Error with file:line, and keep the bare message separately.
#include "base/error.h"

#include <catch2/catch.hpp>
#include <string>

namespace {

int g_evaluations = 0;

int count_evaluation() {
  ++g_evaluations;
  return 7;
}

// Throws from a function so the test also covers use as a statement inside if/else.
void check_positive(int v) {
  if (v != 0)
    MAMMOTH_CHECK(v > 0) << "[check_positive] expected a positive value, got " << v;
  else
    MAMMOTH_THROW() << "[check_positive] zero is not allowed";
}

}  // namespace

TEST_CASE("MAMMOTH_CHECK passes without evaluating the message", "[error]") {
  g_evaluations = 0;
  REQUIRE_NOTHROW([] { MAMMOTH_CHECK(1 + 1 == 2) << "never " << count_evaluation(); }());
  REQUIRE(g_evaluations == 0);
}

TEST_CASE("MAMMOTH_CHECK throws Error with file, line and message", "[error]") {
  g_evaluations = 0;
  int line = 0;
  try {
    line = __LINE__ + 1;
    MAMMOTH_CHECK(2 < 1) << "[test] shape (" << 4 << ", " << 8 << ") value " << count_evaluation();
    FAIL("MAMMOTH_CHECK(false) did not throw");
  } catch (const mammoth::Error& e) {
    REQUIRE(g_evaluations == 1);
    REQUIRE(e.message() == "[test] shape (4, 8) value 7");
    const std::string expected = "error_test.cc:" + std::to_string(line) + ": " + e.message();
    REQUIRE(std::string(e.what()) == expected);
  }
}

TEST_CASE("MAMMOTH_CHECK without a message names the condition", "[error]") {
  try {
    const int rank = 3;
    MAMMOTH_CHECK(rank < 2);
    FAIL("did not throw");
  } catch (const mammoth::Error& e) {
    REQUIRE(e.message() == "check failed: rank < 2");
  }
}

TEST_CASE("MAMMOTH_THROW always throws and is a std::runtime_error", "[error]") {
  REQUIRE_THROWS_AS(check_positive(-5), std::runtime_error);
  REQUIRE_THROWS_WITH(
      check_positive(-5),
      Catch::Matchers::EndsWith("[check_positive] expected a positive value, got -5"));
  REQUIRE_THROWS_WITH(check_positive(0), Catch::Matchers::EndsWith("zero is not allowed"));
  REQUIRE_NOTHROW(check_positive(3));
}

TEST_CASE("MAMMOTH_CHECK binds as one statement under if/else", "[error]") {
  // A dangling-else bug in the macro would attach this else to the macro's own if.
  bool else_taken = false;
  const bool flag = false;
  if (flag)
    MAMMOTH_CHECK(false) << "not reached";
  else
    else_taken = true;
  REQUIRE(else_taken);
}
