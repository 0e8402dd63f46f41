// The fp32 FMA peak of one core, as the benches and the planner's calibration measure it:
// 12 independent FMA chains (enough to cover latency x pipes) in 256-bit or 512-bit registers,
// in inline asm so no -m flag is needed. The caller times run_fma_chains with its own clock.
#pragma once

#include <cstdint>

namespace mammoth::kernels::cpu {

inline constexpr int kFmaChains = 12;

// Runs kFmaChains FMAs per iteration on zmm (AVX-512; the caller checks the CPU has it) or ymm
// registers.
void run_fma_chains(bool zmm, int64_t iterations);

// FLOPs run_fma_chains(zmm, iterations) performs (2 per lane per FMA).
inline double fma_chain_flops(bool zmm, int64_t iterations) {
  return 2.0 * (zmm ? 16 : 8) * kFmaChains * static_cast<double>(iterations);
}

}  // namespace mammoth::kernels::cpu
