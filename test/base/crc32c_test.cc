// CRC-32C: published check values, the hardware path (three interleaved streams for long
// inputs) against the portable table loop on awkward lengths and offsets, chaining, and the
// combine identity of Crc32cShift, and crc32c_file across its read buffer.
#include "base/crc32c.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "test/testing/test_dir.h"

using namespace mammoth;

namespace {

std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

}  // namespace

TEST_CASE("crc32c check values") {
  // RFC 3720 (iSCSI) B.4 and the usual "123456789" check value.
  const std::string digits = "123456789";
  CHECK(crc32c(digits.data(), digits.size()) == 0xe3069283u);
  CHECK(crc32c_portable(digits.data(), digits.size()) == 0xe3069283u);
  std::vector<unsigned char> zeros(32, 0), ones(32, 0xff), inc(32);
  for (size_t i = 0; i < inc.size(); ++i) inc[i] = static_cast<unsigned char>(i);
  CHECK(crc32c(zeros.data(), zeros.size()) == 0x8a9136aau);
  CHECK(crc32c(ones.data(), ones.size()) == 0x62a8ab43u);
  CHECK(crc32c(inc.data(), inc.size()) == 0x46dd794eu);
  CHECK(crc32c(nullptr, 0) == 0u);
}

TEST_CASE("crc32c: the fast path equals the table loop at every length and alignment") {
  INFO("hardware: " << crc32c_hardware());
  const auto data = random_bytes(3 * 3 * 8192 + 4099, 7);
  // Lengths around the 3-stripe superblock (3 x 8 KiB) and the 8-byte words, at odd offsets.
  for (size_t n :
       {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{4096}, size_t{24575},
        size_t{24576}, size_t{24577}, size_t{49152 + 13}, size_t{3 * 3 * 8192 + 4096}}) {
    for (size_t off : {size_t{0}, size_t{1}, size_t{3}}) {
      INFO("n " << n << " offset " << off);
      REQUIRE(crc32c(data.data() + off, n) == crc32c_portable(data.data() + off, n));
      REQUIRE(crc32c(data.data() + off, n, 0x12345678u) ==
              crc32c_portable(data.data() + off, n, 0x12345678u));
    }
  }
}

TEST_CASE("crc32c chains and combines") {
  const auto data = random_bytes(100000, 3);
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t cut : {size_t{0}, size_t{1}, size_t{4096}, size_t{30001}, size_t{99999}}) {
    INFO("cut " << cut);
    const uint32_t head = crc32c(data.data(), cut);
    const uint32_t tail = crc32c(data.data() + cut, data.size() - cut);
    CHECK(crc32c(data.data() + cut, data.size() - cut, head) == whole);
    CHECK((Crc32cShift(data.size() - cut)(head) ^ tail) == whole);
  }
  // A flipped bit anywhere changes the value.
  auto bad = data;
  bad[54321] ^= 0x10;
  CHECK(crc32c(bad.data(), bad.size()) != whole);
}

TEST_CASE("crc32c_three_parts gives each part's CRC and joins to the whole") {
  const auto data = random_bytes(30000, 5);
  for (auto [ab, c] : {std::pair<size_t, size_t>{8, 0}, {1368, 1360}, {8192, 8192}, {800, 8}}) {
    INFO("ab " << ab << " c " << c);
    uint32_t r[3];
    crc32c_three_parts(data.data(), ab, c, r);
    CHECK(r[0] == crc32c_portable(data.data(), ab));
    CHECK(r[1] == crc32c_portable(data.data() + ab, ab));
    CHECK(r[2] == crc32c_portable(data.data() + 2 * ab, c));
    const uint32_t joined = Crc32cShift(ab + c)(r[0]) ^ Crc32cShift(c)(r[1]) ^ r[2];
    CHECK(joined == crc32c_portable(data.data(), 2 * ab + c));
  }
  uint32_t r[3];
  CHECK_THROWS_WITH(crc32c_three_parts(data.data(), 16, 24, r), Catch::Contains("c <= ab"));
  CHECK_THROWS_WITH(crc32c_three_parts(data.data(), 12, 8, r), Catch::Contains("multiples of 8"));
}

TEST_CASE("crc32c_file reads files across its buffer's boundaries") {
  const testing::TestDir dir;
  // Lengths around the read buffer's 256 KiB and its multiples, and the empty file.
  for (const size_t n : {size_t{0}, size_t{1}, size_t{262143}, size_t{262144}, size_t{262145},
                         size_t{3 * 262144 + 17}}) {
    const std::vector<unsigned char> bytes = random_bytes(n, static_cast<uint32_t>(n));
    const std::string path =
        dir.write("f" + std::to_string(n), std::string(bytes.begin(), bytes.end()));
    CAPTURE(n);
    CHECK(crc32c_file(path) == crc32c(bytes.data(), bytes.size()));
  }
  CHECK_THROWS_WITH(crc32c_file(dir.file("missing")),
                    Catch::Contains("cannot open " + dir.file("missing")));
}
