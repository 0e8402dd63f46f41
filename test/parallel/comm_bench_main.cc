// Stand-alone driver of the communication benchmark (tools/bench/comm_bench.h) until
// `mammoth bench comm` wires it; the smoke test below runs it on tiny sizes under mpirun.
//   mpirun -np 2 comm_bench [--json FILE] [--min-bytes B] [--max-bytes B] [--ops a,b]
#include <cstdio>
#include <string>
#include <vector>

#include "base/error.h"
#include "tools/bench/comm_bench.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return mammoth::tools::run_comm_bench(args);
  } catch (const mammoth::Error& e) {
    std::fprintf(stderr, "comm_bench: error: %s\n", e.message().c_str());
    return 1;
  }
}
