#include "tools/bench/dp_bench.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "base/error.h"
#include "base/json.h"
#include "base/thread_pool.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/data_parallel.h"

namespace mammoth::tools {
namespace {

struct Options {
  std::string model = "gpt2-tiny";
  int64_t micro_batch = 8, seq_len = 64, steps = 10;
  int zero = 0;
  double bucket_mb = 25;
  std::string json;
};

Options parse(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> const std::string& {
      MAMMOTH_CHECK(i + 1 < args.size()) << "[bench dp] " << args[i] << " needs a value";
      return args[++i];
    };
    const std::string& a = args[i];
    if (a == "--model")
      o.model = value();
    else if (a == "--micro-batch")
      o.micro_batch = std::stoll(value());
    else if (a == "--seq-len")
      o.seq_len = std::stoll(value());
    else if (a == "--steps")
      o.steps = std::stoll(value());
    else if (a == "--zero")
      o.zero = std::stoi(value());
    else if (a == "--bucket-mb")
      o.bucket_mb = std::stod(value());
    else if (a == "--json")
      o.json = value();
    else
      MAMMOTH_THROW() << "[bench dp] unknown flag '" << a << "'";
  }
  MAMMOTH_CHECK(o.steps >= 2 && o.micro_batch > 0 && o.seq_len > 1)
      << "[bench dp] --steps must be >= 2 and sizes positive";
  return o;
}

// Waits for every rank while sleeping, so idle ranks do not take cores from the measured one.
void sleeping_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  int done = 0;
  while (!done) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) usleep(2000);
  }
}

engine::Tensor batch(int64_t step, int64_t first, int64_t rows, int64_t T, int64_t vocab) {
  std::vector<int64_t> ids;
  for (int64_t r = first; r < first + rows; ++r) {
    for (int64_t t = 0; t < T; ++t) ids.push_back((step * 131 + r * 17 + t * 7) % vocab);
  }
  return engine::Tensor::from_ints(ids, {rows, T});
}

// Seconds of training step `s` on `rows` rows of this rank.
double time_step(models::LanguageModel& model, engine::optim::AdamW& opt,
                 parallel::DataParallel* dp, const Options& o, int64_t s, int64_t rows,
                 int64_t first_row) {
  const auto t0 = std::chrono::steady_clock::now();
  if (dp) dp->begin_backward(true);
  model.loss(batch(s, first_row, rows, o.seq_len, model.config().vocab_size)).backward();
  if (dp) dp->finish_backward();
  opt.step();
  opt.zero_grad();
  if (dp) dp->after_step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The median of the steps after the first (which allocates and warms up); medians because
// the machine may be shared.
double median_after_first(std::vector<double> t) {
  t.erase(t.begin());
  std::sort(t.begin(), t.end());
  const size_t k = t.size();
  return k % 2 ? t[k / 2] : 0.5 * (t[k / 2 - 1] + t[k / 2]);
}

}  // namespace

int run_dp_bench(const std::vector<std::string>& args) {
  const Options o = parse(args);
  auto world = parallel::mpi_world();
  const int n = world->size(), rank = world->rank();
  MAMMOTH_CHECK(n >= 2) << "[bench dp] run under mpirun with at least 2 ranks";
  models::ModelOptions mo;
  mo.max_seq = o.seq_len;
  mo.seed = 1;
  set_num_threads(1);
  const double rank_tokens = static_cast<double>(o.micro_batch * o.seq_len);

  // Anchor of the scaling row: rank 0 alone, 1 thread, one rank's batch, no data parallelism
  // (the other ranks sleep, so it has the machine to itself as each rank would with a core).
  double single_s = 0;
  if (rank == 0) {
    auto model = models::create_language_model(o.model, mo);
    engine::optim::AdamW opt(model->named_parameters(), {});
    std::vector<double> t;
    for (int64_t s = 0; s < o.steps; ++s)
      t.push_back(time_step(*model, opt, nullptr, o, s, o.micro_batch, 0));
    single_s = median_after_first(t);
  }
  sleeping_barrier();

  // Ours: n ranks x 1 thread, each its own batch, bucketed reductions during backward. Beside
  // it, the same step with communication skipped: every rank at once, each with a
  // DataParallel over a group of itself alone (the same bucket copies; its collectives cross
  // nothing). Under ZeRO >= 1 a group of one also does not shard, so the optimizer's work
  // differs: the row is exact for --zero 0. The two alternate step by step so that both see
  // the same machine; a step's time is the slowest rank's.
  std::unique_ptr<parallel::Communicator> self = world->split(rank, 0, "self");
  struct Runner {
    std::shared_ptr<models::LanguageModel> model;
    std::unique_ptr<parallel::DataParallel> dp;
    std::unique_ptr<engine::optim::AdamW> opt;
    std::vector<double> times;
  };
  auto make = [&](parallel::Communicator& group) {
    Runner r;
    r.model = models::create_language_model(o.model, mo);
    r.dp = std::make_unique<parallel::DataParallel>(
        r.model->named_parameters(), group,
        parallel::DataParallelOptions{.zero_stage = o.zero, .bucket_mb = o.bucket_mb});
    parallel::DataParallel* dp = r.dp.get();
    r.opt = std::make_unique<engine::optim::AdamW>(
        dp->optimizer_params(), engine::optim::AdamWOptions{},
        [dp](const std::string& name, const engine::Tensor&) { return dp->decays(name); });
    return r;
  };
  Runner with = make(*world), without = make(*self);
  for (int64_t s = 0; s < o.steps; ++s) {
    for (Runner* r : {&with, &without}) {
      world->barrier();
      double t =
          time_step(*r->model, *r->opt, r->dp.get(), o, s, o.micro_batch, rank * o.micro_batch);
      engine::Tensor v = engine::Tensor::from_vector({t}, {1}, DType::kF64);
      world->all_reduce(v, parallel::ReduceOp::kMax);
      r->times.push_back(v.item());
    }
  }
  const double dp_s = median_after_first(with.times);
  const double nocomm_s = median_after_first(without.times);

  if (rank == 0) {
    const std::string shape = o.model + " B" + std::to_string(o.micro_batch) + " T" +
                              std::to_string(o.seq_len) + " per rank";
    std::printf("data-parallel step, %s, %d ranks x 1 thread, ZeRO %d, bucket %g MiB\n",
                shape.c_str(), n, o.zero, o.bucket_mb);
    std::printf("%-28s %14s %14s %8s\n", "name", "ours tok/s", "anchor tok/s", "ratio");
    struct Row {
      std::string name;
      double ours, anchor;
    };
    // Scaling: n ranks' tokens/s against n times one rank's (ideal weak scaling = 1).
    // Overlap: the dp step against the same step with no communication, both on n ranks.
    const std::vector<Row> rows = {
        {"dp" + std::to_string(n) + "x1thread_vs_" + std::to_string(n) + "x(1x1thread)",
         n * rank_tokens / dp_s, n * rank_tokens / single_s},
        {"dp" + std::to_string(n) + "x1thread_vs_nocomm", n * rank_tokens / dp_s,
         n * rank_tokens / nocomm_s},
    };
    json::Value out = json::Value::array();
    for (const Row& r : rows) {
      std::printf("%-28s %14.0f %14.0f %8.3f\n", r.name.c_str(), r.ours, r.anchor,
                  r.ours / r.anchor);
      json::Value row = json::Value::object();
      row.set("name", r.name);
      row.set("shape", shape);
      row.set("threads", 1);
      row.set("ranks", n);
      row.set("ours", r.ours);
      row.set("anchor", r.anchor);
      row.set("unit", "tokens/s");
      row.set("ratio", r.ours / r.anchor);
      out.push_back(row);
    }
    std::printf("step: dp %.1f ms, no communication %.1f ms, one rank alone %.1f ms\n", 1e3 * dp_s,
                1e3 * nocomm_s, 1e3 * single_s);
    if (!o.json.empty()) std::ofstream(o.json) << json::dump(out, 2) << "\n";
  }
  return 0;
}

}  // namespace mammoth::tools
