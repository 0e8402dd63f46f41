// `mammoth bench gemm`: Mammoth's sgemm / gemm_bf16 beside OpenBLAS sgemm (the core matching
// the CPU, SkylakeX with AVX-512, Haswell with AVX2; OPENBLAS_CORETYPE is set and the process
// re-executed when unset) on GPT-2 small training
// shapes and 2048^3, 1 thread and all threads. Flags: [--json FILE] [--reps N] [--quick]
// [--filter NAME] [--threads N] [--isa avx512|avx2|portable].
#pragma once

#include <string>
#include <vector>

namespace mammoth::tools {

int run_gemm_bench(const std::vector<std::string>& args);

}  // namespace mammoth::tools
