// `mammoth bench kernels`: the CPU backend's non-GEMM kernels beside their anchors measured in
// the same run: memory-bound kernels (AdamW, softmax family, layer/rms norm, cross-entropy,
// GELU, SiLU) in GB/s against a STREAM-style triad, attention forward+backward in GFLOP/s against
// the GEMM-bound time (the same matmuls as whole sgemm calls). 1 thread and all threads.
// Flags: [--json FILE] [--reps N] [--quick] [--filter NAME] [--threads N]
//        [--isa avx512|avx2|portable]. GEMM itself: `mammoth bench gemm`.
#pragma once

#include <string>
#include <vector>

namespace mammoth::tools {

int run_kernels_bench(const std::vector<std::string>& args);

}  // namespace mammoth::tools
