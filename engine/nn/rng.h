// The process's dropout random stream: (seed, offset) for Philox, advanced by every dropout
// call in program order. An explicit singleton: training sets the seed, checkpoints save and
// restore the offset, so a resumed run draws exactly the masks the original run would have.
#pragma once

#include <cstdint>

namespace mammoth::engine::nn {

struct RngState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // in Philox counters (4 values each)
};

RngState& rng_state();
// Reserves counters for n values and returns the offset to use.
uint64_t rng_reserve(int64_t n);

}  // namespace mammoth::engine::nn
