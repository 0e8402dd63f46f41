// Calibration: a cluster description of this machine, measured, for planning CPU runs here
// (`mammoth plan --calibrate`, `mammoth train --plan auto`, `mammoth bench plan`).
//
// One rank is `threads_per_rank` CPU threads, so devices_per_node = cores / threads_per_rank and
// nodes = 1. What is measured (the whole under ~20 s, --quick ~5 s), by cluster key:
//   peak_tflops: a register-only FMA loop on one core (ymm; zmm where AVX-512 runs) x threads.
//   gemm_time_model: the engine's sgemm (kernels/cpu) at transformer block GEMMs (64-1024
//     tokens x linear layers of width 16-256: forward NN, input-gradient NT, weight-gradient
//     TN), fitted by relative least squares as time = 2MNK (a + b / K + c / min(M, N)) + call.
//     matmul_efficiency: the largest GEMM's rate / peak; gemm_call_us: the fitted call.
//   device_memory_GBps: a chain of engine ops (mul_scalar) through autograd, forward and
//     backward, on tensors of 1 to 2048 x 128 floats: the bandwidth from the two largest
//     (activation-sized tensors, mostly in cache); the chain's per-call cost from one row.
//   op_overhead_us, in_step_compute_factor: whole training steps of a GPT-2 at 1 and 5 blocks,
//     d_model 64 (mostly engine ops) and 256 (mostly GEMMs and attention), timed in alternating
//     pairs: the per-op cost (at least the chain's; a block's ops cost more: views, norms,
//     allocations) and the factor on the GEMM fit and attention rates (in [1, 3]; a kernel
//     between a step's other ops is slower than in its own loop) that make the time model's
//     difference between the depths the measured one at both widths.
//   attention_GFLOPs_by_head_dim: engine::attention forward + backward (causal, fused), 64
//     tokens, head sizes 16-64.
//   host_memory_GBps: a copy of 64 MiB (past the caches).
//   pcie: the chunk manager paging between its emulated device and host memory (CPU backend):
//     64 MiB of chunks cycled through device slots for a quarter of them with work between
//     two acquires (as kernels run between them; its own time taken off), each acquire a load
//     and a write-back, at 64 KiB and 1 MiB chunks, read as time per move = latency + bytes /
//     bandwidth.
//   links: MPI_Allreduce between two local ranks, 8 B - 4 MiB, read as the ring formula the
//     time model uses (2 ranks: bytes / bandwidth + 2 latency): latency from 8 B, bandwidth
//     from the two largest sizes. intra_node and inter_node get it (one node). It runs `mpirun -np
//     2` on this binary unless this process already has a world of >= 2 ranks (then every rank must
//     call this).
//   nvme: a file written with fsync and read back after dropping it from the page cache.
//   overlaps_communication: false with one thread per rank (MPI progresses only inside MPI
//     calls, so no collective runs behind compute); not measured.
// Compute figures keep the best of several rounds (a neighbour on a shared machine only slows
// them); communication keeps the median (see calibrate_comm). The file says what was measured
// in "calibration", with the raw points.
#pragma once

#include <string>

#include "base/json.h"
#include "plan/cluster.h"

namespace mammoth::plan {

struct CalibrateOptions {
  bool quick = false;        // fewer shapes and repetitions (~5 s)
  int threads_per_rank = 1;  // CPU threads one rank runs (train --threads)
  // How to start two ranks of this binary for the communication figures ("" or "none": skip,
  // leaving a shared-memory copy's rate and latency).
  std::string mpirun = "mpirun --oversubscribe --allow-run-as-root";
  std::string scratch_dir;  // for the NVMe figure and the MPI child's output ("": $TMPDIR)
  bool verbose = true;      // print each figure to stderr as it is measured
};

// Measures this machine; see the header comment. Sets the calling thread pool's size to
// threads_per_rank while it measures and restores it after.
Cluster calibrate_this_machine(const CalibrateOptions& options = {});

// This core's fp32 FMA rate per second of the thread's own CPU time (FLOP/s), best of `rounds`
// register-only loops: how fast the core computes while it runs, whatever else shares it.
// `bench plan` compares it before each measured plan with its value at calibration, to tell a
// core that has slowed down (frequency, a busy sibling thread) from a wrong prediction.
double core_speed_probe(int rounds = 3);
// This machine's memory bandwidth: a 64 MiB memcpy (past the caches), read + write bytes per
// second, best of `rounds`; calibration's host_memory_GBps. `bench plan` reads it beside
// core_speed_probe: a VM whose memory system is slowed by a neighbour keeps its FMA rate.
double memory_speed_probe(int rounds = 3);

// The communication measurement, run on every rank of an MPI world of >= 2 ranks: MPI_Allreduce
// times per size, fitted. Returns {"GBps", "latency_us", "points": [[bytes, seconds]...]}.
json::Value calibrate_comm(bool quick);

}  // namespace mammoth::plan
