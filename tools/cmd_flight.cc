// `mammoth flight DIR`: merges the flight recorder's per-rank dumps (written when
// communication timed out; train puts them in SAVE_DIR/flight) into one report naming the
// rank(s) that fell behind.
#include <cstdio>
#include <string>
#include <vector>

#include "base/error.h"
#include "parallel/comm/flight_report.h"
#include "tools/command.h"

namespace mammoth::tools {
namespace {

int run_flight(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.size() == 1)
      << "[flight] usage: mammoth flight DIR (DIR: the rank_R.json dumps, e.g. SAVE_DIR/flight "
         "or $MAMMOTH_FLIGHT_DIR)";
  const parallel::flight::Report report = parallel::flight::merge_dump_dir(args[0]);
  std::fputs(report.text.c_str(), stdout);
  return 0;
}

}  // namespace

MAMMOTH_COMMAND(flight, "merge the flight recorder's per-rank dumps; names who fell behind",
                run_flight);

}  // namespace mammoth::tools
