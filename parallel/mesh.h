// DeviceMesh: the world of ranks factored into named parallel axes, with a group per axis.
//
// Mammoth's four axes are dp (data parallel, incl. ZeRO sharding), pp (pipeline stages), tp
// (tensor parallel) and sp (sequence parallel); any of them may be 1, and their product is the
// world size. An order string such as "tp-sp-dp-pp" (the default, as Megatron's RankGenerator)
// lists the axes from the fastest-varying to the slowest, which decides which ranks are
// neighbours: tp first puts a tensor-parallel group on consecutive ranks, i.e. on one node,
// where its per-layer all-reduces have the fastest links.
//
// Rank arithmetic. Let the order be a0-a1-a2-a3 (a0 fastest) with sizes s0..s3 and this rank's
// coordinates c0..c3 (0 <= ck < sk). Ranks are numbered in mixed radix, a0 the least
// significant digit:
//     rank = c0 + s0*c1 + s0*s1*c2 + s0*s1*s2*c3 = sum_k ck * stride_k,  stride_k = prod_{j<k} sj
// so ck = (rank / stride_k) % sk. The group of axis ak is every rank whose other coordinates
// equal this rank's: { rank - ck*stride_k + i*stride_k : 0 <= i < sk }, and a rank's position
// in it is ck. Each group is made by splitting the world with
//     color = rank - ck*stride_k   (the rank with ck set to 0: equal exactly within a group)
//     key   = ck                   (orders the group by coordinate)
// Example, world 4, dp=2 tp=2, order tp-sp-dp-pp: strides tp 1, sp 2, dp 2, pp 4;
// rank 3 = (tp 1, dp 1); tp groups {0,1} {2,3}; dp groups {0,2} {1,3}.
//
// The mesh is given to DP/ZeRO/TP/PP code explicitly (no global process groups):
//
//   auto mesh = parallel::DeviceMesh(parallel::mpi_world(), {.dp = 2, .tp = 2});
//   mesh.group(parallel::Axis::kDp).all_reduce(grads, parallel::ReduceOp::kAvg);
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "base/device.h"
#include "parallel/comm/communicator.h"
#include "parallel/comm/mpi_communicator.h"

namespace mammoth::parallel {

enum class Axis { kDp = 0, kPp = 1, kTp = 2, kSp = 3 };
inline constexpr int kNumAxes = 4;
inline constexpr Axis kAllAxes[kNumAxes] = {Axis::kDp, Axis::kPp, Axis::kTp, Axis::kSp};

const char* axis_name(Axis axis);  // "dp", "pp", "tp", "sp"
// Parses "dp" / "pp" / "tp" / "sp"; throws naming the bad value.
Axis axis_from_name(const std::string& name);

// Sizes of the axes; every one defaults to 1.
struct MeshShape {
  int dp = 1;
  int pp = 1;
  int tp = 1;
  int sp = 1;
  int size(Axis axis) const;
  int product() const { return dp * pp * tp * sp; }
  std::string str() const;  // "dp=2 pp=1 tp=2 sp=1"
};

struct MeshOptions {
  // Fastest-varying axis first. Axes left out must have size 1 (they are appended, slowest).
  std::string order = "tp-sp-dp-pp";
  // Settings of every group's communicator (the timeout is `--comm-timeout`).
  CommOptions comm;
  // Where the tensors that cross the groups live: the CPU (MPI groups), or a CUDA device (NCCL
  // groups, bootstrapped over the MPI groups; needs a CUDA build).
  Device device = Device::cpu();
};

// This process's place in the job. Open MPI's mpirun: from its environment
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_SIZE) without initialising
// MPI. Any other launcher (its variables: PMI_*, PMIX_RANK, SLURM_*, MV2_*, FLUX_JOB_SIZE), or
// MPI already running: MPI is initialised and says; when those variables show several
// processes but MPI joined this one into a world of 1 (a launcher of another MPI), this throws
// naming the variable, since each process would otherwise train alone. Else a single process
// (0, 0, 1) and MPI is not started.
struct ProcessInfo {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
};
ProcessInfo process_info();

// The pure rank arithmetic of a mesh (no communication), usable before MPI starts (e.g. by
// the planner) and tested on its own.
class MeshLayout {
 public:
  // Throws naming the axis sizes when their product differs from world_size, and naming the
  // order when it is malformed.
  MeshLayout(const MeshShape& shape, const std::string& order, int world_size);

  const MeshShape& shape() const { return shape_; }
  std::string order() const;  // normalised, all four axes: "tp-sp-dp-pp"
  int world_size() const { return world_size_; }
  int stride(Axis axis) const { return stride_[static_cast<int>(axis)]; }
  int coord(int rank, Axis axis) const;
  std::array<int, kNumAxes> coords(int rank) const;  // indexed by Axis
  int rank_of(const std::array<int, kNumAxes>& coords) const;
  // World ranks of `rank`'s group along `axis`, ordered by coordinate.
  std::vector<int> group_ranks(int rank, Axis axis) const;

 private:
  MeshShape shape_;
  std::array<Axis, kNumAxes> order_;  // fastest first
  std::array<int, kNumAxes> stride_;  // indexed by Axis
  int world_size_;
};

class DeviceMesh {
 public:
  // Collective over `world`: every rank constructs its mesh with the same shape and order.
  DeviceMesh(std::shared_ptr<MpiCommunicator> world, const MeshShape& shape,
             const MeshOptions& options = {});

  const MeshLayout& layout() const { return layout_; }
  const MeshShape& shape() const { return layout_.shape(); }
  int size(Axis axis) const { return layout_.shape().size(axis); }
  int coord(Axis axis) const { return layout_.coord(rank_, axis); }
  int rank() const { return rank_; }  // world rank
  int world_size() const { return layout_.world_size(); }
  int local_rank() const { return local_rank_; }  // rank among the processes of this host
  const Device& device() const { return device_; }

  // This rank's group along `axis`, on the mesh's device (NCCL for CUDA, else MPI).
  Communicator& group(Axis axis) const;
  // The same group over MPI, for CPU tensors and control traffic (e.g. a found-inf flag).
  MpiCommunicator& cpu_group(Axis axis) const;
  Communicator& world() const { return *world_; }
  MpiCommunicator& cpu_world() const { return *world_; }

  // "rank 3: dp 1/2 pp 0/1 tp 1/2 sp 0/1" for logs.
  std::string describe() const;

 private:
  std::shared_ptr<MpiCommunicator> world_;
  MeshLayout layout_;
  int rank_;
  int local_rank_;
  Device device_;
  std::array<std::unique_ptr<MpiCommunicator>, kNumAxes> cpu_groups_;
  std::array<std::unique_ptr<Communicator>, kNumAxes> device_groups_;  // null on the CPU
};

}  // namespace mammoth::parallel
