#include "tools/bench/dp_bench.h"

#include <mpi.h>
#include <unistd.h>

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

// Seconds per step (mean over steps after the first) of training `rows` rows per rank.
double time_steps(models::LanguageModel& model, engine::optim::AdamW& opt,
                  parallel::DataParallel* dp, const Options& o, int64_t rows, int64_t first_row,
                  int64_t vocab) {
  double total = 0;
  for (int64_t s = 0; s < o.steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    if (dp) dp->begin_backward(true);
    model.loss(batch(s, first_row, rows, o.seq_len, vocab)).backward();
    if (dp) dp->finish_backward();
    opt.step();
    opt.zero_grad();
    if (dp) dp->after_step();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) total += dt;
  }
  return total / static_cast<double>(o.steps - 1);
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
  const int64_t global_rows = o.micro_batch * n;
  const double tokens = static_cast<double>(global_rows * o.seq_len);

  // Anchor: rank 0 alone, n threads, the whole global batch.
  double single_s = 0;
  if (rank == 0) {
    set_num_threads(n);
    auto model = models::create_language_model(o.model, mo);
    engine::optim::AdamW opt(model->named_parameters(), {});
    single_s = time_steps(*model, opt, nullptr, o, global_rows, 0, model->config().vocab_size);
  }
  sleeping_barrier();

  // Ours: n ranks x 1 thread, each its share of the global batch.
  set_num_threads(1);
  auto model = models::create_language_model(o.model, mo);
  parallel::DataParallel dp(model->named_parameters(), *world,
                            {.zero_stage = o.zero, .bucket_mb = o.bucket_mb});
  engine::optim::AdamW opt(
      dp.optimizer_params(), {},
      [&](const std::string& name, const engine::Tensor&) { return dp.decays(name); });
  world->barrier();
  const double dp_s = time_steps(*model, opt, &dp, o, o.micro_batch, rank * o.micro_batch,
                                 model->config().vocab_size);
  const double slowest = [&] {
    engine::Tensor t = engine::Tensor::from_vector({dp_s}, {1}, DType::kF64);
    world->all_reduce(t, parallel::ReduceOp::kMax);
    return t.item();
  }();
  if (rank == 0) {
    const double ours = tokens / slowest, anchor = tokens / single_s;
    std::printf("data-parallel scaling, %s, global batch %lld x %lld tokens, ZeRO %d\n",
                o.model.c_str(), static_cast<long long>(global_rows),
                static_cast<long long>(o.seq_len), o.zero);
    std::printf("%-28s %14s %14s %8s\n", "name", "ours tok/s", "anchor tok/s", "ratio");
    const std::string name =
        "dp" + std::to_string(n) + "x1thread_vs_1x" + std::to_string(n) + "threads";
    std::printf("%-28s %14.0f %14.0f %8.3f\n", name.c_str(), ours, anchor, ours / anchor);
    if (!o.json.empty()) {
      json::Value row = json::Value::object();
      row.set("name", name);
      row.set("shape",
              o.model + " B" + std::to_string(global_rows) + " T" + std::to_string(o.seq_len));
      row.set("threads", n);
      row.set("ours", ours);
      row.set("anchor", anchor);
      row.set("unit", "tokens/s");
      row.set("ratio", ours / anchor);
      json::Value rows = json::Value::array();
      rows.push_back(row);
      std::ofstream(o.json) << json::dump(rows, 2) << "\n";
    }
  }
  return 0;
}

}  // namespace mammoth::tools
