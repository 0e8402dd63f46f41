#include "base/crc32c.h"

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "base/error.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

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

uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc) {
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

namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // bit-reflected: bit 31 is x^0

// a * b mod P, both bit-reflected polynomials.
uint32_t mul_mod_p(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(8 n) mod P.
uint32_t x_pow_8n(size_t n) {
  uint32_t result = 1u << 31;  // x^0
  uint32_t square = 1u << 23;  // x^8
  for (; n != 0; n >>= 1) {
    if (n & 1) result = mul_mod_p(square, result);
    square = mul_mod_p(square, square);
  }
  return result;
}

#if defined(__x86_64__)

// One stream, continuing the raw (uninverted) register c.
__attribute__((target("sse4.2"))) uint32_t hw_stream(uint32_t c, const unsigned char* p, size_t n) {
  uint64_t r = c;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    r = _mm_crc32_u64(r, w);
  }
  uint32_t c32 = static_cast<uint32_t>(r);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

// Inputs of at least three stripes run as three interleaved streams per 3-stripe superblock.
constexpr size_t kStripe = 8192;

struct StripeShifts {
  Crc32cShift one{kStripe}, two{2 * kStripe}, three{3 * kStripe};
};

const StripeShifts& stripe_shifts() {
  static const StripeShifts s;
  return s;
}

// The three finished CRCs of A = p[0, ab), B = p[ab, 2 ab), C = p[2 ab, 2 ab + c) as three
// interleaved streams (c <= ab, both multiples of 8).
__attribute__((target("sse4.2"))) void three_parts_hw(const unsigned char* p, size_t ab, size_t c,
                                                      uint32_t out[3]) {
  uint64_t ra = 0xffffffffu, rb = 0xffffffffu, rc = 0xffffffffu;
  const unsigned char* pb = p + ab;
  const unsigned char* pc = pb + ab;
  size_t i = 0;
  for (; i < c; i += 8) {
    uint64_t wa, wb, wc;
    std::memcpy(&wa, p + i, 8);
    std::memcpy(&wb, pb + i, 8);
    std::memcpy(&wc, pc + i, 8);
    ra = _mm_crc32_u64(ra, wa);
    rb = _mm_crc32_u64(rb, wb);
    rc = _mm_crc32_u64(rc, wc);
  }
  for (; i < ab; i += 8) {  // A and B may be longer than C
    uint64_t wa, wb;
    std::memcpy(&wa, p + i, 8);
    std::memcpy(&wb, pb + i, 8);
    ra = _mm_crc32_u64(ra, wa);
    rb = _mm_crc32_u64(rb, wb);
  }
  out[0] = ~static_cast<uint32_t>(ra);
  out[1] = ~static_cast<uint32_t>(rb);
  out[2] = ~static_cast<uint32_t>(rc);
}

__attribute__((target("sse4.2"))) uint32_t crc32c_hw(const unsigned char* p, size_t n,
                                                     uint32_t crc) {
  if (n >= 3 * kStripe) {
    const StripeShifts& sh = stripe_shifts();
    for (; n >= 3 * kStripe; n -= 3 * kStripe, p += 3 * kStripe) {
      uint32_t r[3];
      three_parts_hw(p, kStripe, kStripe, r);
      // crc(prefix || A || B || C) from the four finished CRCs.
      crc = sh.three(crc) ^ sh.two(r[0]) ^ sh.one(r[1]) ^ r[2];
    }
  }
  return ~hw_stream(~crc, p, n);
}

bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}

#else

bool have_sse42() { return false; }

#endif

}  // namespace

Crc32cShift::Crc32cShift(size_t n) {
  const uint32_t k = x_pow_8n(n);
  for (int byte = 0; byte < 4; ++byte) {
    for (uint32_t v = 0; v < 256; ++v) table_[byte][v] = mul_mod_p(k, v << (8 * byte));
  }
}

bool crc32c_hardware() { return have_sse42(); }

void crc32c_three_parts(const void* data, size_t ab, size_t c, uint32_t out[3]) {
  MAMMOTH_CHECK(c <= ab && ab % 8 == 0 && c % 8 == 0)
      << "[crc32c] three parts need c <= ab, both multiples of 8; got ab " << ab << ", c " << c;
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (have_sse42()) return three_parts_hw(p, ab, c, out);
#endif
  out[0] = crc32c_portable(p, ab);
  out[1] = crc32c_portable(p + ab, ab);
  out[2] = crc32c_portable(p + 2 * ab, c);
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  if (have_sse42()) return crc32c_hw(static_cast<const unsigned char*>(data), n, crc);
#endif
  return crc32c_portable(data, n, crc);
}

uint32_t crc32c_masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

uint32_t crc32c_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  MAMMOTH_CHECK(f != nullptr) << "[crc32c] cannot open " << path << ": " << std::strerror(errno);
  // Not zeroed: fread fills what is used, and a checkpoint's small JSON files would otherwise
  // pay for clearing the whole buffer. 256 KiB reads a large file as fast as 1 MiB does, and
  // costs small files less (under AddressSanitizer, whose checkpoint fuzzer verifies thousands
  // of small files a second, each allocation's shadow is poisoned and cleared per call).
  constexpr size_t kBufBytes = 1 << 18;
  const auto buf = std::make_unique_for_overwrite<unsigned char[]>(kBufBytes);
  uint32_t crc = 0;
  size_t n;
  while ((n = std::fread(buf.get(), 1, kBufBytes, f)) > 0) crc = crc32c(buf.get(), n, crc);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  MAMMOTH_CHECK(!failed) << "[crc32c] read error on " << path;
  return crc;
}

}  // namespace mammoth
