#include "tools/bench/train/train_bench.h"

#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>

#include "base/cpu_time.h"
#include "base/error.h"
#include "base/json.h"
#include "base/thread_pool.h"
#include "engine/amp/amp.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "engine/optim/optim.h"
#include "kernels/cpu/fma_loop.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa_env.h"
#include "kernels/cpu/simd.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/mesh.h"
#include "tools/bench/anchor_isa.h"

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
  bool compile = true;  // also time the anchor under torch.compile (when its torch has it)
  int rounds = 3;       // alternating rounds: ours, eager, compiled, ours, ...
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
    if (flag == "--no-compile") {
      o.compile = false;
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
    } else if (flag == "--rounds") {
      o.rounds = static_cast<int>(parse_int(flag, value));
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
                         "--json --python --torch-script --no-torch --no-compile --rounds --tp)";
    }
  }
  MAMMOTH_CHECK(o.batch > 0 && o.seq > 0 && o.steps > 0 && o.rounds > 0 && !o.models.empty() &&
                !o.amps.empty())
      << "[bench train] --batch, --seq, --steps, --rounds must be > 0 and --models, --amp "
         "non-empty";
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

// The benched model: dropout off, because the PyTorch anchor (train_bench.py) has none, and
// with it our step would do work theirs does not (the dropout masks, and attention through
// materialised probabilities instead of the fused kernel).
models::ModelOptions bench_model_options(const Options& o) {
  models::ModelOptions mo;
  mo.max_seq = std::max<int64_t>(o.seq, 1);
  mo.seed = 1;
  mo.dropout = 0.0;
  return mo;
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
    const double c0 = process_cpu_seconds() * 1e3;
    step();
    cpu.push_back(process_cpu_seconds() * 1e3 - c0);
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  std::sort(cpu.begin(), cpu.end());
  m.ms = times[times.size() / 2];
  m.cpu_ms = cpu[cpu.size() / 2];
  return m;
}

// The PyTorch anchor (train_bench.py) as a child process that stays up for the whole row: it
// builds its model once, compiles once, then times `--steps` steps of a mode for each line we
// send, so its rounds alternate with ours in one job. Its stderr is ours (torch's warnings).
class TorchAnchor {
 public:
  explicit TorchAnchor(const std::string& cmd) : cmd_(cmd) {
    int in[2], out[2];
    MAMMOTH_CHECK(::pipe(in) == 0 && ::pipe(out) == 0) << "[bench train] pipe failed";
    std::fflush(nullptr);
    pid_ = ::fork();
    MAMMOTH_CHECK(pid_ >= 0) << "[bench train] fork failed";
    if (pid_ == 0) {
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      for (int fd : {in[0], in[1], out[0], out[1]}) ::close(fd);
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(in[0]);
    ::close(out[1]);
    to_ = ::fdopen(in[1], "w");
    from_ = ::fdopen(out[0], "r");
    // A child that dies while we write must be an error message, not our SIGPIPE.
    old_sigpipe_ = std::signal(SIGPIPE, SIG_IGN);
    info_ = read_reply();
  }
  ~TorchAnchor() {
    std::fclose(to_);  // EOF on its stdin: the script exits
    std::fclose(from_);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    std::signal(SIGPIPE, old_sigpipe_);
  }
  TorchAnchor(const TorchAnchor&) = delete;
  TorchAnchor& operator=(const TorchAnchor&) = delete;

  // The script's first line: torch version, CPU capability, whether it can compile, BLAS.
  const json::Value& info() const { return info_; }

  // Times one round of `mode` ("eager" or "compiled"); {"ms_per_step", ...}.
  json::Value run(const std::string& mode) {
    MAMMOTH_CHECK(std::fprintf(to_, "%s\n", mode.c_str()) > 0 && std::fflush(to_) == 0)
        << "[bench train] the PyTorch anchor exited: " << cmd_;
    json::Value v = read_reply();
    MAMMOTH_CHECK(!v.contains("error"))
        << "[bench train] the PyTorch anchor: " << v.at("error").as_string();
    return v;
  }

 private:
  // The next stdout line that is a JSON object (anything else torch prints is skipped).
  json::Value read_reply() {
    char* line = nullptr;
    size_t cap = 0;
    std::string last;
    while (::getline(&line, &cap, from_) > 0) {
      last = line;
      while (!last.empty() && (last.back() == '\n' || last.back() == '\r')) last.pop_back();
      if (!last.empty() && last.front() == '{') break;
      last.clear();
    }
    std::free(line);
    MAMMOTH_CHECK(!last.empty()) << "[bench train] the PyTorch anchor exited without a result: "
                                 << cmd_;
    return json::parse(last, "train_bench.py");
  }

  std::string cmd_;
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
  void (*old_sigpipe_)(int) = SIG_DFL;
  json::Value info_;
};

// Which Python runs the anchor, and why: --python, else $MAMMOTH_ANCHOR_PYTHON, else the
// PyTorch 2.x venv of `tools/setup.sh --bench-anchor`, else $MAMMOTH_PYTHON or Debian's python3
// (torch 1.13, eager only), labelled as the fallback it is.
struct AnchorPython {
  std::string python;
  std::string source;
};

AnchorPython find_anchor_python(const Options& o) {
  if (!o.python.empty()) return {o.python, "--python"};
  if (const char* env = std::getenv("MAMMOTH_ANCHOR_PYTHON"); env != nullptr && *env != '\0') {
    MAMMOTH_CHECK(::access(env, X_OK) == 0)
        << "[bench train] MAMMOTH_ANCHOR_PYTHON=" << env << " is not an executable";
    return {env, "MAMMOTH_ANCHOR_PYTHON"};
  }
  const char* home = std::getenv("HOME");
  const std::string venv =
      std::string(home != nullptr ? home : "") + "/.cache/mammoth/venv-torch2/bin/python-anchor";
  if (home != nullptr && ::access(venv.c_str(), X_OK) == 0) {
    return {venv, "the PyTorch 2.x venv of tools/setup.sh --bench-anchor"};
  }
  const char* env = std::getenv("MAMMOTH_PYTHON");
  const std::string py = env != nullptr && *env != '\0' ? env : "/usr/bin/python3";
  return {py, "FALLBACK: no PyTorch 2.x anchor at " + venv +
                  " (bash tools/setup.sh --bench-anchor installs it); Debian's torch, eager"};
}

// The median of the rounds (the mean of the middle two for an even count).
double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 == 1 ? v[h] : 0.5 * (v[h - 1] + v[h]);
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
          auto model = models::create_language_model(name, bench_model_options(o));
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

// The machine's fp32 FMA peak at `threads` threads, in the register width our kernels run
// (zmm under AVX-512, else ymm): every thread runs the FMA chains of kernels/cpu/fma_loop.h at
// once, best of three, in GFLOP/s. The step's 6ND FLOPs are read against it (issue 27's figure).
double fma_peak_gflops(int threads, bool zmm) {
  const int64_t iters = 20000000;
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    std::vector<std::thread> workers;
    const auto start = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t)
      workers.emplace_back([zmm, iters] { kernels::cpu::run_fma_chains(zmm, iters); });
    for (std::thread& w : workers) w.join();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, threads * kernels::cpu::fma_chain_flops(zmm, iters) / s / 1e9);
  }
  return best;
}

}  // namespace

int run_train_bench(const std::vector<std::string>& args) {
  const Options o = parse(args);
  if (!o.tp.empty()) {
    set_num_threads(o.threads);
    return run_tp_bench(o);
  }
  set_num_threads(o.threads);
  const AnchorPython anchor = o.torch ? find_anchor_python(o) : AnchorPython{};
  const std::string script = o.torch ? find_script(o) : "";
  // The anchor's environment: our thread count for OpenMP / MKL too (inductor's generated code
  // reads OMP_NUM_THREADS), and AVX2 caps when our kernels run AVX2 on an AVX-512 CPU.
  const std::string env = "OMP_NUM_THREADS=" + std::to_string(num_threads()) +
                          " MKL_NUM_THREADS=" + std::to_string(num_threads()) + " " +
                          (anchor_capped_at_avx2() ? kAnchorAvx2Env : "");
  std::printf(
      "train step, B%lld T%lld, no dropout (as the anchor), %d threads, %d rounds (ours, "
      "eager%s, ours, ...), "
      "medians; ours: fused kernels %s, sgemm %s (%s)\n",
      static_cast<long long>(o.batch), static_cast<long long>(o.seq), num_threads(), o.rounds,
      o.compile ? ", compiled" : "", kernels::cpu::simd_isa_name(kernels::cpu::active_simd_isa()),
      kernels::cpu::gemm_isa_name(kernels::cpu::active_gemm_isa()),
      kernels::cpu::isa_request_source().c_str());
  if (o.torch) {
    std::printf("anchor python: %s (%s)\nanchor environment: %s\n", anchor.python.c_str(),
                anchor.source.c_str(), env.c_str());
  } else {
    std::printf("anchor: skipped (--no-torch)\n");
  }
  const bool zmm = kernels::cpu::active_simd_isa() == kernels::cpu::SimdIsa::kAvx512;
  const double peak = fma_peak_gflops(num_threads(), zmm);
  std::printf("fp32 FMA peak: %.1f GFLOP/s (%d threads, %s registers, kernels/cpu/fma_loop)\n",
              peak, num_threads(), zmm ? "zmm" : "ymm");
  json::Value rows = json::Value::array();
  for (const std::string& name : o.models) {
    auto model = models::create_language_model(name, bench_model_options(o));
    const models::ModelConfig& c = model->config();
    for (const std::string& amp : o.amps) {
      std::unique_ptr<TorchAnchor> torch;
      std::vector<std::string> modes;
      if (o.torch) {
        std::ostringstream cmd;
        cmd << env << "'" << anchor.python << "' '" << script << "' --n-layer " << c.n_layer
            << " --n-head " << c.n_head << " --d-model " << c.d_model << " --vocab " << c.vocab_size
            << " --max-seq " << c.max_seq << " --batch " << o.batch << " --seq " << o.seq
            << " --threads " << num_threads() << " --steps " << o.steps << " --warmup " << o.warmup
            << " --amp " << amp;
        torch = std::make_unique<TorchAnchor>(cmd.str());
        const json::Value& in = torch->info();
        const bool can_compile = in.at("compile").as_bool();
        modes.push_back("eager");
        if (o.compile && can_compile) modes.push_back("compiled");
        std::printf(
            "anchor for %s %s: torch %s, ATen CPU capability %s, inductor ISA %s, %lld threads, "
            "SDPA %s, fused AdamW %s, MKL %s, oneDNN %s, BLAS mapped %s%s\n",
            name.c_str(), amp.c_str(), in.at("torch").as_string().c_str(),
            in.at("cpu_capability").as_string().c_str(), in.at("inductor_isa").as_string().c_str(),
            static_cast<long long>(in.at("threads").as_int()),
            in.at("sdpa").as_bool() ? "yes" : "no", in.at("fused_adamw").as_bool() ? "yes" : "no",
            in.at("mkl").as_bool() ? "yes" : "no", in.at("mkldnn").as_bool() ? "yes" : "no",
            json::dump(in.at("blas")).c_str(),
            can_compile ? ""
            : o.compile ? "; this torch has no torch.compile: eager only"
                        : "");
        MAMMOTH_CHECK(in.at("threads").as_int() == num_threads())
            << "[bench train] the anchor runs " << in.at("threads").as_int() << " threads, not "
            << num_threads();
      }
      std::vector<double> ours_ms, ours_cpu;
      std::vector<std::vector<double>> torch_ms(modes.size());
      for (int r = 0; r < o.rounds; ++r) {
        const Measured m = bench_ours(*model, o, engine::amp::parse_precision(amp));
        ours_ms.push_back(m.ms);
        ours_cpu.push_back(m.cpu_ms);
        std::printf("  %s %s round %d: ours %.1f ms", name.c_str(), amp.c_str(), r + 1, m.ms);
        for (size_t i = 0; i < modes.size(); ++i) {
          const json::Value t = torch->run(modes[i]);
          torch_ms[i].push_back(t.at("ms_per_step").as_double());
          std::printf(", %s %.1f ms", modes[i].c_str(), torch_ms[i].back());
          const double warm = t.at("warmup_s").as_double();
          if (warm > 0) std::printf(" (warm-up %.1f s)", warm);
        }
        std::printf("\n");
        std::fflush(stdout);
      }
      const double tokens = static_cast<double>(o.batch * o.seq);
      const double ms = median(ours_ms);
      json::Value row = json::Value::object();
      row.set("name", json::Value("train_" + name + "_" + amp));
      row.set("shape", json::Value("B" + std::to_string(o.batch) + " T" + std::to_string(o.seq)));
      row.set("threads", json::Value(static_cast<int64_t>(num_threads())));
      row.set("rounds", json::Value(static_cast<int64_t>(o.rounds)));
      row.set("ours", json::Value(tokens / (ms / 1e3)));
      row.set("ours_ms", json::Value(ms));
      row.set("ours_cpu_ms", json::Value(median(ours_cpu)));
      row.set("unit", json::Value("tokens/s"));
      row.set("params", json::Value(model->num_parameters()));
      row.set("dropout", json::Value(c.dropout));
      row.set("attn_dropout", json::Value(c.attn_dropout));
      std::printf("%-12s %-5s %9.1fM  ours %.1f ms (%.1f tok/s, cpu %.1f ms)", name.c_str(),
                  amp.c_str(), static_cast<double>(model->num_parameters()) / 1e6, ms,
                  tokens / (ms / 1e3), median(ours_cpu));
      for (size_t i = 0; i < modes.size(); ++i) {
        // "anchor" / "ratio" are the eager anchor's (as before); the compiled one has its own.
        const double t = median(torch_ms[i]);
        const std::string key = modes[i] == "eager" ? "" : "_" + modes[i];
        row.set("anchor" + key, json::Value(tokens / (t / 1e3)));
        row.set("anchor" + key + "_ms", json::Value(t));
        row.set("ratio" + key, json::Value(t / ms));
        std::printf(", %s %.1f ms (ours %.2fx)", modes[i].c_str(), t, t / ms);
      }
      std::printf("\n");
      // 6ND: the step's FLOPs as issue 27 counts them (6 x parameters x tokens), each side's
      // rate as a fraction of the peak measured above.
      const double flops = 6.0 * static_cast<double>(model->num_parameters()) * tokens;
      row.set("flops_6nd", json::Value(flops));
      row.set("fma_peak_gflops", json::Value(peak));
      row.set("ours_peak_fraction", json::Value(flops / (ms / 1e3) / (peak * 1e9)));
      std::printf("%-12s %-5s 6ND %.1f GFLOP: ours %.1f GFLOP/s = %.1f%% of the FMA peak",
                  name.c_str(), amp.c_str(), flops / 1e9, flops / ms / 1e6,
                  100 * flops / (ms / 1e3) / (peak * 1e9));
      for (size_t i = 0; i < modes.size(); ++i) {
        const double t = median(torch_ms[i]);
        const std::string key = modes[i] == "eager" ? "" : "_" + modes[i];
        row.set("anchor" + key + "_peak_fraction", json::Value(flops / (t / 1e3) / (peak * 1e9)));
        std::printf(", %s %.1f%%", modes[i].c_str(), 100 * flops / (t / 1e3) / (peak * 1e9));
      }
      std::printf("\n");
      if (torch) {
        const json::Value& in = torch->info();
        row.set("anchor_torch", in.at("torch"));
        row.set("anchor_cpu_capability", in.at("cpu_capability"));
        row.set("anchor_inductor_isa", in.at("inductor_isa"));
        row.set("anchor_blas", in.at("blas"));
        row.set("anchor_threads", in.at("threads"));
        row.set("anchor_python_source", json::Value(anchor.source));
      }
      std::fflush(stdout);
      rows.push_back(row);
    }
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    MAMMOTH_CHECK(f.good()) << "[bench train] cannot write --json " << o.json_path;
    f << json::dump(rows, 2) << "\n";
  }
  return 0;
}

}  // namespace mammoth::tools
