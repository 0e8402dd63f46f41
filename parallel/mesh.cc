// DeviceMesh: rank arithmetic (derived in mesh.h) and the construction of the axis groups.
#include "parallel/mesh.h"

#include <cstdlib>
#include <sstream>

#include "base/error.h"

#ifdef MAMMOTH_WITH_NCCL
#include "parallel/comm/nccl_communicator.h"
#endif

namespace mammoth::parallel {
namespace {

// Reads a non-negative integer environment variable; -1 when absent. Throws when malformed.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  MAMMOTH_CHECK(*end == '\0' && x >= 0 && x < (1L << 30))
      << "[process_info] environment variable " << name << "='" << v
      << "' is not a non-negative integer";
  return static_cast<int>(x);
}

int checked_world_size(const MpiCommunicator* world) {
  MAMMOTH_CHECK(world != nullptr) << "[DeviceMesh] no world communicator";
  return world->size();
}

}  // namespace

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::kDp:
      return "dp";
    case Axis::kPp:
      return "pp";
    case Axis::kTp:
      return "tp";
    case Axis::kSp:
      return "sp";
  }
  return "?";
}

Axis axis_from_name(const std::string& name) {
  for (Axis a : kAllAxes) {
    if (name == axis_name(a)) return a;
  }
  MAMMOTH_THROW() << "[axis_from_name] unknown mesh axis '" << name
                  << "' (expected dp, pp, tp or sp)";
}

int MeshShape::size(Axis axis) const {
  switch (axis) {
    case Axis::kDp:
      return dp;
    case Axis::kPp:
      return pp;
    case Axis::kTp:
      return tp;
    case Axis::kSp:
      return sp;
  }
  return 1;
}

std::string MeshShape::str() const {
  std::ostringstream s;
  s << "dp=" << dp << " pp=" << pp << " tp=" << tp << " sp=" << sp;
  return s.str();
}

namespace {

// What launchers other than Open MPI's mpirun leave in each process's environment. A size
// above 1, or a rank above 0, shows that several processes were started.
struct LauncherVar {
  const char* name;
  bool is_size;  // else a rank
  const char* launcher;
};
constexpr LauncherVar kLauncherVars[] = {
    {"PMI_SIZE", true, "a PMI launcher (MPICH / Intel MPI mpiexec, hydra)"},
    {"PMI_RANK", false, "a PMI launcher (MPICH / Intel MPI mpiexec, hydra)"},
    {"PMIX_RANK", false, "a PMIx launcher (prterun, srun --mpi=pmix)"},
    {"SLURM_STEP_NUM_TASKS", true, "Slurm (srun)"},
    {"SLURM_NTASKS", true, "Slurm"},
    {"SLURM_PROCID", false, "Slurm (srun)"},
    {"MV2_COMM_WORLD_SIZE", true, "MVAPICH"},
    {"MPI_LOCALNRANKS", true, "MPICH's hydra"},
    {"FLUX_JOB_SIZE", true, "Flux"},
};

// The first variable that shows several processes, as "NAME=VALUE, set by LAUNCHER"; empty if
// none.
std::string several_processes_evidence() {
  for (const LauncherVar& v : kLauncherVars) {
    const char* text = std::getenv(v.name);
    if (text == nullptr || *text == '\0') continue;
    const int x = env_int(v.name);
    if (v.is_size ? x > 1 : x > 0) {
      return std::string(v.name) + "=" + text + ", set by " + v.launcher;
    }
  }
  return "";
}

bool launcher_present() {
  for (const LauncherVar& v : kLauncherVars) {
    const char* text = std::getenv(v.name);
    if (text != nullptr && *text != '\0') return true;
  }
  return false;
}

}  // namespace

ProcessInfo process_info() {
  ProcessInfo info;
  // Open MPI's mpirun: its environment says everything without starting MPI.
  const int rank = env_int("OMPI_COMM_WORLD_RANK");
  const int size = env_int("OMPI_COMM_WORLD_SIZE");
  const int local = env_int("OMPI_COMM_WORLD_LOCAL_RANK");
  if (rank >= 0 && size > 0) {
    MAMMOTH_CHECK(rank < size) << "[process_info] OMPI_COMM_WORLD_RANK=" << rank
                               << " is not below OMPI_COMM_WORLD_SIZE=" << size;
    info.rank = rank;
    info.world_size = size;
    info.local_rank = local >= 0 ? local : 0;
    return info;
  }
  // Any other launcher: MPI itself says how many processes it joined. MPI starts only when
  // MPI is running already or a launcher's variables are set, so a plain run stays MPI-free.
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized || (!initialized && !launcher_present())) return info;
  const MpiRuntime& rt = mpi_runtime();
  info.rank = rt.world_rank();
  info.world_size = rt.world_size();
  const std::string evidence = several_processes_evidence();
  MAMMOTH_CHECK(info.world_size > 1 || evidence.empty())
      << "[process_info] the environment shows several processes were started (" << evidence
      << ") but MPI joined this one into a world of 1: the launcher does not speak to the MPI "
         "this binary was built with (Open MPI). Launch with Open MPI's mpirun (or srun "
         "--mpi=pmix with a Slurm built for Open MPI); for one process in a batch allocation, "
         "unset that variable";
  // Processes sharing memory are this host's; this rank's place among them is its local rank.
  MPI_Comm node = MPI_COMM_NULL;
  mpi_check(
      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &node),
      "MPI_Comm_split_type");
  mpi_check(MPI_Comm_rank(node, &info.local_rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_free(&node), "MPI_Comm_free");
  return info;
}

// ---- layout ----

MeshLayout::MeshLayout(const MeshShape& shape, const std::string& order, int world_size)
    : shape_(shape), world_size_(world_size) {
  for (Axis a : kAllAxes) {
    MAMMOTH_CHECK(shape.size(a) >= 1)
        << "[DeviceMesh] axis " << axis_name(a) << " has size " << shape.size(a)
        << "; sizes must be >= 1 (" << shape.str() << ")";
  }
  MAMMOTH_CHECK(shape.product() == world_size)
      << "[DeviceMesh] the axis sizes " << shape.str() << " multiply to " << shape.product()
      << " but the world has " << world_size << " ranks; choose sizes whose product is "
      << world_size;

  // Parse "tp-sp-dp-pp": named axes fastest first, each at most once.
  std::array<bool, kNumAxes> seen{};
  int n = 0;
  std::stringstream ss(order);
  std::string item;
  while (std::getline(ss, item, '-')) {
    const Axis a = [&] {
      try {
        return axis_from_name(item);
      } catch (const Error&) {
        MAMMOTH_THROW() << "[DeviceMesh] order '" << order << "': unknown axis '" << item
                        << "' (axes are dp, pp, tp, sp, joined by '-', fastest first)";
      }
    }();
    MAMMOTH_CHECK(!seen[static_cast<int>(a)])
        << "[DeviceMesh] order '" << order << "' names " << item << " twice";
    seen[static_cast<int>(a)] = true;
    order_[n++] = a;
  }
  // Axes not named must be trivial; they go last (slowest), where size 1 changes nothing.
  for (Axis a : {Axis::kTp, Axis::kSp, Axis::kDp, Axis::kPp}) {
    if (seen[static_cast<int>(a)]) continue;
    MAMMOTH_CHECK(shape.size(a) == 1) << "[DeviceMesh] order '" << order << "' leaves out "
                                      << axis_name(a) << ", whose size is " << shape.size(a);
    order_[n++] = a;
  }
  int stride = 1;
  for (Axis a : order_) {
    stride_[static_cast<int>(a)] = stride;
    stride *= shape.size(a);
  }
}

std::string MeshLayout::order() const {
  std::string s;
  for (Axis a : order_) s += (s.empty() ? "" : "-") + std::string(axis_name(a));
  return s;
}

int MeshLayout::coord(int rank, Axis axis) const {
  MAMMOTH_CHECK(rank >= 0 && rank < world_size_)
      << "[DeviceMesh] rank " << rank << " outside the world of " << world_size_;
  return (rank / stride(axis)) % shape_.size(axis);
}

std::array<int, kNumAxes> MeshLayout::coords(int rank) const {
  std::array<int, kNumAxes> c{};
  for (Axis a : kAllAxes) c[static_cast<int>(a)] = coord(rank, a);
  return c;
}

int MeshLayout::rank_of(const std::array<int, kNumAxes>& coords) const {
  int rank = 0;
  for (Axis a : kAllAxes) {
    const int c = coords[static_cast<int>(a)];
    MAMMOTH_CHECK(c >= 0 && c < shape_.size(a)) << "[DeviceMesh] coordinate " << axis_name(a) << "="
                                                << c << " outside 0.." << shape_.size(a) - 1;
    rank += c * stride(a);
  }
  return rank;
}

std::vector<int> MeshLayout::group_ranks(int rank, Axis axis) const {
  const int base = rank - coord(rank, axis) * stride(axis);
  std::vector<int> ranks;
  for (int i = 0; i < shape_.size(axis); ++i) ranks.push_back(base + i * stride(axis));
  return ranks;
}

// ---- mesh ----

DeviceMesh::DeviceMesh(std::shared_ptr<MpiCommunicator> world, const MeshShape& shape,
                       const MeshOptions& options)
    : world_(std::move(world)),
      layout_(shape, options.order, checked_world_size(world_.get())),
      rank_(world_->rank()),
      local_rank_(process_info().local_rank),
      device_(options.device) {
#ifndef MAMMOTH_WITH_NCCL
  MAMMOTH_CHECK(device_.is_cpu()) << "[DeviceMesh] device " << device_
                                  << " needs the NCCL backend, which this build lacks "
                                     "(built without CUDA)";
#endif
  // Every rank creates the groups of all four axes in the same order (splits are collective).
  for (Axis a : kAllAxes) {
    const int i = static_cast<int>(a);
    const int c = layout_.coord(rank_, a);
    cpu_groups_[i] = world_->split_mpi(rank_ - c * layout_.stride(a), c, axis_name(a));
    MAMMOTH_CHECK(cpu_groups_[i] && cpu_groups_[i]->size() == layout_.shape().size(a) &&
                  cpu_groups_[i]->rank() == c)
        << "[DeviceMesh] group " << axis_name(a) << " came out with "
        << (cpu_groups_[i] ? cpu_groups_[i]->size() : 0) << " ranks, expected "
        << layout_.shape().size(a);
  }
#ifdef MAMMOTH_WITH_NCCL
  if (device_.is_cuda()) {
    for (Axis a : kAllAxes) {
      const int i = static_cast<int>(a);
      device_groups_[i] =
          std::make_unique<NcclCommunicator>(*cpu_groups_[i], device_.index, axis_name(a));
    }
  }
#endif
}

Communicator& DeviceMesh::group(Axis axis) const {
  const int i = static_cast<int>(axis);
  if (device_groups_[i]) return *device_groups_[i];
  return *cpu_groups_[i];
}

MpiCommunicator& DeviceMesh::cpu_group(Axis axis) const {
  return *cpu_groups_[static_cast<int>(axis)];
}

std::string DeviceMesh::describe() const {
  std::ostringstream s;
  s << "rank " << rank_ << ":";
  for (Axis a : kAllAxes) s << " " << axis_name(a) << " " << coord(a) << "/" << size(a);
  s << " (order " << layout_.order() << ", " << device_ << ")";
  return s.str();
}

}  // namespace mammoth::parallel
