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

__attribute__((target("sse4.2"))) uint32_t crc_one(const unsigned char* p, size_t n) {
  uint64_t c = 0xffffffffu;
  const size_t words = n / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    c = _mm_crc32_u64(c, w);
  }
  return ~crc_tail(static_cast<uint32_t>(c), p + words * 8, n - words * 8);
}

bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}

#else

bool have_sse42() { return false; }

#endif

}  // namespace

bool crc32c_blocks_hardware() { return have_sse42(); }

void crc32c_blocks(const void* data, size_t block_size, size_t num_blocks, uint32_t* out) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (have_sse42()) {
    size_t i = 0;
    for (; i + 4 <= num_blocks; i += 4) crc_four(p + i * block_size, block_size, out + i);
    for (; i < num_blocks; ++i) out[i] = crc_one(p + i * block_size, block_size);
    return;
  }
#endif
  for (size_t i = 0; i < num_blocks; ++i) out[i] = crc32c(p + i * block_size, block_size);
}

}  // namespace mammoth::memory::io
