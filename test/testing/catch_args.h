// Catch2's command line for every Mammoth test binary: the caller's arguments plus
// `--warn NoTests`. Catch2 2.x exits 0 when a test-case filter matches nothing, so a renamed
// case would turn the mpirun targets that select it by name into green no-ops; with the warning
// such a run exits 2.
#pragma once

#include <vector>

namespace mammoth::testing {

// argv with "--warn NoTests" after the program name; the pointers stay valid as long as argv.
inline std::vector<char*> catch_args(int argc, char** argv) {
  static char warn[] = "--warn";
  static char no_tests[] = "NoTests";
  std::vector<char*> args(argv, argv + argc);
  args.insert(args.begin() + (argc > 0 ? 1 : 0), {warn, no_tests});
  return args;
}

}  // namespace mammoth::testing
