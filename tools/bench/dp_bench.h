// `mpirun -np N mammoth bench dp`: data-parallel scaling and the cost of its communication.
// Each of N ranks trains its own batch with 1 thread under DataParallel (bucketed reductions
// during backward). Two rows, each with its anchor measured in the same job:
//   scaling  N ranks' tokens/s against N times one rank's alone (1 thread, the same per-rank
//            batch, no data parallelism; the other ranks sleep meanwhile): weak scaling, not
//            threading, so 1.0 is perfect;
//   nocomm   against the same step on the same N ranks with communication skipped (each rank's
//            DataParallel over a group of itself): what the reductions cost once overlapped
//            with backward (exact for ZeRO 0; under ZeRO >= 1 a group of one does not shard).
// Flags: [--model gpt2-tiny] [--micro-batch 8] [--seq-len 64] [--steps 10] [--zero 0]
// [--bucket-mb 25] [--json FILE].
#pragma once

#include <string>
#include <vector>

namespace mammoth::tools {

int run_dp_bench(const std::vector<std::string>& args);

}  // namespace mammoth::tools
