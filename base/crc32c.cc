#include "base/crc32c.h"

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/error.h"

namespace mammoth {
namespace {

// Slicing-by-8 tables for the reflected polynomial 0x82F63B78.
std::array<std::array<uint32_t, 256>, 8> make_tables() {
  std::array<std::array<uint32_t, 256>, 8> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
  return t;
}

const std::array<std::array<uint32_t, 256>, 8>& tables() {
  static const auto t = make_tables();
  return t;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto& t = tables();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= crc;
    crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
          t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xff];
  return ~crc;
}

uint32_t crc32c_masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint32_t crc32c_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  MAMMOTH_CHECK(f != nullptr) << "[crc32c] cannot open " << path << ": " << std::strerror(errno);
  std::vector<unsigned char> buf(1 << 20);
  uint32_t crc = 0;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) crc = crc32c(buf.data(), n, crc);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  MAMMOTH_CHECK(!failed) << "[crc32c] read error on " << path;
  return crc;
}

}  // namespace mammoth
