// `mammoth bench io`: the NVMe tier's engine (memory/io) beside fio on the same directory in
// the same run.
//
// Three shapes, each ours then fio's (Debian's fio with ioengine=io_uring, direct=1, run as a
// child process with --output-format=json and parsed here):
//   seq_write_1MiB_qd32   sequential write of --size bytes in 1 MiB blocks, 32 in flight, GB/s
//   seq_read_1MiB_qd32    sequential read of the same file, GB/s
//   rand_read_4KiB_qd32   uniformly random 4 KiB reads over the file for --seconds, IOPS
// Ours runs the way the chunk manager will: checksums on (CRC-32C per 4 KiB computed on write,
// verified on read), buffers registered with the ring, files preallocated by SwapDir. Each file
// lives in the SwapDir's private subdirectory and is removed at the end.
//
//   mammoth bench io [--dir DIR] [--size 1G] [--seconds 5] [--queue-depth 32] [--rounds 1]
//       [--stat median|best] [--engine auto|io_uring|threads] [--no-checksums] [--fio PATH|none]
//       [--json FILE] [--only ROWS] [--batch-resubmit] [--verbose]
// --dir defaults to $TMPDIR, else /var/tmp (O_DIRECT needs a disk filesystem, not tmpfs).
// --rounds N alternates ours and fio N times per shape; each side's row value is the median of
// its rounds (--stat best: the best). --only seq_write,rand_read runs those rows (the file is
// still written first, untimed, for the reads). --verbose prints every round (and mean latency
// of the random reads); --batch-resubmit turns off the engine's eager resubmission (A/B).
// After the table: each side's CPU time in percent of one core while it ran.
// --json FILE writes a JSON array, one object per row:
//   {"name": "seq_read_1MiB_qd32", "shape": "1073741824 B", "threads": 1, "ours": 1.21,
//    "anchor": 1.25, "unit": "GB/s", "ratio": 0.97}
#pragma once

#include <string>
#include <vector>

namespace mammoth::tools {

// Runs the benchmark from command-line words (what follows `mammoth bench io`). Prints the
// table; returns a process exit code. Throws mammoth::Error naming a bad option.
int run_io_bench(const std::vector<std::string>& args);

}  // namespace mammoth::tools
