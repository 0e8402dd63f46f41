#include "memory/io/block_checksum.h"

#include <cstring>

#include "base/crc32c.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace mammoth::memory::io {
namespace {

#if defined(__x86_64__)

__attribute__((target("sse4.2"))) uint32_t crc_tail(uint32_t c, const unsigned char* p, size_t n) {
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

// Four blocks side by side: each 8-byte step issues four independent crc32 instructions.
__attribute__((target("sse4.2"))) void crc_four(const unsigned char* p, size_t block,
                                                uint32_t* out) {
  uint64_t c0 = 0xffffffffu, c1 = 0xffffffffu, c2 = 0xffffffffu, c3 = 0xffffffffu;
  const unsigned char* p0 = p;
  const unsigned char* p1 = p + block;
  const unsigned char* p2 = p + 2 * block;
  const unsigned char* p3 = p + 3 * block;
  const size_t words = block / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w0, w1, w2, w3;
    std::memcpy(&w0, p0 + 8 * i, 8);
    std::memcpy(&w1, p1 + 8 * i, 8);
    std::memcpy(&w2, p2 + 8 * i, 8);
    std::memcpy(&w3, p3 + 8 * i, 8);
    c0 = _mm_crc32_u64(c0, w0);
    c1 = _mm_crc32_u64(c1, w1);
    c2 = _mm_crc32_u64(c2, w2);
    c3 = _mm_crc32_u64(c3, w3);
  }
  const size_t done = words * 8, rest = block - done;
  out[0] = ~crc_tail(static_cast<uint32_t>(c0), p0 + done, rest);
  out[1] = ~crc_tail(static_cast<uint32_t>(c1), p1 + done, rest);
  out[2] = ~crc_tail(static_cast<uint32_t>(c2), p2 + done, rest);
  out[3] = ~crc_tail(static_cast<uint32_t>(c3), p3 + done, rest);
}

// One 4 KiB block alone (a single random read's verification) as three independent streams of
// 1368, 1368 and 1360 bytes (base's crc32c_three_parts), so it runs at the instruction's
// throughput instead of its latency, the three CRCs joined with Crc32cShift. base's crc32c
// splits only inputs of three 8 KiB stripes or more; a lone block is what a random read
// verifies, hence this.
constexpr size_t kSplitBlock = 4096;
constexpr size_t kPartA = 1368, kPartB = 1368, kPartC = kSplitBlock - kPartA - kPartB;

struct SplitTables {
  Crc32cShift past_bc{kPartB + kPartC};
  Crc32cShift past_c{kPartC};
};

const SplitTables& split_tables() {
  static const SplitTables tables;
  return tables;
}

uint32_t crc_split(const unsigned char* p) {
  static_assert(kPartA == kPartB && kPartA % 8 == 0 && kPartC % 8 == 0 && kPartC <= kPartA);
  const SplitTables& t = split_tables();
  uint32_t r[3];
  crc32c_three_parts(p, kPartA, kPartC, r);
  return t.past_bc(r[0]) ^ t.past_c(r[1]) ^ r[2];
}

#endif

}  // namespace

void crc32c_blocks(const void* data, size_t block_size, size_t num_blocks, uint32_t* out) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (crc32c_hardware()) {
    size_t i = 0;
    for (; i + 4 <= num_blocks; i += 4) crc_four(p + i * block_size, block_size, out + i);
    for (; i < num_blocks; ++i) {
      out[i] = block_size == kSplitBlock ? crc_split(p + i * block_size)
                                         : crc32c(p + i * block_size, block_size);
    }
    return;
  }
#endif
  for (size_t i = 0; i < num_blocks; ++i) out[i] = crc32c(p + i * block_size, block_size);
}

}  // namespace mammoth::memory::io
