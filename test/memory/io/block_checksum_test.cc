// memory/io/block_checksum.h must give exactly base/crc32c.h's values, block by block.
#include "memory/io/block_checksum.h"

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

}  // namespace
}  // namespace mammoth::memory::io
