#include "tools/bench/train/train_bench.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "base/error.h"
#include "base/json.h"
#include "base/thread_pool.h"
#include "engine/amp/amp.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/mesh.h"

namespace mammoth::tools {
namespace {

namespace fs = std::filesystem;
using engine::Tensor;

struct Options {
  std::vector<std::string> models = {"gpt2-tiny", "gpt2"};
  std::vector<std::string> amps = {"fp32", "bf16"};
  int64_t batch = 4;
  int64_t seq = 64;
  int threads = 0;
  int steps = 5;
  int warmup = 2;
  std::string json_path;
  std::string python;
  std::string script;
  bool torch = true;
  std::vector<int> tp;  // --tp 1,2,4: tensor-parallel scaling rows (under mpirun)
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

int64_t parse_int(const std::string& flag, const std::string& v) {
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MAMMOTH_CHECK(used == v.size() && used > 0 && n >= 0)
      << "[bench train] " << flag << " needs a non-negative integer, got '" << v << "'";
  return n;
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    const size_t eq = flag.find('=');
    if (eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    std::replace(flag.begin(), flag.end(), '_', '-');
    if (flag == "--no-torch") {
      o.torch = false;
      continue;
    }
    if (eq == std::string::npos) {
      MAMMOTH_CHECK(i + 1 < args.size()) << "[bench train] " << flag << " needs a value";
      value = args[++i];
    }
    if (flag == "--models" || flag == "--model") {
      o.models = split_list(value);
    } else if (flag == "--amp") {
      o.amps = split_list(value);
      for (const std::string& a : o.amps) engine::amp::parse_precision(a, "--amp");
    } else if (flag == "--batch" || flag == "--micro-batch") {
      o.batch = parse_int(flag, value);
    } else if (flag == "--seq" || flag == "--seq-len") {
      o.seq = parse_int(flag, value);
    } else if (flag == "--threads") {
      o.threads = static_cast<int>(parse_int(flag, value));
    } else if (flag == "--steps") {
      o.steps = static_cast<int>(parse_int(flag, value));
    } else if (flag == "--warmup") {
      o.warmup = static_cast<int>(parse_int(flag, value));
    } else if (flag == "--json") {
      o.json_path = value;
    } else if (flag == "--python") {
      o.python = value;
    } else if (flag == "--torch-script") {
      o.script = value;
    } else if (flag == "--tp") {
      for (const std::string& t : split_list(value)) {
        o.tp.push_back(static_cast<int>(parse_int(flag, t)));
        MAMMOTH_CHECK(o.tp.back() >= 1) << "[bench train] --tp sizes must be >= 1, got " << t;
      }
    } else {
      MAMMOTH_THROW() << "[bench train] unknown option '" << args[i]
                      << "' (known: --models --amp --batch --seq --threads --steps --warmup "
                         "--json --python --torch-script --no-torch --tp)";
    }
  }
  MAMMOTH_CHECK(o.batch > 0 && o.seq > 0 && o.steps > 0 && !o.models.empty() && !o.amps.empty())
      << "[bench train] --batch, --seq, --steps must be > 0 and --models, --amp non-empty";
  return o;
}

// tools/bench/train/train_bench.py: given, beside the working directory, or in Bazel runfiles.
std::string find_script(const Options& o) {
  if (!o.script.empty()) return o.script;
  std::vector<std::string> candidates = {"tools/bench/train/train_bench.py"};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(exe.string() + ".runfiles/mammoth/tools/bench/train/train_bench.py");
    // bazel-bin/tools/<binary>: the source tree is three levels up from bazel-out/.../bin.
    for (fs::path p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path()) {
      candidates.push_back((p / "tools/bench/train/train_bench.py").string());
    }
  }
  for (const std::string& c : candidates)
    if (fs::exists(c)) return c;
  MAMMOTH_THROW()
      << "[bench train] cannot find tools/bench/train/train_bench.py; run from the repo "
         "root or pass --torch-script PATH (or --no-torch)";
}

struct Measured {
  double ms = 0;
  double cpu_ms = 0;  // process CPU time (all threads) per step: less sensitive to other load
  double loss = 0;
};

double process_cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

Measured bench_ours(models::LanguageModel& model, const Options& o,
                    engine::amp::Precision precision,
                    const std::function<void()>& after_backward = {}) {
  const int64_t V = model.config().vocab_size;
  // Random ids as int64 [B, T+1]; inputs and targets are its two shifted views, made contiguous.
  const Tensor r = Tensor::rand({o.batch, o.seq + 1}, 1, 0.0, static_cast<double>(V) - 0.5);
  std::vector<int64_t> ids;
  for (double v : r.to_vector()) ids.push_back(static_cast<int64_t>(v));
  std::vector<int64_t> in, tg;
  for (int64_t b = 0; b < o.batch; ++b)
    for (int64_t t = 0; t < o.seq; ++t) {
      in.push_back(ids[b * (o.seq + 1) + t]);
      tg.push_back(ids[b * (o.seq + 1) + t + 1]);
    }
  const Tensor x = Tensor::from_ints(in, {o.batch, o.seq});
  const Tensor y = Tensor::from_ints(tg, {o.batch, o.seq});
  engine::optim::AdamWOptions ao;
  ao.lr = 1e-4;
  ao.weight_decay = 0.1;
  engine::optim::AdamW opt(model.named_parameters(), ao);
  model.train();
  Measured m;
  auto step = [&] {
    engine::amp::AutocastGuard autocast(precision);
    Tensor loss = model.loss(x, y);
    m.loss = loss.item();
    loss.backward();
    if (after_backward) after_backward();
    opt.step();
    opt.zero_grad();
  };
  for (int i = 0; i < o.warmup; ++i) step();
  std::vector<double> times, cpu;
  for (int i = 0; i < o.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = process_cpu_ms();
    step();
    cpu.push_back(process_cpu_ms() - c0);
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  std::sort(cpu.begin(), cpu.end());
  m.ms = times[times.size() / 2];
  m.cpu_ms = cpu[cpu.size() / 2];
  return m;
}

json::Value bench_torch(const models::ModelConfig& c, const Options& o, const std::string& amp,
                        const std::string& python, const std::string& script) {
  std::ostringstream cmd;
  cmd << "'" << python << "' '" << script << "' --n-layer " << c.n_layer << " --n-head " << c.n_head
      << " --d-model " << c.d_model << " --vocab " << c.vocab_size << " --max-seq " << c.max_seq
      << " --batch " << o.batch << " --seq " << o.seq << " --threads " << num_threads()
      << " --steps " << o.steps << " --warmup " << o.warmup << " --amp " << amp;
  FILE* pipe = ::popen(cmd.str().c_str(), "r");
  MAMMOTH_CHECK(pipe != nullptr) << "[bench train] cannot run " << cmd.str();
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), pipe)) out.append(buf, n);
  const int rc = ::pclose(pipe);
  MAMMOTH_CHECK(rc == 0) << "[bench train] the PyTorch anchor failed (exit " << rc
                         << "): " << cmd.str();
  const size_t start = out.rfind("\n{");
  return json::parse(out.substr(start == std::string::npos ? 0 : start + 1), "train_bench.py");
}

// Tensor-parallel scaling: the same step (model, batch, amp) on the first t ranks of the job
// as a tp=t group (GPT-2/LLaMA/BERT policies), for each t of --tp; the anchor is tp=1 measured
// in the same run. Step time is the slowest rank's. Ranks outside the group wait.
int run_tp_bench(const Options& o) {
  auto world = parallel::mpi_world();
  const int n = world->size(), rank = world->rank();
  const int most = *std::max_element(o.tp.begin(), o.tp.end());
  MAMMOTH_CHECK(most <= n) << "[bench train] --tp " << most << " needs at least " << most
                           << " ranks: mpirun -np " << most << " mammoth bench train --tp ...";
  if (rank == 0) {
    std::printf(
        "tensor-parallel train step, B%lld T%lld, %d thread(s) per rank, %d ranks; "
        "anchor: tp=1 in the same run\n",
        static_cast<long long>(o.batch), static_cast<long long>(o.seq), num_threads(), n);
    std::printf("%-12s %-5s %4s %12s %12s %10s\n", "model", "amp", "tp", "ms/step", "tok/s",
                "vs tp=1");
  }
  json::Value rows = json::Value::array();
  for (const std::string& name : o.models) {
    for (const std::string& amp : o.amps) {
      double ms_tp1 = 0;
      for (int t : o.tp) {
        MPI_Comm sub = MPI_COMM_NULL;
        parallel::mpi_check(MPI_Comm_split(world->comm(), rank < t ? 0 : MPI_UNDEFINED, rank, &sub),
                            "MPI_Comm_split");
        double ms = 0;
        if (sub != MPI_COMM_NULL) {
          auto group =
              std::make_shared<parallel::MpiCommunicator>(sub, "tp_bench", world->options());
          parallel::DeviceMesh mesh(group, {.tp = t});
          models::ModelOptions mo;
          mo.max_seq = std::max<int64_t>(o.seq, 1);
          mo.seed = 1;
          auto model = models::create_language_model(name, mo);
          std::shared_ptr<models::LanguageModel> trained = model;
          std::shared_ptr<models::ShardedLanguageModel> sharded;
          if (t > 1) {
            sharded = models::apply_policy(*model, mesh);
            trained = sharded;
          }
          const Measured m =
              bench_ours(*trained, o, engine::amp::parse_precision(amp),
                         sharded ? std::function<void()>([&] { sharded->sync_grads(); })
                                 : std::function<void()>());
          engine::Tensor slowest = engine::Tensor::from_vector({m.ms}, {1}, DType::kF64);
          group->all_reduce(slowest, parallel::ReduceOp::kMax);
          ms = slowest.item();
        }
        world->barrier();
        if (rank != 0) continue;
        if (t == 1) ms_tp1 = ms;
        const double tokens = static_cast<double>(o.batch * o.seq);
        std::printf("%-12s %-5s %4d %12.1f %12.1f %9.2fx\n", name.c_str(), amp.c_str(), t, ms,
                    tokens / (ms / 1e3), ms_tp1 > 0 ? ms_tp1 / ms : 0.0);
        std::fflush(stdout);
        json::Value row = json::Value::object();
        row.set("name", json::Value("train_" + name + "_" + amp + "_tp" + std::to_string(t)));
        row.set("shape", json::Value("B" + std::to_string(o.batch) + " T" + std::to_string(o.seq)));
        row.set("threads", json::Value(static_cast<int64_t>(num_threads())));
        row.set("tp", json::Value(static_cast<int64_t>(t)));
        row.set("ours", json::Value(tokens / (ms / 1e3)));
        row.set("ours_ms", json::Value(ms));
        row.set("unit", json::Value("tokens/s"));
        if (ms_tp1 > 0) {
          row.set("anchor", json::Value(tokens / (ms_tp1 / 1e3)));
          row.set("ratio", json::Value(ms_tp1 / ms));
        }
        rows.push_back(row);
      }
    }
  }
  if (rank == 0 && !o.json_path.empty()) {
    std::ofstream f(o.json_path);
    MAMMOTH_CHECK(f.good()) << "[bench train] cannot write --json " << o.json_path;
    f << json::dump(rows, 2) << "\n";
  }
  return 0;
}

}  // namespace

int run_train_bench(const std::vector<std::string>& args) {
  const Options o = parse(args);
  if (!o.tp.empty()) {
    set_num_threads(o.threads);
    return run_tp_bench(o);
  }
  set_num_threads(o.threads);
  std::string python = o.python;
  if (python.empty()) {
    const char* env = std::getenv("MAMMOTH_PYTHON");
    python = env && *env ? env : "/usr/bin/python3";
  }
  const std::string script = o.torch ? find_script(o) : "";
  // OpenBLAS reads its core type when torch loads it; the script also sets it, this makes the
  // command line printed below complete.
  std::printf("train step, B%lld T%lld, %d threads; anchor: PyTorch eager (%s)\n",
              static_cast<long long>(o.batch), static_cast<long long>(o.seq), num_threads(),
              o.torch ? python.c_str() : "skipped");
  std::printf("%-12s %-5s %10s %12s %12s %12s %7s %12s\n", "model", "amp", "params", "ours ms",
              "torch ms", "ours tok/s", "ratio", "ours cpu ms");
  json::Value rows = json::Value::array();
  std::string blas;
  for (const std::string& name : o.models) {
    models::ModelOptions mo;
    mo.max_seq = std::max<int64_t>(o.seq, 1);
    mo.seed = 1;
    auto model = models::create_language_model(name, mo);
    const models::ModelConfig& cfg = model->config();
    for (const std::string& amp : o.amps) {
      const Measured ours = bench_ours(*model, o, engine::amp::parse_precision(amp));
      const double tokens = static_cast<double>(o.batch * o.seq);
      json::Value row = json::Value::object();
      row.set("name", json::Value("train_" + name + "_" + amp));
      row.set("shape", json::Value("B" + std::to_string(o.batch) + " T" + std::to_string(o.seq)));
      row.set("threads", json::Value(static_cast<int64_t>(num_threads())));
      row.set("ours", json::Value(tokens / (ours.ms / 1e3)));
      row.set("ours_ms", json::Value(ours.ms));
      row.set("ours_cpu_ms", json::Value(ours.cpu_ms));
      row.set("unit", json::Value("tokens/s"));
      row.set("params", json::Value(model->num_parameters()));
      double torch_ms = 0;
      if (o.torch) {
        const json::Value t = bench_torch(cfg, o, amp, python, script);
        torch_ms = t.at("ms_per_step").as_double();
        row.set("anchor", json::Value(tokens / (torch_ms / 1e3)));
        row.set("anchor_ms", json::Value(torch_ms));
        row.set("ratio", json::Value(torch_ms / ours.ms));
        row.set("anchor_blas", t.at("blas"));
        row.set("anchor_threads", t.at("threads"));
        blas = json::dump(t.at("blas")) +
               ", OPENBLAS_CORETYPE=" + t.at("openblas_coretype").as_string() + ", torch " +
               t.at("torch").as_string();
      }
      std::printf("%-12s %-5s %9.1fM %12.1f %12.1f %12.1f %6.2fx %12.1f\n", name.c_str(),
                  amp.c_str(), static_cast<double>(model->num_parameters()) / 1e6, ours.ms,
                  torch_ms, tokens / (ours.ms / 1e3), o.torch ? torch_ms / ours.ms : 0.0,
                  ours.cpu_ms);
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  if (!blas.empty()) std::printf("PyTorch BLAS: %s\n", blas.c_str());
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    MAMMOTH_CHECK(f.good()) << "[bench train] cannot write --json " << o.json_path;
    f << json::dump(rows, 2) << "\n";
  }
  return 0;
}

}  // namespace mammoth::tools
