// Tests for base/json: parsing, accessors, round trips, unicode and malformed input.
#include "base/json.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "base/error.h"

namespace json = mammoth::json;
using mammoth::Error;

namespace {

// The message of the Error thrown by parse(text), or "" if it parsed.
std::string parse_error(const std::string& text) {
  try {
    json::parse(text, "t.json");
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

}  // namespace

TEST_CASE("json parses scalars", "[json]") {
  CHECK(json::parse("null").is_null());
  CHECK(json::parse("true").as_bool());
  CHECK_FALSE(json::parse(" false ").as_bool());
  CHECK(json::parse("42").as_int() == 42);
  CHECK(json::parse("42").is_int());
  CHECK(json::parse("-0").as_int() == 0);
  CHECK(json::parse("-17").as_double() == -17.0);
  CHECK(json::parse("2.5").as_double() == 2.5);
  CHECK_FALSE(json::parse("2.5").is_int());
  CHECK(json::parse("1e3").as_int() == 1000);  // integral double accepted by as_int
  CHECK_FALSE(json::parse("1e3").is_int());
  CHECK(json::parse("-1.25E-2").as_double() == -0.0125);
  CHECK(json::parse("1e-400").as_double() == 0.0);  // underflow is fine
  CHECK(json::parse("\"hi\"").as_string() == "hi");
}

TEST_CASE("json keeps int64 exact and big integers as doubles", "[json]") {
  CHECK(json::parse("9223372036854775807").as_int() == INT64_MAX);
  CHECK(json::parse("-9223372036854775808").as_int() == INT64_MIN);
  CHECK(json::parse("9007199254740993").as_int() == 9007199254740993LL);  // not a double
  json::Value big = json::parse("18446744073709551616");
  CHECK_FALSE(big.is_int());
  CHECK(big.as_double() == 18446744073709551616.0);
  CHECK_THROWS_AS(big.as_int(), Error);
  CHECK_THROWS_AS(json::parse("1.5").as_int(), Error);
}

TEST_CASE("json objects keep insertion order and look up by key", "[json]") {
  json::Value v = json::parse(R"({"b": 1, "a": [true, null, "x"], "c": {"d": 2.5}})");
  REQUIRE(v.is_object());
  REQUIRE(v.size() == 3);
  CHECK(v[0].key() == "b");
  CHECK(v[1].key() == "a");
  CHECK(v[2].key() == "c");
  CHECK(v.at("b").as_int() == 1);
  CHECK(v.at("a").size() == 3);
  CHECK(v.at("a")[0].as_bool());
  CHECK(v.at("a")[1].is_null());
  CHECK(v.at("a")[2].as_string() == "x");
  CHECK(v.at("c").at("d").as_double() == 2.5);
  CHECK(v.find("zzz") == nullptr);
  REQUIRE(v.find("b") != nullptr);
  CHECK(v.find("b")->as_int() == 1);
  std::string keys;
  for (const json::Value& m : v) keys += m.key();
  CHECK(keys == "bac");
}

TEST_CASE("json large objects use the index consistently", "[json]") {
  json::Value v = json::Value::object();
  for (int i = 0; i < 1000; ++i) v.set("k" + std::to_string(i), i);
  v.set("k500", "replaced");  // replacing keeps position
  REQUIRE(v.size() == 1000);
  CHECK(v[500].as_string() == "replaced");
  for (int i = 0; i < 1000; ++i) {
    if (i == 500) continue;
    REQUIRE(v.at("k" + std::to_string(i)).as_int() == i);
  }
  json::Value copy = v;  // the copy has its own index
  copy.set("new", 1);
  CHECK(copy.contains("new"));
  CHECK_FALSE(v.contains("new"));
  CHECK(copy.at("k999").as_int() == 999);
  json::Value reparsed = json::parse(json::dump(v));
  CHECK(reparsed.at("k123").as_int() == 123);
  CHECK(reparsed[999].key() == "k999");
}

TEST_CASE("json accessor errors name key, expected and actual type", "[json]") {
  json::Value v = json::parse(R"({"n_layer": "twelve", "dims": [1, 2]})", "config.json");
  try {
    v.at("n_layer").as_int();
    FAIL("no throw");
  } catch (const Error& e) {
    const std::string m = e.message();
    CHECK(m.find("n_layer") != std::string::npos);
    CHECK(m.find("integer") != std::string::npos);
    CHECK(m.find("string") != std::string::npos);
  }
  try {
    v.at("n_head");
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(std::string(e.message()).find("n_head") != std::string::npos);
    CHECK(std::string(e.message()).find("n_layer") != std::string::npos);  // keys present
  }
  CHECK_THROWS_AS(v.at("dims")[2], Error);
  CHECK_THROWS_AS(v.at("dims").at("x"), Error);
  CHECK_THROWS_AS(v.at("dims").as_string(), Error);
  CHECK_THROWS_AS(v.at("n_layer").size(), Error);
  CHECK_THROWS_AS(v.at("n_layer").as_bool(), Error);
  CHECK_THROWS_AS(v.as_double(), Error);
  CHECK_THROWS_AS(json::Value(1).push_back(2), Error);
  CHECK_THROWS_AS(json::Value::array().set("k", 2), Error);
}

TEST_CASE("json string escapes and unicode", "[json]") {
  CHECK(json::parse(R"("a\"b\\c\/d\b\f\n\r\t")").as_string() == "a\"b\\c/d\b\f\n\r\t");
  CHECK(json::parse(R"("\u0041\u00e9\u20AC")").as_string() == "A\xc3\xa9\xe2\x82\xac");
  // U+1F600 as a surrogate pair becomes 4-byte UTF-8.
  CHECK(json::parse(R"("\ud83d\ude00")").as_string() == "\xf0\x9f\x98\x80");
  CHECK(json::parse(R"("\u0000")").as_string() == std::string(1, '\0'));
  // Raw UTF-8 passes through.
  CHECK(json::parse("\"\xc4\xa0hello \xe2\x82\xac\"").as_string() == "\xc4\xa0hello \xe2\x82\xac");
  // Dump escapes control characters and keeps UTF-8.
  json::Value s(std::string("x\x01\n\"\\\xe2\x82\xac") + std::string(1, '\0'));
  CHECK(json::dump(s) == "\"x\\u0001\\n\\\"\\\\\xe2\x82\xac\\u0000\"");
  CHECK(json::parse(json::dump(s)).as_string() == s.as_string());
}

TEST_CASE("json dump writes valid compact and indented JSON", "[json]") {
  json::Value v = json::Value::object();
  v.set("step", 10).set("loss", 2.5).set("shape", json::Value::array().push_back(3).push_back(4));
  v.set("empty", json::Value::object()).set("none", nullptr).set("ok", true);
  v.set("one", 1.0);
  CHECK(json::dump(v) ==
        R"({"step":10,"loss":2.5,"shape":[3,4],"empty":{},"none":null,"ok":true,"one":1.0})");
  CHECK(json::dump(v, 2) ==
        "{\n  \"step\": 10,\n  \"loss\": 2.5,\n  \"shape\": [\n    3,\n    4\n"
        "  ],\n  \"empty\": {},\n  \"none\": null,\n  \"ok\": true,\n"
        "  \"one\": 1.0\n}");
  CHECK(json::dump(json::parse(json::dump(v, 2))) == json::dump(v));
  CHECK_FALSE(json::parse(json::dump(v)).at("one").is_int());  // stays a double
  CHECK_THROWS_AS(json::dump(json::Value(std::nan(""))), Error);
  CHECK_THROWS_AS(json::dump(json::Value(std::numeric_limits<double>::infinity())), Error);
  // Unsigned values above INT64_MAX become doubles (2^64 here after rounding).
  const json::Value huge(uint64_t{18446744073709551615ULL});
  CHECK_FALSE(huge.is_int());
  CHECK(json::parse(json::dump(huge)).as_double() == 18446744073709551616.0);
}

TEST_CASE("json doubles round trip exactly", "[json]") {
  std::mt19937_64 rng(1234);
  const double fixed[] = {0.1,     1.0 / 3.0, 1e-300,        5e-324, 1.7976931348623157e308,
                          -2.5e-8, 1e22,      123456789.125, -0.0};
  for (double d : fixed) {
    const double back = json::parse(json::dump(json::Value(d))).as_double();
    CHECK(std::memcmp(&back, &d, sizeof(d)) == 0);
  }
  for (int i = 0; i < 20000; ++i) {
    uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, sizeof(d));
    if (!std::isfinite(d)) continue;
    const std::string text = json::dump(json::Value(d));
    const double back = json::parse(text).as_double();
    REQUIRE(std::memcmp(&back, &d, sizeof(d)) == 0);
  }
  for (int i = 0; i < 2000; ++i) {
    const int64_t n = static_cast<int64_t>(rng());
    REQUIRE(json::parse(json::dump(json::Value(n))).as_int() == n);
  }
}

TEST_CASE("json malformed input gives an Error with line and column", "[json]") {
  struct Case {
    const char* text;
    const char* position;  // "line:column" expected in the message
  };
  const Case cases[] = {
      {"", "1:1"},
      {"   ", "1:4"},
      {"{", "1:2"},
      {"[1, 2", "1:6"},
      {"[1, 2,]", "1:7"},
      {"{\"a\": 1,}", "1:9"},
      {"{\"a\" 1}", "1:6"},
      {"{a: 1}", "1:2"},
      {"{\"a\": 1}\n\n  x", "3:3"},
      {"[1]\n]", "2:1"},
      {"tru", "1:1"},
      {"nul", "1:1"},
      {"01", "1:1"},
      {"-", "1:2"},
      {"1.", "1:3"},
      {".5", "1:1"},
      {"1e", "1:3"},
      {"+1", "1:1"},
      {"1e999", "1:1"},
      {"NaN", "1:1"},
      {"\"abc", "1:5"},
      {"\"a\nb\"", "1:3"},
      {"\"\\x\"", "1:3"},
      {"\"\\u12G4\"", "1:6"},
      {"\"\\u12", "1:4"},
      {"\"\\ud800\"", "1:2"},
      {"\"\\ud800\\u0041\"", "1:2"},
      {"\"\\udc00\"", "1:2"},
      {"\"\xff\"", "1:2"},
      {"\"\xc0\xaf\"", "1:2"},           // overlong '/'
      {"\"\xed\xa0\x80\"", "1:2"},       // UTF-8-encoded surrogate
      {"\"\xe2\x82\"", "1:2"},           // truncated
      {"{\"a\": 1, \"a\": 2}", "1:10"},  // duplicate key
      {"[1] // c", "1:5"},
      {"\n\n   [true false]", "3:10"},
  };
  for (const Case& c : cases) {
    INFO("input: " << c.text);
    const std::string m = parse_error(c.text);
    REQUIRE_FALSE(m.empty());
    CHECK(m.find(std::string("t.json:") + c.position + ":") != std::string::npos);
    INFO(m);
  }
}

TEST_CASE("json rejects deep nesting without overflowing the stack", "[json]") {
  // Exactly kMaxDepth levels parse; one more is rejected.
  std::string ok = std::string(json::kMaxDepth, '[') + std::string(json::kMaxDepth, ']');
  CHECK(json::parse(ok).is_array());
  std::string too_deep =
      std::string(json::kMaxDepth + 1, '[') + std::string(json::kMaxDepth + 1, ']');
  CHECK(parse_error(too_deep).find("nesting") != std::string::npos);
  // Hostile input far deeper than any stack could recurse.
  CHECK(parse_error(std::string(10'000'000, '[')).find("nesting") != std::string::npos);
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  CHECK(parse_error(objects).find("nesting") != std::string::npos);
}

TEST_CASE("json random mutations never crash", "[json]") {
  const std::string base =
      R"({"a": [1, 2.5, -3e2, true, false, null], "b\u00e9": {"c": "x\ny", "d": []}, "e": {}})";
  std::mt19937 rng(7);
  const char alphabet[] = "{}[]\",:\\u0123456789abcdefeE.+- \ntrnl\xc3\xa9\xff";
  int parsed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits && !s.empty(); ++k) {
      const size_t pos = rng() % s.size();
      const char c = alphabet[rng() % (sizeof(alphabet) - 1)];
      switch (rng() % 3) {
        case 0:
          s[pos] = c;
          break;
        case 1:
          s.insert(s.begin() + static_cast<std::ptrdiff_t>(pos), c);
          break;
        default:
          s.erase(pos, 1 + rng() % 3);
          break;
      }
    }
    try {
      json::Value v = json::parse(s);
      // Whatever parsed must dump and re-parse to the same text.
      REQUIRE(json::dump(json::parse(json::dump(v))) == json::dump(v));
      ++parsed;
    } catch (const Error&) {
    }
  }
  CHECK(parsed > 0);
}

TEST_CASE("json parse_file names the file", "[json]") {
  try {
    json::parse_file("/nonexistent/dir/vocab.json");
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(std::string(e.message()).find("/nonexistent/dir/vocab.json") != std::string::npos);
  }
}
