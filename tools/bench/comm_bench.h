// `mammoth bench comm`: bus bandwidth of Mammoth's collectives next to the raw MPI calls on the
// same buffers in the same run.
//
// For each size from 4 KiB to 256 MiB (powers of 4) it times all_reduce, reduce_scatter and
// all_gather through parallel::MpiCommunicator (blocking form: post + polled wait with the
// deadline) and the blocking MPI_Allreduce / MPI_Reduce_scatter_block / MPI_Allgather, in
// alternating rounds, keeping each side's best round. Bandwidths are nccl-tests' "bus
// bandwidth" (size = the largest buffer of the operation, n = ranks):
//   all_reduce       busbw = 2(n-1)/n * size / time
//   reduce_scatter   busbw =  (n-1)/n * size / time   (size = the full input, n shards)
//   all_gather       busbw =  (n-1)/n * size / time   (size = the full output)
//   all_to_all       busbw =  (n-1)/n * size / time   (size = the whole buffer)
// Run it under mpirun with >= 2 ranks:
//   mpirun -np 2 mammoth bench comm [--json FILE] [--min-bytes 4096] [--max-bytes 268435456]
//       [--ops all_reduce,reduce_scatter,all_gather] [--rounds 15] [--batch-ms 20] [--spin-polls
//       200]
//       [--comm-timeout 600]
// --json FILE (rank 0) writes a JSON array, one object per row:
//   {"name": "all_reduce_f32_np2", "shape": "4194304 B", "threads": 1, "ours": 3.9,
//    "anchor": 4.0, "unit": "GB/s", "ratio": 0.98}
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mammoth::tools {

struct CommBenchOptions {
  std::string json_path;                   // empty: no JSON
  int64_t min_bytes = 4096;                // first size
  int64_t max_bytes = int64_t{256} << 20;  // last size (inclusive)
  std::vector<std::string> ops = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all"};
  int rounds = 15;         // alternating ours/raw rounds per size
  double batch_ms = 20;    // target length of one timed batch
  int spin_polls = 200;    // CommOptions::spin_polls (yield every N polls)
  double timeout_s = 600;  // our communicator's deadline (--comm-timeout)
};

// Runs the benchmark; prints the table on rank 0. Returns a process exit code.
int run_comm_bench(const CommBenchOptions& options);

// The same from command-line words (what follows `mammoth bench comm`), e.g.
// {"--json", "out.json", "--max-bytes", "16777216"}. Throws mammoth::Error naming a bad option.
int run_comm_bench(const std::vector<std::string>& args);

}  // namespace mammoth::tools
