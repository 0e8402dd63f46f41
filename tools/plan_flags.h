// The layout flags `mammoth train` and `mammoth analyze` share, read as one ParallelPlan: from
// --plan FILE (the layout flags then refused by name), or from the flags themselves. The flags
// are defined by tools/cmd_train.cc and tools/cmd_plan.cc (Abseil flags are global).
#pragma once

#include <set>
#include <string>

#include "plan/parallel_plan.h"

namespace mammoth::tools {

// Whether flag `name` holds something other than its default (Abseil 20220623 keeps "given on
// the command line" private; a flag given at its default value changes nothing anyway).
bool flag_changed(const char* name);

// Refuses every layout flag set beside a plan from `source` ("auto" or a file), except those in
// `inputs` (what the planner takes as inputs), naming the flag and `command`.
void refuse_layout_flags(const char* command, const std::string& source,
                         const std::set<std::string>& inputs = {});

// --plan FILE's plan, or the one the layout flags describe for `launched` processes (--dp 0: what
// the world leaves after pp x tp x sp; when that does not divide, validate() says so). The
// device is the --device flag's kind (train replaces it with the device it resolved).
// --plan auto is the caller's to handle.
plan::ParallelPlan plan_from_layout_flags(const char* command, int launched);

}  // namespace mammoth::tools
