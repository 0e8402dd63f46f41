// `mammoth bench <name> [flags]`: the benchmark harness. Each benchmark prints its figure beside
// an anchor measured in the same run (OpenBLAS, STREAM, MPI, fio, PyTorch) as a ratio, and
// writes one JSON object per row with --json FILE. Benchmarks parse their own flags.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "tools/bench/comm_bench.h"
#include "tools/bench/dp_bench.h"
#include "tools/bench/gemm_bench.h"
#include "tools/bench/io_bench.h"
#include "tools/bench/kernels_bench.h"
#include "tools/bench/moe_bench.h"
#include "tools/bench/offload_bench.h"
#include "tools/bench/plan_bench.h"
#include "tools/bench/serve_bench.h"
#include "tools/bench/train/train_bench.h"
#include "tools/command.h"

namespace mammoth::tools {
namespace {

struct Bench {
  const char* help;
  int (*fn)(const std::vector<std::string>&);
};

const std::map<std::string, Bench>& benches() {
  static const std::map<std::string, Bench> b = {
      {"comm",
       {"collective bus bandwidth vs raw MPI (run under mpirun, >= 2 ranks)",
        [](const std::vector<std::string>& a) { return run_comm_bench(a); }}},
      {"dp",
       {"data-parallel step, N ranks x 1 thread vs 1 rank alone and vs no communication "
        "(under mpirun)",
        run_dp_bench}},
      {"gemm",
       {"fp32/bf16 GEMM GFLOP/s vs OpenBLAS sgemm on GPT-2 training shapes", run_gemm_bench}},
      {"io", {"NVMe engine sequential GB/s and random-read IOPS vs fio", run_io_bench}},
      {"kernels",
       {"fused CPU kernels GB/s vs STREAM triad; attention vs the GEMM-bound rate",
        run_kernels_bench}},
      {"moe",
       {"grouped GEMM over uneven expert batches vs a loop of one sgemm per expert",
        run_moe_bench}},
      {"offload",
       {"step time with parameters/optimizer paged under a device budget vs in memory",
        run_offload_bench}},
      {"plan",
       {"the planner's predicted step time vs `mammoth train` over 30+ plans (calibrated here)",
        run_plan_bench}},
      {"serve",
       {"serving tokens/s and time to first token at several concurrencies vs transformers "
        "generate",
        run_serve_bench}},
      {"train",
       {"training tokens/s vs PyTorch eager and compiled, same model, batch and threads",
        run_train_bench}},
  };
  return b;
}

int run_bench(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "help") {
    std::fprintf(stderr, "usage: mammoth bench <name> [flags]\n\nbenchmarks:\n");
    for (const auto& [name, b] : benches())
      std::fprintf(stderr, "  %-8s %s\n", name.c_str(), b.help);
    return args.empty() ? 2 : 0;
  }
  auto it = benches().find(args[0]);
  MAMMOTH_CHECK(it != benches().end())
      << "[bench] unknown benchmark '" << args[0] << "' (mammoth bench --help lists them)";
  return it->second.fn(std::vector<std::string>(args.begin() + 1, args.end()));
}

}  // namespace

MAMMOTH_RAW_COMMAND(bench, "benchmarks against anchors measured in the same run", run_bench);

}  // namespace mammoth::tools
