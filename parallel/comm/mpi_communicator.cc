// MPI backend of Communicator: non-blocking MPI collectives completed by a polling wait with a
// deadline (see mpi_communicator.h).
#include "parallel/comm/mpi_communicator.h"

#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <utility>
#include <vector>

#include "base/error.h"
#include "parallel/comm/buffer_checks.h"
#include "parallel/comm/flight_recorder.h"

namespace mammoth::parallel {
namespace {

using engine::Tensor;

// ---- 16-bit float reductions (MPI has no bf16/f16; the data travels as MPI_UINT16_T) ----

template <typename T, float (*Load)(T), T (*Store)(float), bool kMax>
void reduce16(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = Load(a[i]), y = Load(b[i]);
    b[i] = Store(kMax ? (x > y ? x : y) : x + y);
  }
}

}  // namespace

// ---- runtime ----

void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
    std::snprintf(text, sizeof(text), "error code %d", rc);
  }
  MAMMOTH_THROW() << "[" << what << "] MPI error: " << text;
}

MpiRuntime::MpiRuntime() {
  int initialized = 0;
  mpi_check(MPI_Initialized(&initialized), "MPI_Initialized");
  if (initialized) {
    mpi_check(MPI_Query_thread(&thread_level_), "MPI_Query_thread");
  } else {
    // Open MPI's non-blocking all-reduce (libnbc) picks a binomial tree for fewer than 4 ranks:
    // reduce to rank 0, then send back, one direction at a time. The ring moves both halves at
    // once and measured 5x faster at 1 MiB with 2 ranks (bench comm), on par with the blocking
    // MPI_Allreduce. A value the user set in the environment wins (overwrite = 0).
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    mpi_check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &thread_level_),
              "MPI_Init_thread");
    initialized_here_ = true;
  }
  // Errors come back as return codes (checked and thrown), not MPI's default abort.
  mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &world_size_), "MPI_Comm_size");
  flight::set_world(world_rank_, world_size_);
  mpi_check(MPI_Op_create(&reduce16<bf16, bf16_to_float, float_to_bf16, false>, 1, &bf16_sum_),
            "MPI_Op_create");
  mpi_check(MPI_Op_create(&reduce16<bf16, bf16_to_float, float_to_bf16, true>, 1, &bf16_max_),
            "MPI_Op_create");
  mpi_check(MPI_Op_create(&reduce16<f16, f16_to_float, float_to_f16, false>, 1, &f16_sum_),
            "MPI_Op_create");
  mpi_check(MPI_Op_create(&reduce16<f16, f16_to_float, float_to_f16, true>, 1, &f16_max_),
            "MPI_Op_create");
}

MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Op* op : {&bf16_sum_, &bf16_max_, &f16_sum_, &f16_max_}) {
    if (*op != MPI_OP_NULL) MPI_Op_free(op);
  }
  if (initialized_here_) {
    const int rc = MPI_Finalize();
    if (rc != MPI_SUCCESS) std::fprintf(stderr, "[mpi_runtime] MPI_Finalize failed (%d)\n", rc);
  }
}

MpiRuntime& mpi_runtime() {
  // Constructed on first use; destroyed (finalizing MPI) after every object created later,
  // such as communicators held in other function-local statics.
  static MpiRuntime runtime;
  return runtime;
}

void abort_job_on_timeout(const std::string& message) {
  std::fprintf(stderr, "[comm] %s\n", message.c_str());
  const std::string dump = flight::write_dump(message);
  if (dump.empty()) {
    std::fprintf(stderr,
                 "[comm] flight recorder, this rank's last operations (set MAMMOTH_FLIGHT_DIR or "
                 "train --save-dir for every rank's dump):\n%s",
                 flight::tail_text(8).c_str());
  } else {
    std::fprintf(stderr,
                 "[comm] flight recorder: wrote %s; `mammoth flight %s` merges every rank's "
                 "dump and names the rank that fell behind\n",
                 dump.c_str(), std::filesystem::path(dump).parent_path().c_str());
  }
  std::fflush(stderr);
  std::fflush(stdout);
  // The other waiting ranks reach their own deadlines within moments; give them that long to
  // write their dumps before the abort takes them down.
  if (!dump.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  MPI_Abort(MPI_COMM_WORLD, kCommTimeoutExitCode);
  std::_Exit(kCommTimeoutExitCode);  // MPI_Abort does not return; this is in case it does
}

bool cores_oversubscribed() {
  static const int cores = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return 0;
    return CPU_COUNT(&set);
  }();
  if (cores <= 0) return false;
  // The fourth field is "running/total" scheduling entities, counted now (not averaged).
  const int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[128];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  double avg[3];
  int running = 0;
  if (std::sscanf(buf, "%lf %lf %lf %d/", &avg[0], &avg[1], &avg[2], &running) != 4) return false;
  return running > cores;
}

std::pair<int, int> running_world_rank() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return {-1, 0};
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return {rank, size};
}

void abort_job_if_distributed(int code) {
  if (running_world_rank().second <= 1) return;
  std::fflush(stderr);
  std::fflush(stdout);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

namespace {

struct MpiType {
  MPI_Datatype type;
  MPI_Op sum;
  MPI_Op max;
};

MpiType mpi_type(DType dtype) {
  const MpiRuntime& rt = mpi_runtime();
  switch (dtype) {
    case DType::kF32:
      return {MPI_FLOAT, MPI_SUM, MPI_MAX};
    case DType::kF64:
      return {MPI_DOUBLE, MPI_SUM, MPI_MAX};
    case DType::kBF16:
      return {MPI_UINT16_T, rt.bf16_sum(), rt.bf16_max()};
    case DType::kF16:
      return {MPI_UINT16_T, rt.f16_sum(), rt.f16_max()};
    case DType::kI32:
      return {MPI_INT32_T, MPI_SUM, MPI_MAX};
    case DType::kI64:
      return {MPI_INT64_T, MPI_SUM, MPI_MAX};
    case DType::kU8:
    case DType::kBool:
      return {MPI_UINT8_T, MPI_SUM, MPI_MAX};
  }
  MAMMOTH_THROW() << "[mpi_type] unknown dtype " << static_cast<int>(dtype);
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  const MpiType t = mpi_type(dtype);
  return op == ReduceOp::kMax ? t.max : t.sum;  // avg = sum, then divide on completion
}

int mpi_count(int64_t n, const char* op, const Communicator& comm) {
  MAMMOTH_CHECK(n <= INT_MAX) << detail::where(op, comm) << ": " << n
                              << " elements exceed MPI's int count (" << INT_MAX
                              << "); split the buffer";
  return static_cast<int>(n);
}

// What an operation is, kept cheap to record (no string is built unless a deadline passes):
// "all_reduce(sum, f32, 1024 elements)", "recv(from 1, f32, 8 elements)", "barrier()".
struct OpInfo {
  const char* op;
  const char* detail = "";  // "sum", "root ", "to ", "from " (+ value when value >= 0)
  int value = -1;
  bool has_tensor = false;
  DType dtype = DType::kF32;
  int64_t numel = 0;

  // Into buf (cut at n): no allocation, as the flight recorder formats every operation.
  void format(char* buf, size_t n) const {
    char value_text[16] = "";
    if (value >= 0) std::snprintf(value_text, sizeof(value_text), "%d", value);
    if (has_tensor) {
      std::snprintf(buf, n, "%s(%s%s%s%s, %lld elements)", op, detail, value_text,
                    *detail ? ", " : "", dtype_name(dtype), static_cast<long long>(numel));
    } else {
      std::snprintf(buf, n, "%s(%s%s)", op, detail, value_text);
    }
  }
  std::string str() const {
    char buf[160];
    format(buf, sizeof(buf));
    return buf;
  }
};

OpInfo op_info(const char* op, const char* detail, int value, const Tensor& t) {
  return OpInfo{op, detail, value, true, t.dtype(), t.numel()};
}

// One posted MPI request, the tensors it reads and writes (kept alive until it completes), and
// what to do once it has (avg's division, moving an in-place reduce_scatter shard).
class MpiWork final : public Work {
 public:
  MpiWork(const MpiCommunicator& comm, OpInfo info, std::vector<Tensor> keep_alive)
      : comm_(comm), info_(info), keep_alive_(std::move(keep_alive)) {
    const bool p2p = !std::strcmp(info.op, "send") || !std::strcmp(info.op, "recv");
    char what[96];
    info.format(what, sizeof(what));
    flight_ = flight::posted(
        comm.flight_group(), info.op, what, p2p ? info.value : -1,
        info.has_tensor ? info.numel * static_cast<int64_t>(dtype_size(info.dtype)) : 0);
  }

  ~MpiWork() override {
    if (!done_) {
      try {
        wait();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[comm] %s\n", e.what());
      }
    }
  }

  // A request slot for the next MPI call; the Work completes when all of them have (a
  // point-to-point exchange posts several).
  MPI_Request* add_request() { return &requests_.emplace_back(MPI_REQUEST_NULL); }
  void set_finish(std::function<void()> finish) { finish_ = std::move(finish); }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    mpi_check(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &flag,
                          MPI_STATUSES_IGNORE),
              "MPI_Testall");
    if (!flag) return false;
    complete();
    return true;
  }

  void wait() override {
    poll_with_deadline(
        [this] { return test(); }, comm_.options(),
        [this] {
          char buf[64];
          std::snprintf(buf, sizeof(buf), "%g", comm_.options().timeout_s);
          return "rank " + std::to_string(comm_.rank()) + " (world rank " +
                 std::to_string(mpi_runtime().world_rank()) + "): " + info_.str() + " on group '" +
                 comm_.name() + "' (mpi, " + std::to_string(comm_.size()) +
                 " ranks) did not complete within " + buf +
                 " s (--comm-timeout); another rank of the group stalled or called a different "
                 "operation. Aborting the job.";
        });
  }

 private:
  void complete() {
    done_ = true;
    flight::completed(flight_);
    if (finish_) finish_();
    finish_ = nullptr;
    keep_alive_.clear();
  }

  // A Work must not outlive its communicator (as an MPI request must not outlive its MPI_Comm).
  const MpiCommunicator& comm_;
  OpInfo info_;
  std::vector<Tensor> keep_alive_;
  std::function<void()> finish_;
  std::vector<MPI_Request> requests_;
  uint64_t flight_ = 0;
  bool done_ = false;
};

// The direct exchange all_gather and all_to_all are built from, on the reserved tag: `count`
// elements from every peer p into recv + p * block_bytes, and to every peer p from
// send_block(p). This rank's own block is the caller's to copy, once the exchange has
// completed (copying it earlier delays the peers or competes with them for the buffer).
template <typename SendBlock>
void post_exchange(MpiWork& work, MPI_Comm comm, int rank, int size, char* recv, size_t block_bytes,
                   int count, MPI_Datatype type, SendBlock send_block) {
  for (int step = 1; step < size; ++step) {
    const int from = (rank - step + size) % size;
    mpi_check(MPI_Irecv(recv + block_bytes * from, count, type, from, kReservedTag, comm,
                        work.add_request()),
              "MPI_Irecv");
  }
  for (int step = 1; step < size; ++step) {
    const int to = (rank + step) % size;
    mpi_check(MPI_Isend(send_block(to), count, type, to, kReservedTag, comm, work.add_request()),
              "MPI_Isend");
  }
}

}  // namespace

// ---- communicator ----

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, CommOptions options)
    : comm_(comm), name_(std::move(name)), options_(options) {
  mpi_runtime();
  MAMMOTH_CHECK(comm_ != MPI_COMM_NULL)
      << "[MpiCommunicator] group '" << name_ << "': MPI_COMM_NULL";
  mpi_check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  mpi_check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
  flight::GroupInfo info{.name = name_, .backend = "mpi", .rank = rank_, .size = size_};
  MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  mpi_check(MPI_Comm_group(comm_, &mine), "MPI_Comm_group");
  mpi_check(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
  std::vector<int> ranks(static_cast<size_t>(size_));
  for (int i = 0; i < size_; ++i) ranks[static_cast<size_t>(i)] = i;
  info.world_ranks.resize(ranks.size());
  mpi_check(MPI_Group_translate_ranks(mine, size_, ranks.data(), world, info.world_ranks.data()),
            "MPI_Group_translate_ranks");
  MPI_Group_free(&mine);
  MPI_Group_free(&world);
  world_ranks_ = info.world_ranks;
  flight_group_ = flight::register_group(std::move(info));
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL) {
    MPI_Comm_free(&comm_);
  }
}

std::unique_ptr<MpiCommunicator> mpi_world(const CommOptions& options) {
  mpi_runtime();
  MPI_Comm dup = MPI_COMM_NULL;
  mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup");
  return std::make_unique<MpiCommunicator>(dup, "world", options);
}

std::unique_ptr<Work> MpiCommunicator::iall_reduce(const Tensor& in, const Tensor& out,
                                                   ReduceOp op) {
  constexpr const char* kOp = "all_reduce";
  detail::check_tensor(in, "in", kOp, *this, DeviceType::kCPU);
  detail::check_tensor(out, "out", kOp, *this, DeviceType::kCPU);
  detail::check_same_kind(in, out, kOp, *this);
  detail::check_reduce_dtype(op, in.dtype(), kOp, *this);
  MAMMOTH_CHECK(in.numel() == out.numel()) << detail::where(kOp, *this) << ": in has " << in.numel()
                                           << " elements but out has " << out.numel();
  const bool in_place = in.raw_data() == out.raw_data();
  MAMMOTH_CHECK(in_place ||
                !detail::overlaps(in.raw_data(), in.nbytes(), out.raw_data(), out.nbytes()))
      << detail::where(kOp, *this) << ": in and out overlap without being the same buffer";
  if (in.numel() == 0) return std::make_unique<CompletedWork>();
  const int count = mpi_count(in.numel(), kOp, *this);
  auto work = std::make_unique<MpiWork>(*this, op_info(kOp, reduce_op_name(op), -1, in),
                                        std::vector<Tensor>{in, out});
  mpi_check(
      MPI_Iallreduce(in_place ? MPI_IN_PLACE : in.raw_data(), out.raw_data(), count,
                     mpi_type(in.dtype()).type, mpi_op(op, in.dtype()), comm_, work->add_request()),
      "MPI_Iallreduce");
  if (op == ReduceOp::kAvg && size_ > 1) {
    work->set_finish([out, n = size_] { detail::divide_cpu(out, n); });
  }
  return work;
}

std::unique_ptr<Work> MpiCommunicator::ireduce_scatter(const Tensor& in, const Tensor& out,
                                                       ReduceOp op) {
  constexpr const char* kOp = "reduce_scatter";
  detail::check_tensor(in, "in", kOp, *this, DeviceType::kCPU);
  detail::check_tensor(out, "out", kOp, *this, DeviceType::kCPU);
  detail::check_same_kind(in, out, kOp, *this);
  detail::check_reduce_dtype(op, in.dtype(), kOp, *this);
  const int64_t n = out.numel();
  MAMMOTH_CHECK(in.numel() == n * size_)
      << detail::where(kOp, *this) << ": in must hold size (" << size_ << ") x out (" << n
      << ") elements, got " << in.numel();
  const size_t shard_bytes = out.nbytes();
  char* const shard = static_cast<char*>(in.raw_data()) + shard_bytes * rank_;
  const bool in_place = out.raw_data() == shard;
  MAMMOTH_CHECK(in_place ||
                !detail::overlaps(in.raw_data(), in.nbytes(), out.raw_data(), out.nbytes()))
      << detail::where(kOp, *this)
      << ": out overlaps in without being this rank's shard of it (in place)";
  if (n == 0) return std::make_unique<CompletedWork>();
  const int count = mpi_count(n, kOp, *this);
  auto work = std::make_unique<MpiWork>(*this, op_info(kOp, reduce_op_name(op), -1, in),
                                        std::vector<Tensor>{in, out});
  // MPI's in-place form leaves the result at the start of the buffer; move it to this rank's
  // shard afterwards (n elements, 1/size of the input).
  mpi_check(MPI_Ireduce_scatter_block(in_place ? MPI_IN_PLACE : in.raw_data(),
                                      in_place ? in.raw_data() : out.raw_data(), count,
                                      mpi_type(in.dtype()).type, mpi_op(op, in.dtype()), comm_,
                                      work->add_request()),
            "MPI_Ireduce_scatter_block");
  const bool divide = op == ReduceOp::kAvg && size_ > 1;
  if ((in_place && rank_ != 0) || divide) {
    work->set_finish([in, out, in_place, divide, shard_bytes, r = rank_, s = size_] {
      if (in_place && r != 0) std::memmove(out.raw_data(), in.raw_data(), shard_bytes);
      if (divide) detail::divide_cpu(out, s);
    });
  }
  return work;
}

std::unique_ptr<Work> MpiCommunicator::iall_gather(const Tensor& in, const Tensor& out) {
  constexpr const char* kOp = "all_gather";
  detail::check_tensor(in, "in", kOp, *this, DeviceType::kCPU);
  detail::check_tensor(out, "out", kOp, *this, DeviceType::kCPU);
  detail::check_same_kind(in, out, kOp, *this);
  const int64_t n = in.numel();
  MAMMOTH_CHECK(out.numel() == n * size_)
      << detail::where(kOp, *this) << ": out must hold size (" << size_ << ") x in (" << n
      << ") elements, got " << out.numel();
  const bool in_place = in.raw_data() == static_cast<char*>(out.raw_data()) + in.nbytes() * rank_;
  MAMMOTH_CHECK(in_place ||
                !detail::overlaps(in.raw_data(), in.nbytes(), out.raw_data(), out.nbytes()))
      << detail::where(kOp, *this)
      << ": in overlaps out without being this rank's block of it (in place)";
  if (n == 0) return std::make_unique<CompletedWork>();
  const int count = mpi_count(n, kOp, *this);
  const MPI_Datatype type = mpi_type(in.dtype()).type;
  auto work =
      std::make_unique<MpiWork>(*this, op_info(kOp, "", -1, in), std::vector<Tensor>{in, out});
  const size_t block_bytes = in.nbytes();
  char* const base = static_cast<char*>(out.raw_data());
  char* const mine = base + block_bytes * rank_;
  if (size_ == 1) {
    if (!in_place) std::memcpy(mine, in.raw_data(), block_bytes);
    return std::make_unique<CompletedWork>();
  }
  // A direct exchange: every rank receives each peer's block straight into `out` and sends its
  // own from `in`. Measured against MPI_Allgather (2 ranks, 256 KiB-4 MiB) this matches it,
  // while MPI_Iallgather reached 0.5-0.8x (libnbc stages the blocks). Each rank posts size-1
  // sends and receives; fine for the CPU groups this backend serves (a node or a few); large GPU
  // jobs use the NCCL backend.
  post_exchange(*work, comm_, rank_, size_, base, block_bytes, count, type,
                [&](int) { return static_cast<const char*>(in.raw_data()); });
  if (!in_place) {
    work->set_finish([in, mine, block_bytes] { std::memcpy(mine, in.raw_data(), block_bytes); });
  }
  return work;
}

std::unique_ptr<Work> MpiCommunicator::ibroadcast(const Tensor& in, const Tensor& out, int root) {
  constexpr const char* kOp = "broadcast";
  detail::check_tensor(out, "out", kOp, *this, DeviceType::kCPU);
  MAMMOTH_CHECK(root >= 0 && root < size_) << detail::where(kOp, *this) << ": root " << root
                                           << " is not a rank of this group of " << size_;
  if (rank_ == root) {
    detail::check_tensor(in, "in", kOp, *this, DeviceType::kCPU);
    detail::check_same_kind(in, out, kOp, *this);
    MAMMOTH_CHECK(in.numel() == out.numel())
        << detail::where(kOp, *this) << ": in has " << in.numel() << " elements but out has "
        << out.numel();
    if (in.raw_data() != out.raw_data()) {
      MAMMOTH_CHECK(!detail::overlaps(in.raw_data(), in.nbytes(), out.raw_data(), out.nbytes()))
          << detail::where(kOp, *this) << ": in and out overlap without being the same buffer";
      std::memcpy(out.raw_data(), in.raw_data(), in.nbytes());
    }
  }
  if (out.numel() == 0) return std::make_unique<CompletedWork>();
  const int count = mpi_count(out.numel(), kOp, *this);
  auto work =
      std::make_unique<MpiWork>(*this, op_info(kOp, "root ", root, out), std::vector<Tensor>{out});
  mpi_check(MPI_Ibcast(out.raw_data(), count, mpi_type(out.dtype()).type, root, comm_,
                       work->add_request()),
            "MPI_Ibcast");
  return work;
}

std::unique_ptr<Work> MpiCommunicator::iall_to_all(const Tensor& in, const Tensor& out) {
  constexpr const char* kOp = "all_to_all";
  detail::check_tensor(in, "in", kOp, *this, DeviceType::kCPU);
  detail::check_tensor(out, "out", kOp, *this, DeviceType::kCPU);
  detail::check_same_kind(in, out, kOp, *this);
  MAMMOTH_CHECK(in.numel() == out.numel() && in.numel() % size_ == 0)
      << detail::where(kOp, *this) << ": in (" << in.numel() << ") and out (" << out.numel()
      << ") must hold the same multiple of the group size " << size_;
  const bool in_place = in.raw_data() == out.raw_data();
  MAMMOTH_CHECK(in_place ||
                !detail::overlaps(in.raw_data(), in.nbytes(), out.raw_data(), out.nbytes()))
      << detail::where(kOp, *this) << ": in and out overlap without being the same buffer";
  if (in.numel() == 0) return std::make_unique<CompletedWork>();
  const int count = mpi_count(in.numel() / size_, kOp, *this);
  // In place, the blocks are sent from a copy (a block's receive would overwrite one still to
  // be sent).
  const Tensor send = in_place ? in.clone() : in;
  const MPI_Datatype type = mpi_type(in.dtype()).type;
  auto work =
      std::make_unique<MpiWork>(*this, op_info(kOp, "", -1, in), std::vector<Tensor>{send, out});
  // A direct exchange, as for all_gather (measured 0.92-0.95x of MPI_Alltoall with
  // MPI_Ialltoall): block j of `send` to rank j, block i of `out` from rank i, and this rank's
  // own block copied once the exchange has completed.
  const size_t block_bytes = send.nbytes() / static_cast<size_t>(size_);
  const char* const src = static_cast<const char*>(send.raw_data());
  char* const dst = static_cast<char*>(out.raw_data());
  post_exchange(*work, comm_, rank_, size_, dst, block_bytes, count, type,
                [&](int to) { return src + block_bytes * to; });
  const int r = rank_;
  work->set_finish([send, out, src, dst, block_bytes, r] {
    std::memcpy(dst + block_bytes * r, src + block_bytes * r, block_bytes);
  });
  return work;
}

std::unique_ptr<Work> MpiCommunicator::iall_to_all_v(const Tensor& in,
                                                     std::span<const int64_t> send_counts,
                                                     const Tensor& out,
                                                     std::span<const int64_t> recv_counts) {
  constexpr const char* kOp = "all_to_all_v";
  detail::check_tensor(in, "in", kOp, *this, DeviceType::kCPU);
  detail::check_tensor(out, "out", kOp, *this, DeviceType::kCPU);
  detail::check_same_kind(in, out, kOp, *this);
  detail::check_v_counts(in, send_counts, out, recv_counts, kOp, *this);
  // MPI takes int counts and displacements, in elements.
  const auto layout = [&](std::span<const int64_t> counts, std::vector<int>& c,
                          std::vector<int>& displs) {
    c.resize(counts.size());
    displs.resize(counts.size());
    int64_t offset = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      c[i] = mpi_count(counts[i], kOp, *this);
      displs[i] = mpi_count(offset, kOp, *this);
      offset += counts[i];
    }
  };
  // MPI forbids touching a non-blocking collective's count and displacement arrays before it
  // completes (MPI 3.1, 5.12): they live in the Work's completion callback until then.
  struct Layout {
    std::vector<int> scounts, sdispls, rcounts, rdispls;
  };
  auto v = std::make_shared<Layout>();
  layout(send_counts, v->scounts, v->sdispls);
  layout(recv_counts, v->rcounts, v->rdispls);
  // No shortcut for empty buffers: unlike all_to_all, a rank that sends and receives nothing
  // must still join, as its peers' counts differ from its own. MPI wants a valid address even
  // for zero counts.
  static char empty_buffer;
  void* const sbuf = in.numel() ? in.raw_data() : &empty_buffer;
  void* const rbuf = out.numel() ? out.raw_data() : &empty_buffer;
  const MPI_Datatype type = mpi_type(in.dtype()).type;
  OpInfo info = op_info(kOp, "", -1, in);
  info.numel = std::max(in.numel(), out.numel());
  auto work = std::make_unique<MpiWork>(*this, info, std::vector<Tensor>{in, out});
  mpi_check(MPI_Ialltoallv(sbuf, v->scounts.data(), v->sdispls.data(), type, rbuf,
                           v->rcounts.data(), v->rdispls.data(), type, comm_, work->add_request()),
            "MPI_Ialltoallv");
  work->set_finish([v] {});
  return work;
}

std::unique_ptr<Work> MpiCommunicator::point_to_point(const Tensor& t, int peer, int tag,
                                                      bool send) {
  const char* const op = send ? "send" : "recv";
  detail::check_tensor(t, "tensor", op, *this, DeviceType::kCPU);
  detail::check_peer(peer, op, *this);
  MAMMOTH_CHECK(tag >= 0 && tag < kReservedTag)
      << detail::where(op, *this) << ": tag " << tag << " is outside [0, " << kReservedTag
      << ") (larger tags are reserved for collectives)";
  const int count = mpi_count(t.numel(), op, *this);
  auto work = std::make_unique<MpiWork>(*this, op_info(op, send ? "to " : "from ", peer, t),
                                        std::vector<Tensor>{t});
  const MPI_Datatype type = mpi_type(t.dtype()).type;
  if (send) {
    mpi_check(MPI_Isend(t.raw_data(), count, type, peer, tag, comm_, work->add_request()),
              "MPI_Isend");
  } else {
    mpi_check(MPI_Irecv(t.raw_data(), count, type, peer, tag, comm_, work->add_request()),
              "MPI_Irecv");
  }
  return work;
}

std::unique_ptr<Work> MpiCommunicator::isend(const Tensor& t, int peer, int tag) {
  return point_to_point(t, peer, tag, /*send=*/true);
}

std::unique_ptr<Work> MpiCommunicator::irecv(const Tensor& t, int peer, int tag) {
  return point_to_point(t, peer, tag, /*send=*/false);
}

std::unique_ptr<Work> MpiCommunicator::ibarrier() {
  auto work = std::make_unique<MpiWork>(*this, OpInfo{"barrier"}, std::vector<Tensor>{});
  mpi_check(MPI_Ibarrier(comm_, work->add_request()), "MPI_Ibarrier");
  return work;
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::split_mpi(int color, int key,
                                                            const std::string& name) {
  MPI_Comm sub = MPI_COMM_NULL;
  // MPI_Comm_split is blocking; a barrier with a deadline first makes a rank that never arrives
  // abort the job instead of hanging it.
  barrier();
  mpi_check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split");
  if (sub == MPI_COMM_NULL) return nullptr;
  return std::make_unique<MpiCommunicator>(sub, name, options_);
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name) {
  return split_mpi(color, key, name);
}

}  // namespace mammoth::parallel
