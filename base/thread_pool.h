// The CPU thread pool that every CPU kernel parallelises over.
//
// One process-wide pool (an explicit singleton, like the kernel registry), sized by
// set_num_threads() (the `--threads` flag) or hardware concurrency. parallel_for splits
// [begin, end) into chunks of at least `grain` items and runs them on the pool plus the
// calling thread; nested calls from inside a worker run serially so kernels may compose.
#pragma once

#include <cstdint>
#include <functional>

namespace mammoth {

// Number of threads parallel_for uses (including the caller). Default: hardware concurrency.
int num_threads();
// Resizes the pool; n <= 0 means hardware concurrency.
void set_num_threads(int n);

// Calls fn(chunk_begin, chunk_end) over disjoint chunks covering [begin, end).
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn);

// True while the calling thread is executing a parallel_for chunk.
bool in_parallel_region();

}  // namespace mammoth
