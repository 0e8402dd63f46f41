// CRC-32C (Castagnoli): checkpoint manifests, TensorBoard's TFRecord framing, and (through
// memory/io/block_checksum.h) the NVMe tier's per-block checksums.
//
// On x86-64 with SSE4.2 the hardware crc32 instruction computes it, long inputs as three
// interleaved streams joined with Crc32cShift (the instruction's latency is three times its
// throughput); elsewhere a slicing-by-8 table loop. Both give the same values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mammoth {

// CRC-32C of `n` bytes, continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// The table loop alone (tests compare the two paths).
uint32_t crc32c_portable(const void* data, size_t n, uint32_t crc = 0);
// Whether crc32c() uses the hardware instruction on this machine.
bool crc32c_hardware();
// TFRecord's masked form: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c_masked(uint32_t crc);
// CRC-32C of a whole file, streamed; throws mammoth::Error naming the file on I/O errors.
uint32_t crc32c_file(const std::string& path);

// The finished CRC-32Cs of three adjacent parts: A = data[0, ab), B = data[ab, 2 ab) and
// C = data[2 ab, 2 ab + c), with c <= ab and both multiples of 8. On the hardware path they run
// as three interleaved streams, at the instruction's throughput rather than its latency; join
// them with Crc32cShift: crc32c(A || B || C) == Crc32cShift(ab + c)(out[0]) ^
// Crc32cShift(c)(out[1]) ^ out[2].
void crc32c_three_parts(const void* data, size_t ab, size_t c, uint32_t out[3]);

// Joining CRCs computed separately (zlib's crc32_combine): for any A and any B of n bytes,
//   crc32c(A || B) == Crc32cShift(n)(crc32c(A)) ^ crc32c(B).
// Multiplying a finished CRC by x^(8 n) modulo the polynomial is linear in it, so it is four
// byte-indexed table lookups; building the tables costs ~1 ms, so keep them for a fixed n.
class Crc32cShift {
 public:
  explicit Crc32cShift(size_t n);
  uint32_t operator()(uint32_t crc) const {
    return table_[0][crc & 0xff] ^ table_[1][(crc >> 8) & 0xff] ^ table_[2][(crc >> 16) & 0xff] ^
           table_[3][crc >> 24];
  }

 private:
  uint32_t table_[4][256];
};

}  // namespace mammoth
