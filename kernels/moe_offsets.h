// The group boundaries of the mixture-of-experts kernels (grouped_matmul and its backward, CPU
// and CUDA): offsets [E + 1] of rows sorted by expert, checked the same way on both backends.
#pragma once

#include <cstdint>
#include <vector>

#include "base/error.h"

namespace mammoth::kernels {

// Offsets must run from 0 to M without decreasing; the error names the op and the first bad
// entry.
inline void check_moe_offsets(const char* op, const std::vector<int64_t>& v, int64_t groups,
                              int64_t M) {
  MAMMOTH_CHECK(static_cast<int64_t>(v.size()) == groups + 1)
      << "[" << op << "] offsets must be i64 [" << groups + 1 << "], got " << v.size()
      << " entries";
  MAMMOTH_CHECK(v.front() == 0 && v.back() == M)
      << "[" << op << "] offsets must run from 0 to " << M << ", got " << v.front() << " .. "
      << v.back();
  for (int64_t e = 0; e < groups; ++e) {
    MAMMOTH_CHECK(v[e] <= v[e + 1])
        << "[" << op << "] offsets decrease at group " << e << ": " << v[e] << " > " << v[e + 1];
  }
}

}  // namespace mammoth::kernels
