// The ISA-matched PyTorch anchor: when our kernels run AVX2 on a CPU that has AVX-512 (forced by
// MAMMOTH_ISA or --isa), the PyTorch anchor subprocess is capped at AVX2 too, so one machine
// measures the AVX2 path of both sides. oneDNN, ATen's dispatched kernels and MKL each read
// their own variable; all three are set.
#pragma once

#include "kernels/cpu/simd.h"

namespace mammoth::tools {

// A shell command prefix that caps PyTorch (oneDNN, ATen, MKL) at AVX2.
inline constexpr const char* kAnchorAvx2Env =
    "ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 "
    "MKL_ENABLE_INSTRUCTIONS=AVX2 ";

// Whether the anchor should be capped: our fused kernels run AVX2 where AVX-512 is available.
inline bool anchor_capped_at_avx2() {
  namespace kc = kernels::cpu;
  return kc::active_simd_isa() == kc::SimdIsa::kAvx2 &&
         kc::simd_isa_supported(kc::SimdIsa::kAvx512);
}

}  // namespace mammoth::tools
