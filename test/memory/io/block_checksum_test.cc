// memory/io/block_checksum.h must give exactly base/crc32c.h's values, block by block.
#include "memory/io/block_checksum.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <random>
#include <vector>

#include "base/crc32c.h"

namespace mammoth::memory::io {
namespace {

TEST_CASE("crc32c_blocks equals crc32c of each block", "[io]") {
  std::mt19937 rng(42);
  std::vector<unsigned char> data(13 * 4096 + 64);
  for (auto& c : data) c = static_cast<unsigned char>(rng());
  // Block sizes with and without a whole number of 8-byte words; counts around the 4-way split.
  for (size_t block : {size_t{4096}, size_t{512}, size_t{100}, size_t{7}}) {
    for (size_t n = 0; n <= 13 && n * block <= data.size(); ++n) {
      for (size_t shift : {size_t{0}, size_t{3}}) {  // unaligned start too
        CAPTURE(block, n, shift);
        std::vector<uint32_t> got(n + 1, 0xdeadbeef);
        crc32c_blocks(data.data() + shift, block, n, got.data());
        for (size_t i = 0; i < n; ++i)
          REQUIRE(got[i] == crc32c(data.data() + shift + i * block, block));
        REQUIRE(got[n] == 0xdeadbeef);  // nothing written past the last block
      }
    }
  }
  // The standard check value: CRC-32C("123456789") = 0xE3069283.
  uint32_t check = 0;
  crc32c_blocks("123456789", 9, 1, &check);
  CHECK(check == 0xE3069283u);
}

// One 4 KiB block on its own takes the three-stream path and its combine step: patterns that
// catch a wrong split point or shift (a single bit in each third, and at the thirds' seams).
TEST_CASE("crc32c_blocks of single 4 KiB blocks with sparse bits", "[io]") {
  std::vector<unsigned char> block(4096, 0);
  uint32_t got = 0;
  crc32c_blocks(block.data(), 4096, 1, &got);
  CHECK(got == crc32c(block.data(), 4096));
  for (size_t bit : {size_t{0}, size_t{7}, size_t{1367 * 8 + 7}, size_t{1368 * 8},
                     size_t{2735 * 8 + 7}, size_t{2736 * 8}, size_t{4095 * 8 + 7}}) {
    CAPTURE(bit);
    std::fill(block.begin(), block.end(), 0xff);
    block[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    crc32c_blocks(block.data(), 4096, 1, &got);
    REQUIRE(got == crc32c(block.data(), 4096));
    std::fill(block.begin(), block.end(), 0);
    block[bit / 8] = static_cast<unsigned char>(1u << (bit % 8));
    crc32c_blocks(block.data(), 4096, 1, &got);
    REQUIRE(got == crc32c(block.data(), 4096));
  }
}

}  // namespace
}  // namespace mammoth::memory::io
