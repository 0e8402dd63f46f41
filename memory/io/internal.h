// Request bookkeeping shared by AsyncIO and its engines (not part of the public interface).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "memory/io/async_io.h"

namespace mammoth::memory::io::detail {

enum TicketStatus : int { kPendingStatus = 0, kOkStatus = 1, kFailedStatus = 2 };

struct TicketState {
  std::atomic<int> status{kPendingStatus};
  std::string error;  // written before status turns kFailedStatus (release), read after (acquire)
};

struct FileRecord {
  std::string path;
  int fd = -1;
  std::atomic<int64_t> in_flight{0};
  std::mutex mu;  // guards crc
  // Per kBlockSize block: 0 = no valid checksum (never written, or its last write failed),
  // else (1 << 32) | crc32c.
  std::vector<uint64_t> crc;
};

struct Pending {
  Op op = Op::kRead;
  FileId id = -1;
  FileRecord* file = nullptr;
  int64_t offset = 0;
  char* data = nullptr;
  size_t length = 0;
  size_t done = 0;            // bytes moved so far
  size_t asked = 0;           // bytes asked of the kernel by the transfer in flight
  int attempts = 0;           // EAGAIN/EINTR retries so far
  int buf_index = -2;         // io_uring: registered buffer slot, -1 none, -2 not looked up yet
  int64_t submitted_ns = 0;   // train --profile: when it was asked for (0: not profiled)
  std::vector<uint32_t> crc;  // writes: checksum of each block, computed at submission
  Callback callback;
  std::shared_ptr<TicketState> ticket;  // null for post()
  Pending* next_free = nullptr;         // AsyncIO's list of recycled records
};

// Statistics updated from engine threads.
struct Counters {
  std::atomic<int64_t> requests{0}, failed{0}, bytes_read{0}, bytes_written{0};
  std::atomic<int64_t> short_transfers{0}, retries{0}, sqe_waits{0}, max_in_flight{0};
  std::atomic<int64_t> fixed_buffer_ios{0}, blocks_verified{0}, checksum_failures{0};
  std::atomic<int64_t> kernel_calls{0}, kernel_waits{0}, bytes_evicted{0};

  void note_in_flight(int64_t n) {
    int64_t seen = max_in_flight.load(std::memory_order_relaxed);
    while (n > seen && !max_in_flight.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
    }
  }
};

// How many times a request is resubmitted after EAGAIN/EINTR before it fails.
inline constexpr int kMaxRetries = 1000;
// The largest single transfer asked of the kernel (it caps one read/write near 2 GiB anyway);
// longer requests continue through the remainder path.
inline constexpr size_t kMaxTransfer = size_t{1} << 30;

}  // namespace mammoth::memory::io::detail
