// Merges the flight recorder's per-rank dumps (flight_recorder.h) into one report: which rank
// fell behind, on which group, and what every rank was last doing. `mammoth flight DIR`.
#pragma once

#include <string>
#include <vector>

#include "base/json.h"

namespace mammoth::parallel::flight {

struct Report {
  std::string text;           // the report, one "[flight] ..." line per finding
  std::vector<int> suspects;  // world ranks that fell behind or left no record, ascending
};

// `dumps`: the parsed rank_R.json files of one job (any subset of its ranks).
Report merge_dumps(const std::vector<json::Value>& dumps);

// Reads DIR/rank_*.json (a file that does not parse is reported, not fatal) and merges them.
// Throws when DIR holds no dump.
Report merge_dump_dir(const std::string& dir);

}  // namespace mammoth::parallel::flight
