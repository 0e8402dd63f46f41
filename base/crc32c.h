// CRC-32C (Castagnoli), used for checkpoint manifests and TensorBoard's TFRecord framing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mammoth {

// CRC-32C of `n` bytes, continuing from `crc` (0 to start).
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);
// TFRecord's masked form: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c_masked(uint32_t crc);
// CRC-32C of a whole file, streamed; throws mammoth::Error naming the file on I/O errors.
uint32_t crc32c_file(const std::string& path);

}  // namespace mammoth
