// CPU time this process has used (all its threads, user and system): beside a wall-clock
// interval it says what share of its cores a job got, which load from other jobs lowers.
#pragma once

#include <ctime>

namespace mammoth {

inline double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace mammoth
