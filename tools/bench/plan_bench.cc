#include "tools/bench/plan_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/json.h"
#include "models/registry.h"
#include "plan/calibrate.h"
#include "plan/cluster.h"
#include "plan/parallel_plan.h"
#include "plan/search.h"
#include "plan/time_model.h"
#include "tools/default_corpus.h"

namespace mammoth::tools {
namespace {

namespace fs = std::filesystem;

struct Options {
  bool quick = false;
  int steps = 20;            // the median of steps 2..N: fewer leave the run-to-run spread ~20%
  std::string stat = "cpu";  // cpu | min | median: what the measured step time is
  std::vector<int> worlds = {1, 2};
  std::vector<std::string> models = {"gpt2-tiny", "llama-tiny"};
  std::string cluster;  // "": calibrate
  std::string mpirun = "mpirun --oversubscribe --allow-run-as-root";
  std::string json_path;
  std::string keep;  // "": a temporary directory, removed at the end
  int64_t global_batch = 16;
  int64_t seq_len = 64;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string w; std::getline(in, w, ',');)
    if (!w.empty()) out.push_back(w);
  return out;
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  bool worlds_given = false, models_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      MAMMOTH_CHECK(i + 1 < args.size()) << "[bench plan] " << a << " needs a value";
      return args[++i];
    };
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--steps") {
      o.steps = std::stoi(value());
      MAMMOTH_CHECK(o.steps >= 2) << "[bench plan] --steps must be >= 2 (the first is dropped)";
    } else if (a == "--stat") {
      o.stat = value();
      MAMMOTH_CHECK(o.stat == "cpu" || o.stat == "min" || o.stat == "median")
          << "[bench plan] --stat is cpu, min or median, got '" << o.stat << "'";
    } else if (a == "--np") {
      o.worlds.clear();
      for (const std::string& w : split(value())) o.worlds.push_back(std::stoi(w));
      worlds_given = true;
    } else if (a == "--models") {
      o.models = split(value());
      models_given = true;
    } else if (a == "--cluster") {
      o.cluster = value();
    } else if (a == "--mpirun") {
      o.mpirun = value();
    } else if (a == "--json") {
      o.json_path = value();
    } else if (a == "--keep") {
      o.keep = value();
    } else {
      MAMMOTH_THROW() << "[bench plan] unknown option '" << a
                      << "' (--quick, --steps N, --np 1,2, --models A,B, --cluster FILE, "
                         "--mpirun CMD, --json FILE, --keep DIR, --stat cpu|min|median)";
    }
  }
  if (o.quick) {
    if (!worlds_given) o.worlds = {1};
    if (!models_given) o.models = {"gpt2-tiny"};
    o.steps = std::min(o.steps, 3);
  }
  return o;
}

// The variants measured beside the search's choice: a spread over every plan field that
// shapes the time, at one global batch (variants the plan rules refuse are skipped).
std::vector<plan::ParallelPlan> variants(int world, int64_t gb, bool quick) {
  using P = plan::ParallelPlan;
  std::vector<std::function<void(P&)>> edits;
  auto mb = [gb](int64_t m, int dp = 1) {
    return [gb, m, dp](P& p) {
      p.micro_batch = m;
      p.grad_accum = gb / dp / m;
    };
  };
  if (world == 1) {
    edits = {mb(16), mb(8), mb(4), [&](P& p) { mb(2)(p); },
             [&](P& p) { mb(16)(p), p.recompute_blocks = -1; },
             [&](P& p) { mb(4)(p), p.recompute_blocks = -1; },
             [&](P& p) { mb(8)(p), p.recompute_blocks = 1; },
             [&](P& p) { mb(8)(p), p.offload = "host"; },
             // Chunks paged through a device budget below the model's state (the offload
             // part is the chunk manager's dry run, plan/offload_traffic.h).
             [&](P& p) { mb(8)(p), p.device_mem = 512 << 10, p.chunk_mb = 1.0 / 16; },
             [&](P& p) {
               mb(4)(p), p.offload = "host", p.device_mem = 512 << 10, p.chunk_mb = 1.0 / 16;
             }};
    if (quick) edits.resize(2);
  } else {
    auto dp = [&](int64_t m, int zero) {
      return [=](P& p) {
        p.dp = 2;
        mb(m, 2)(p);
        p.zero = zero;
      };
    };
    auto tp = [&](int64_t m, const std::string& mode) {
      return [=](P& p) {
        p.tp = 2;
        p.sp_mode = mode;
        mb(m)(p);
      };
    };
    auto sp = [&](int64_t m, const std::string& mode) {
      return [=](P& p) {
        p.sp = 2;
        p.sp_mode = mode;
        mb(m)(p);
      };
    };
    auto pp = [&](int64_t m, const std::string& schedule, int v) {
      return [=](P& p) {
        p.pp = 2;
        p.pp_schedule = schedule;
        p.virtual_stages = v;
        mb(m)(p);
      };
    };
    edits = {dp(8, 0),
             dp(4, 1),
             dp(8, 2),
             dp(2, 3),
             [=](P& p) { dp(8, 0)(p), p.recompute_blocks = -1; },
             [=](P& p) { dp(8, 0)(p), p.offload = "host"; },
             [=](P& p) { dp(8, 0)(p), p.device_mem = 1536 << 10, p.chunk_mb = 1.0 / 16; },
             tp(16, "none"),
             tp(16, "split_gather"),
             [=](P& p) { tp(8, "none")(p), p.recompute_blocks = -1; },
             sp(16, "ulysses"),
             sp(8, "ring"),
             pp(4, "1f1b", 1),
             pp(2, "gpipe", 1),
             pp(4, "zb", 1),
             pp(4, "interleaved", 2)};
  }
  std::vector<P> out;
  for (const auto& e : edits) {
    P p;
    p.seq_len = 64;
    p.device = "cpu";
    p.amp = "fp32";
    e(p);
    out.push_back(p);
  }
  return out;
}

struct Row {
  std::string model;
  int world = 1;
  plan::ParallelPlan plan;
  bool first_choice = false;
  double predicted = 0;
  double measured = 0;  // 0: the run failed
  double wall_min = 0, wall_median = 0;
  double share = 1;   // median over steps of rank 0's CPU time / wall time
  double speed = 1;   // the core's speed probe just before the run / at calibration
  double memory = 0;  // the memory probe just before the run, bytes/s
  std::string error;
  plan::TimePrediction time;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<double> ranks(const std::vector<double>& v) {
  std::vector<size_t> idx(v.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> r(v.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
    for (size_t k = i; k <= j; ++k) r[idx[k]] = (static_cast<double>(i + j) / 2) + 1;
    i = j + 1;
  }
  return r;
}

double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  const double n = static_cast<double>(a.size());
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) ma += ra[i] / n, mb += rb[i] / n;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : 0;
}

// Runs one plan through `mammoth train` and fills the row's step times from the steps after the
// first; false with the log's tail in `error` when the run fails. Each step's CPU time over its
// wall time (rank 0's metrics: `cpu_s`, one thread per rank) is the share of its core the rank
// got while it trained: on a machine shared with other jobs, median step x median share is the
// step time the plan would take on cores of its own, which is what calibration's CPU-clock
// figures predict. A rank that waits for a peer spins (parallel/comm), so waiting counts as
// its own time and a quiet machine's share is ~1: the measured step is then the wall step.
// (The whole run's CPU over its wall time would count mpirun's start-up, when ranks sleep.)
bool measure(const Options& o, const std::string& exe, const std::string& dir, int index, Row& row,
             std::string& error) {
  const std::string base = dir + "/plan" + std::to_string(index);
  plan::save_plan(row.plan, base + ".json");
  std::string cmd;
  if (row.world > 1) cmd = o.mpirun + " -np " + std::to_string(row.world) + " ";
  cmd += exe + " train --model " + row.model + " --plan " + base + ".json --steps " +
         std::to_string(o.steps) +
         " --threads 1 --warmup 1 --eval-every 0 --log-every 1000 --metrics " + base + ".jsonl > " +
         base + ".log 2>&1";
  fs::remove(base + ".jsonl");
  const int rc = std::system(cmd.c_str());
  std::vector<double> steps, shares;
  std::ifstream in(base + ".jsonl");
  const double tokens = static_cast<double>(row.plan.global_batch() * row.plan.seq_len);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const json::Value v = json::parse(line, base + ".jsonl");
    const json::Value* t = v.find("tokens_per_s");
    const json::Value* s = v.find("step");
    if (t == nullptr || s == nullptr || s->as_int() <= 1) continue;
    const double step = tokens / t->as_double();
    steps.push_back(step);
    if (const json::Value* c = v.find("cpu_s")) shares.push_back(c->as_double() / step);
  }
  if (rc != 0 || steps.empty()) {
    std::ifstream log(base + ".log");
    std::string all((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    error =
        "exit " + std::to_string(rc) + ": " + all.substr(all.size() > 400 ? all.size() - 400 : 0);
    return false;
  }
  row.wall_min = *std::min_element(steps.begin(), steps.end());
  row.wall_median = median(steps);
  row.share = shares.empty() ? 1.0 : std::clamp(median(shares), 0.05, 1.0);
  row.measured = o.stat == "min"      ? row.wall_min
                 : o.stat == "median" ? row.wall_median
                                      : row.wall_median * row.share;
  return true;
}

}  // namespace

int run_plan_bench(const std::vector<std::string>& args) {
  const Options o = parse(args);
  std::error_code ec;
  const std::string exe = fs::read_symlink("/proc/self/exe", ec).string();
  MAMMOTH_CHECK(!ec) << "[bench plan] cannot find this binary (/proc/self/exe): " << ec.message();
  std::string dir = o.keep;
  if (dir.empty()) {
    const char* t = std::getenv("TMPDIR");
    dir = std::string(t && *t ? t : "/tmp") + "/mammoth_bench_plan_" + std::to_string(getpid());
  }
  fs::create_directories(dir);

  // Calibrate first: the benches' figures only (one thread per rank), before any training.
  plan::Cluster cluster;
  if (o.cluster.empty()) {
    plan::CalibrateOptions c;
    c.quick = o.quick;
    c.threads_per_rank = 1;
    const bool multi = std::any_of(o.worlds.begin(), o.worlds.end(), [](int w) { return w > 1; });
    c.mpirun = multi ? o.mpirun : "none";
    c.scratch_dir = dir;
    cluster = plan::calibrate_this_machine(c);
    std::ofstream(dir + "/cluster.json") << json::dump(plan::cluster_to_json(cluster), 2) << "\n";
  } else {
    cluster = plan::load_cluster(o.cluster);
  }
  // The core's speed per CPU second now, against which each run's own probe is read.
  const double speed0 = plan::core_speed_probe(5);
  std::printf("core speed probe at calibration: %.1f GFLOP/s per CPU second\n", speed0 / 1e9);
  std::printf(
      "cluster %s: %.1f GFLOP/s peak per rank, sgemm %.1f GFLOP/s + %.2f us/call, op %.2f us, "
      "attention %.2f GFLOP/s, bandwidth %.2f GB/s, MPI %.3f GB/s + %.1f us\n",
      cluster.name.c_str(), cluster.peak_fp32 / 1e9,
      cluster.peak_fp32 * cluster.matmul_efficiency / 1e9, cluster.gemm_call_overhead * 1e6,
      cluster.op_overhead * 1e6, cluster.attention_rate / 1e9,
      cluster.device_memory_bandwidth / 1e9, cluster.intra_node.bandwidth / 1e9,
      cluster.intra_node.latency * 1e6);

  std::vector<Row> rows;
  for (const std::string& name : o.models) {
    // As `train` builds it for the embedded corpus: its vocabulary is the corpus BPE's (658
    // ids, where the registered tiny models say 512 or 1024), which sizes the LM head.
    const models::ModelConfig config = on_default_corpus(models::resolve_config(name));
    for (int world : o.worlds) {
      plan::SearchOptions s;
      s.world = world;
      s.global_batch = o.global_batch;
      s.seq_len = o.seq_len;
      s.top_k = 1;
      s.amp = "fp32";
      s.device = "cpu";
      s.offloads = {"none", "host"};
      s.runnable_only = true;
      const plan::SearchResult found = plan::search(config, cluster, s);
      std::vector<plan::ParallelPlan> plans;
      if (!found.plans.empty()) plans.push_back(found.plans[0].plan);
      for (plan::ParallelPlan p : variants(world, o.global_batch, o.quick)) {
        p.seq_len = o.seq_len;
        if (!plan::check(p, {.world = world, .model = &config, .run = true}).empty()) continue;
        if (std::find(plans.begin(), plans.end(), p) != plans.end()) continue;
        plans.push_back(p);
      }
      plan::TimeModel model(config, cluster);
      for (size_t i = 0; i < plans.size(); ++i) {
        Row r;
        r.model = name;
        r.world = world;
        r.plan = plans[i];
        r.first_choice = i == 0 && !found.plans.empty();
        r.time = model.predict(r.plan);
        r.predicted = r.time.step_time;
        rows.push_back(r);
      }
    }
  }

  std::printf("\nmeasured: %s\n", o.stat == "cpu"
                                      ? "median step x the CPU share the run got (cores of its own)"
                                  : o.stat == "min" ? "the fastest step after the first (wall)"
                                                    : "the median step after the first (wall)");
  std::printf(
      "speed: the core's probe before the run / at calibration; adj: the prediction divided by "
      "it\n");
  std::printf("%3s %-10s %2s %-62s %10s %10s %8s %6s %8s\n", "#", "model", "np", "plan", "pred_ms",
              "meas_ms", "error", "speed", "adj");
  for (size_t i = 0; i < rows.size(); ++i) {
    Row& r = rows[i];
    r.speed = plan::core_speed_probe() / speed0;
    r.memory = plan::memory_speed_probe();
    measure(o, exe, dir, static_cast<int>(i), r, r.error);
    const std::string summary = (r.first_choice ? "* " : "  ") + plan::plan_summary(r.plan);
    if (r.measured > 0) {
      std::printf(
          "%3zu %-10s %2d %-62s %10.2f %10.2f %+7.1f%% %6.2f %+7.1f%%  (wall min %.2f, median "
          "%.2f, cpu share %.2f)\n",
          i, r.model.c_str(), r.world, summary.c_str(), r.predicted * 1e3, r.measured * 1e3,
          100 * (r.predicted - r.measured) / r.measured, r.speed,
          100 * (r.predicted / r.speed - r.measured) / r.measured, r.wall_min * 1e3,
          r.wall_median * 1e3, r.share);
    } else {
      std::printf("%3zu %-10s %2d %-62s %10.2f %10s   failed: %s\n", i, r.model.c_str(), r.world,
                  summary.c_str(), r.predicted * 1e3, "-", r.error.c_str());
    }
    std::fflush(stdout);
  }

  std::vector<double> errors, adj_errors, pred, adj_pred, meas;
  int failed = 0;
  for (const Row& r : rows) {
    if (r.measured <= 0) {
      ++failed;
      continue;
    }
    errors.push_back(std::fabs(r.predicted - r.measured) / r.measured);
    adj_errors.push_back(std::fabs(r.predicted / r.speed - r.measured) / r.measured);
    pred.push_back(r.predicted);
    adj_pred.push_back(r.predicted / r.speed);
    meas.push_back(r.measured);
  }
  const double med = median(errors);
  const double worst = errors.empty() ? 0 : *std::max_element(errors.begin(), errors.end());
  const double rho = spearman(pred, meas);
  const double adj_med = median(adj_errors);
  const double adj_worst =
      adj_errors.empty() ? 0 : *std::max_element(adj_errors.begin(), adj_errors.end());
  std::printf("\nplans %zu measured, %d failed (* = the search's first choice)\n", errors.size(),
              failed);
  std::printf(
      "median |error| %.1f%% (target <= 15%%), worst %.1f%% (<= 35%%), Spearman %.3f "
      "(>= 0.8)\n",
      100 * med, 100 * worst, rho);
  std::printf(
      "with each prediction divided by its run's core speed: median |error| %.1f%%, worst "
      "%.1f%%, Spearman %.3f\n",
      100 * adj_med, 100 * adj_worst, spearman(adj_pred, meas));
  // A calibration taken while the memory system was slower (or faster) than during the runs
  // puts that into every prediction, and the FMA probe does not see it: say so.
  std::vector<double> memory;
  for (const Row& r : rows) {
    if (r.memory > 0) memory.push_back(r.memory);
  }
  // (Only against a calibration of this machine: a cluster file's host bandwidth is another
  // machine's.)
  const double memory_ratio =
      memory.empty() || !o.cluster.empty() ? 1.0 : cluster.host_memory_bandwidth / median(memory);
  if (o.cluster.empty() && !memory.empty()) {
    std::printf(
        "memory probe: calibration's memcpy %.1f GB/s, the runs' median %.1f GB/s (%.2fx)\n",
        cluster.host_memory_bandwidth / 1e9, median(memory) / 1e9, memory_ratio);
  }
  if (memory_ratio < 0.85 || memory_ratio > 1.0 / 0.85) {
    std::printf(
        "warning: the machine's memory bandwidth moved by more than 15%% between calibration and "
        "the runs; the predictions carry the difference: run again on a quieter machine\n");
  }
  json::Value groups = json::Value::array();
  for (const std::string& name : o.models) {
    for (int world : o.worlds) {
      double fastest = 0, chosen = 0;
      std::string fastest_plan;
      for (const Row& r : rows) {
        if (r.model != name || r.world != world || r.measured <= 0) continue;
        if (fastest == 0 || r.measured < fastest) {
          fastest = r.measured;
          fastest_plan = plan::plan_summary(r.plan);
        }
        if (r.first_choice) chosen = r.measured;
      }
      if (fastest == 0 || chosen == 0) continue;
      const double gap = chosen / fastest - 1;
      std::printf("first choice %s np %d: %.2f ms vs fastest %.2f ms (%s): %+.1f%% (%s 10%%)\n",
                  name.c_str(), world, chosen * 1e3, fastest * 1e3, fastest_plan.c_str(), 100 * gap,
                  gap <= 0.10 ? "within" : "outside");
      groups.push_back(json::Value::object()
                           .set("model", name)
                           .set("world", world)
                           .set("first_choice_s", chosen)
                           .set("fastest_s", fastest)
                           .set("fastest_plan", fastest_plan)
                           .set("gap", gap));
    }
  }
  if (!o.json_path.empty()) {
    json::Value arr = json::Value::array();
    for (const Row& r : rows) {
      arr.push_back(json::Value::object()
                        .set("model", r.model)
                        .set("world", r.world)
                        .set("plan", plan::plan_to_json(r.plan))
                        .set("first_choice", r.first_choice)
                        .set("predicted_s", r.predicted)
                        .set("measured_s", r.measured)
                        .set("wall_min_s", r.wall_min)
                        .set("wall_median_s", r.wall_median)
                        .set("cpu_share", r.share)
                        .set("core_speed", r.speed)
                        .set("memory_GBps", r.memory / 1e9)
                        .set("prediction", r.time.to_json()));
    }
    std::ofstream(o.json_path) << json::dump(json::Value::object()
                                                 .set("cluster", plan::cluster_to_json(cluster))
                                                 .set("plans", std::move(arr))
                                                 .set("median_abs_error", med)
                                                 .set("worst_abs_error", worst)
                                                 .set("spearman", rho)
                                                 .set("calibration_memory_ratio", memory_ratio)
                                                 .set("speed_adjusted_median_abs_error", adj_med)
                                                 .set("speed_adjusted_worst_abs_error", adj_worst)
                                                 .set("first_choice", std::move(groups)),
                                             2)
                               << "\n";
  }
  if (o.keep.empty()) fs::remove_all(dir, ec);
  return failed == 0 && !errors.empty() ? 0 : 1;
}

}  // namespace mammoth::tools
