// Per-block CRC-32C for the NVMe tier: one checksum per 4 KiB block, fast enough to sit on the
// I/O path.
//
// The values are exactly base/crc32c.h's crc32c(block, block_size) (the test compares them).
// base's table-driven version runs at ~0.7 GB/s here, slower than the disk (~2 GB/s), so on
// x86-64 with SSE4.2 this uses the crc32 instruction over four blocks at once: each block is an
// independent CRC, so four dependency chains hide the instruction's 3-cycle latency without the
// polynomial "combine" step a single long stream would need. What is left over (one to three
// 4 KiB blocks: a random read's verification is one) runs as three streams over thirds of the
// block, combined with two table-driven multiplications by powers of x.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mammoth::memory::io {

// out[i] = crc32c of bytes [i * block_size, (i + 1) * block_size) of `data`, for i < num_blocks.
void crc32c_blocks(const void* data, size_t block_size, size_t num_blocks, uint32_t* out);

// crc32c_blocks uses the hardware instruction exactly when base's crc32c_hardware() says so.

}  // namespace mammoth::memory::io
