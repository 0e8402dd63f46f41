// `mpirun -np N mammoth bench dp`: data-parallel scaling. Tokens/s of N ranks x 1 thread
// training with DataParallel (bucketed reductions during backward) beside the anchor measured
// in the same job: one process with N threads on the same global batch (the other ranks sleep
// meanwhile). Flags: [--model gpt2-tiny] [--micro-batch 8] [--seq-len 64] [--steps 10]
// [--zero 0] [--bucket-mb 25] [--json FILE].
#pragma once

#include <string>
#include <vector>

namespace mammoth::tools {

int run_dp_bench(const std::vector<std::string>& args);

}  // namespace mammoth::tools
