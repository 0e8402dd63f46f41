// `mammoth bench comm`: our collectives vs the raw MPI calls (see comm_bench.h).
#include "tools/bench/comm_bench.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>

#include "base/error.h"
#include "engine/tensor.h"
#include "parallel/comm/mpi_communicator.h"

namespace mammoth::tools {
namespace {

using engine::Tensor;
using parallel::mpi_check;

struct AlignedFree {
  void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float, AlignedFree>;

Buffer allocate(int64_t bytes) {
  const size_t rounded = static_cast<size_t>((std::max<int64_t>(bytes, 64) + 4095) / 4096 * 4096);
  auto* p = static_cast<float*>(std::aligned_alloc(4096, rounded));
  MAMMOTH_CHECK(p != nullptr) << "[bench comm] cannot allocate " << bytes << " bytes";
  std::memset(p, 0, rounded);  // touch every page before timing
  return Buffer(p);
}

Tensor wrap(float* p, int64_t count) {
  return Tensor::from_blob(p, {count}, DType::kF32, Device::cpu(), [] {});
}

// Time per operation of the slowest rank, for `iters` back-to-back calls.
double time_batch(MPI_Comm comm, int iters, const std::function<void()>& fn) {
  mpi_check(MPI_Barrier(comm), "MPI_Barrier");
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) fn();
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, comm), "MPI_Allreduce");
  return t / iters;
}

int64_t parse_int(const std::string& name, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  MAMMOTH_CHECK(!v.empty() && *end == '\0' && x > 0)
      << "[bench comm] --" << name << " expects a positive integer, got '" << v << "'";
  return x;
}

double parse_double(const std::string& name, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  MAMMOTH_CHECK(!v.empty() && *end == '\0' && x > 0)
      << "[bench comm] --" << name << " expects a positive number, got '" << v << "'";
  return x;
}

}  // namespace

int run_comm_bench(const std::vector<std::string>& args) {
  CommBenchOptions o;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    MAMMOTH_CHECK(name.rfind("--", 0) == 0)
        << "[bench comm] unexpected argument '" << name << "' (options start with --)";
    name = name.substr(2);
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      MAMMOTH_CHECK(i + 1 < args.size()) << "[bench comm] --" << name << " needs a value";
      value = args[++i];
    }
    if (name == "json") {
      o.json_path = value;
    } else if (name == "min-bytes") {
      o.min_bytes = parse_int(name, value);
    } else if (name == "max-bytes") {
      o.max_bytes = parse_int(name, value);
    } else if (name == "rounds") {
      o.rounds = static_cast<int>(parse_int(name, value));
    } else if (name == "batch-ms") {
      o.batch_ms = parse_double(name, value);
    } else if (name == "spin-polls") {
      o.spin_polls = static_cast<int>(parse_int(name, value));
    } else if (name == "comm-timeout") {
      o.timeout_s = parse_double(name, value);
    } else if (name == "ops") {
      o.ops.clear();
      size_t start = 0;
      while (start <= value.size()) {
        const size_t comma = std::min(value.find(',', start), value.size());
        o.ops.push_back(value.substr(start, comma - start));
        start = comma + 1;
      }
    } else {
      MAMMOTH_THROW()
          << "[bench comm] unknown option --" << name
          << " (json, min-bytes, max-bytes, ops, rounds, batch-ms, spin-polls, comm-timeout)";
    }
  }
  return run_comm_bench(o);
}

int run_comm_bench(const CommBenchOptions& o) {
  for (const std::string& op : o.ops) {
    MAMMOTH_CHECK(op == "all_reduce" || op == "reduce_scatter" || op == "all_gather" ||
                  op == "all_to_all")
        << "[bench comm] --ops: unknown operation '" << op
        << "' (all_reduce, reduce_scatter, all_gather, all_to_all)";
  }
  MAMMOTH_CHECK(o.min_bytes <= o.max_bytes)
      << "[bench comm] --min-bytes " << o.min_bytes << " exceeds --max-bytes " << o.max_bytes;

  auto world = parallel::mpi_world(
      parallel::CommOptions{.timeout_s = o.timeout_s, .spin_polls = o.spin_polls});
  const int n = world->size(), rank = world->rank();
  const MPI_Comm comm = world->comm();
  if (n < 2 && rank == 0) {
    std::fprintf(stderr, "[bench comm] running on 1 rank: start it with mpirun -np 2 or more\n");
  }

  Buffer in = allocate(o.max_bytes), out = allocate(o.max_bytes), check = allocate(o.max_bytes);
  for (int64_t i = 0; i < o.max_bytes / 4; ++i) in.get()[i] = static_cast<float>(rank + 1 + i % 7);

  FILE* json = nullptr;
  if (rank == 0 && !o.json_path.empty()) {
    json = std::fopen(o.json_path.c_str(), "w");
    MAMMOTH_CHECK(json != nullptr) << "[bench comm] cannot write --json " << o.json_path;
    std::fprintf(json, "[\n");
  }
  if (rank == 0) {
    std::printf(
        "bench comm: %d ranks, f32, MPI thread level %d, spin_polls %d, best of %d "
        "rounds\n",
        n, parallel::mpi_runtime().thread_level(), world->options().spin_polls, o.rounds);
    std::printf("%-15s %12s %7s %11s %11s %7s %s\n", "op", "bytes", "iters", "ours GB/s",
                "MPI GB/s", "ratio", "same result");
    std::fflush(stdout);
  }

  bool first_row = true;
  int mismatches = 0;
  for (const std::string& op : o.ops) {
    for (int64_t size = o.min_bytes; size <= o.max_bytes; size *= 4) {
      // Whole f32 elements in every rank's block.
      const int64_t bytes = size / (4 * n) * (4 * n);
      if (bytes == 0) continue;
      const int64_t count = bytes / 4, block = count / n;
      float* const pin = in.get();
      float* const pout = out.get();
      std::function<void()> raw, ours;
      double factor = 0;
      Tensor tin, tout;
      if (op == "all_reduce") {
        factor = 2.0 * (n - 1) / n;
        tin = wrap(pin, count);
        tout = wrap(pout, count);
        raw = [&] {
          mpi_check(MPI_Allreduce(pin, pout, static_cast<int>(count), MPI_FLOAT, MPI_SUM, comm),
                    "MPI_Allreduce");
        };
        ours = [&] { world->all_reduce(tin, tout, parallel::ReduceOp::kSum); };
      } else if (op == "reduce_scatter") {
        factor = static_cast<double>(n - 1) / n;
        tin = wrap(pin, count);
        tout = wrap(pout, block);
        raw = [&] {
          mpi_check(MPI_Reduce_scatter_block(pin, pout, static_cast<int>(block), MPI_FLOAT, MPI_SUM,
                                             comm),
                    "MPI_Reduce_scatter_block");
        };
        ours = [&] { world->reduce_scatter(tin, tout, parallel::ReduceOp::kSum); };
      } else if (op == "all_to_all") {
        // nccl-tests' all-to-all bus bandwidth: (n-1)/n * size / time, size = the whole buffer.
        factor = static_cast<double>(n - 1) / n;
        tin = wrap(pin, count);
        tout = wrap(pout, count);
        raw = [&] {
          mpi_check(MPI_Alltoall(pin, static_cast<int>(block), MPI_FLOAT, pout,
                                 static_cast<int>(block), MPI_FLOAT, comm),
                    "MPI_Alltoall");
        };
        ours = [&] { world->all_to_all(tin, tout); };
      } else {
        factor = static_cast<double>(n - 1) / n;
        tin = wrap(pin, block);
        tout = wrap(pout, count);
        raw = [&] {
          mpi_check(MPI_Allgather(pin, static_cast<int>(block), MPI_FLOAT, pout,
                                  static_cast<int>(block), MPI_FLOAT, comm),
                    "MPI_Allgather");
        };
        ours = [&] { world->all_gather(tin, tout); };
      }
      const int64_t out_bytes = (op == "reduce_scatter" ? block : count) * 4;

      // Same result: the outputs of one raw and one of our calls agree bit for bit.
      raw();
      std::memcpy(check.get(), pout, static_cast<size_t>(out_bytes));
      std::memset(pout, 0, static_cast<size_t>(out_bytes));
      ours();
      int same = std::memcmp(check.get(), pout, static_cast<size_t>(out_bytes)) == 0 ? 1 : 0;
      mpi_check(MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");
      if (!same) ++mismatches;

      // Batch length from the fastest of three timed raw calls (each the max over ranks, so
      // every rank computes the same count); a slow outlier would make batches too short.
      double t1 = 1e30;
      for (int k = 0; k < 3; ++k) t1 = std::min(t1, time_batch(comm, 1, raw));
      const int iters = static_cast<int>(std::clamp(o.batch_ms / 1e3 / t1, 1.0, 20000.0));
      double best_raw = 1e30, best_ours = 1e30;
      for (int r = 0; r < o.rounds; ++r) {
        // Alternate which goes first, so slow drifts of the machine hit both alike.
        if (r % 2 == 0) {
          best_raw = std::min(best_raw, time_batch(comm, iters, raw));
          best_ours = std::min(best_ours, time_batch(comm, iters, ours));
        } else {
          best_ours = std::min(best_ours, time_batch(comm, iters, ours));
          best_raw = std::min(best_raw, time_batch(comm, iters, raw));
        }
      }
      const double bw_ours = factor * static_cast<double>(bytes) / best_ours / 1e9;
      const double bw_raw = factor * static_cast<double>(bytes) / best_raw / 1e9;
      const double ratio = bw_raw > 0 ? bw_ours / bw_raw : 0;
      if (rank == 0) {
        std::printf("%-15s %12lld %7d %11.3f %11.3f %7.3f %s\n", op.c_str(),
                    static_cast<long long>(bytes), iters, bw_ours, bw_raw, ratio,
                    same ? "yes" : "NO");
        std::fflush(stdout);
        if (json) {
          std::fprintf(json,
                       "%s  {\"name\": \"%s_f32_np%d\", \"shape\": \"%lld B\", \"threads\": 1, "
                       "\"ours\": %.4f, \"anchor\": %.4f, \"unit\": \"GB/s\", \"ratio\": %.4f}",
                       first_row ? "" : ",\n", op.c_str(), n, static_cast<long long>(bytes),
                       bw_ours, bw_raw, ratio);
        }
      }
      first_row = false;
    }
  }
  if (json) {
    std::fprintf(json, "\n]\n");
    std::fclose(json);
  }
  if (mismatches && rank == 0) {
    std::fprintf(stderr, "[bench comm] %d sizes gave results different from raw MPI\n", mismatches);
  }
  return mismatches ? 1 : 0;
}

}  // namespace mammoth::tools
