// Philox 4x32-10 counter-based RNG (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
//
// Stateless: the 128-bit output for (key = seed, counter) is a pure function, so every
// backend (CPU threads, CUDA blocks) produces identical random streams for dropout and
// initialisation without sharing state. Usable from CUDA device code.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MAMMOTH_HD __host__ __device__
#else
#define MAMMOTH_HD
#endif

namespace mammoth {

struct PhiloxOut {
  uint32_t v[4];
};

MAMMOTH_HD inline void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// counter: 128 bits as (low 64, high 64); key: 64-bit seed.
MAMMOTH_HD inline PhiloxOut philox4x32(uint64_t counter_lo, uint64_t counter_hi, uint64_t seed) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, &hi0, &lo0);
    philox_mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// Uniform float in [0, 1) from 24 random bits.
MAMMOTH_HD inline float philox_uniform(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

// Element i of the stream (seed, offset): counter offset + i/4, lane i%4.
MAMMOTH_HD inline uint32_t philox_element(uint64_t seed, uint64_t offset, uint64_t i) {
  return philox4x32(offset + i / 4, 0, seed).v[i % 4];
}

}  // namespace mammoth
