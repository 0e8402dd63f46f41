// `mammoth bench moe`: the grouped GEMM over expert batches (kernels/cpu sgemm_grouped, what
// engine::grouped_matmul runs) against a loop of one sgemm per expert on the same batches; and
// the whole MoE layer's step (forward + backward) against a dense MLP of equal active FLOPs.
#pragma once

#include <string>
#include <vector>

namespace mammoth::tools {

int run_moe_bench(const std::vector<std::string>& args);

}  // namespace mammoth::tools
