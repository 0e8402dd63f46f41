// AsyncIO: Mammoth's asynchronous file I/O for the NVMe tier.
//
// One small interface, two engines behind it (as in TensorNVMe and DeepSpeed's aio):
//   - io_uring (uring_engine.h): one I/O thread owns the ring; requests queue in memory and at
//     most `queue_depth` are in the kernel at once; files and buffers are registered with the
//     ring when the kernel allows it.
//   - threads (thread_engine.h): `threads` workers doing pread/pwrite, for kernels or sandboxes
//     that refuse io_uring.
// make_async_io() picks one by probing it with a real O_DIRECT write + read round trip, and
// falls back with a warning when io_uring is refused.
//
// The contract, for both engines:
//   - Files are opened with O_DIRECT. Buffer addresses, file offsets and lengths are multiples of
//     kBlockSize (4 KiB); a violation throws mammoth::Error at submission.
//   - submit() never blocks on the device: it queues the batch and returns one Ticket per
//     request. A batch reaches the kernel together (one io_uring_enter for up to queue_depth
//     requests). The caller keeps a buffer untouched until its request completes.
//   - Every request completes exactly once: its callback (if any) runs on an engine thread, then
//     its Ticket becomes ready. A completion reports every byte moved: short transfers are
//     resubmitted for the remainder, EAGAIN/EINTR are retried, anything else fails the request
//     with an Error naming the operation, file, offset, length and strerror.
//   - With checksums on, each written 4 KiB block's CRC-32C is kept in memory (computed when the
//     write is submitted, committed when it completes); each block read is verified against
//     it. A mismatch fails the read naming the file and block. Reading a block this engine never
//     wrote is an error too: for swap files it means a bookkeeping bug upstream.
//
// Typical use (the chunk manager's eviction and prefetch):
//   auto io = make_async_io({.queue_depth = 32}, swap_dir.path());
//   FileId f = io->open(swap_dir.create_file("chunks", bytes));
//   io->register_buffer(staging.data(), staging.size());       // optional, faster
//   Ticket t = io->write(f, chunk_offset, staging.data(), chunk_bytes);
//   ... compute ...
//   t.wait();                                                   // throws if the write failed
//   io->synchronize();                                          // all requests; first error
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace mammoth::memory::io {

// Alignment of buffers, offsets and lengths, and the checksum granularity.
inline constexpr size_t kBlockSize = 4096;

enum class Op : uint8_t { kRead, kWrite };

enum class EngineKind : uint8_t {
  kAuto,     // io_uring when the kernel accepts it (probed), else threads with a warning
  kUring,    // io_uring or an Error
  kThreads,  // pread/pwrite workers
};
// "auto", "io_uring", "threads".
const char* engine_kind_name(EngineKind kind);
// Whether this CPU can evict verified reads' lines (AsyncIOOptions::evict_verified_lines).
bool cache_eviction_supported();
// Inverse of engine_kind_name (also accepts "uring"); throws Error naming `option` otherwise.
EngineKind parse_engine_kind(std::string_view value, std::string_view option = "--io-engine");

struct AsyncIOOptions {
  EngineKind engine = EngineKind::kAuto;
  // Most requests in the kernel at once (io_uring) or worker threads (threads engine, unless
  // `threads` is set). >= 1.
  int queue_depth = 32;
  // Threads engine only: worker count; 0 means queue_depth.
  int threads = 0;
  // CRC-32C per kBlockSize block, recorded on write, verified on read.
  bool checksums = true;
  // io_uring: slots in the ring's registered-buffer table (register_buffer()). 0 disables.
  int max_registered_buffers = 64;
  // io_uring: slots in the registered-file table (FileIds below this use fixed files).
  int max_registered_files = 256;
  // io_uring: submission ring entries; 0 means queue_depth. A smaller ring makes one batch wrap
  // it, exercising the "no free SQE: submit, then retry" path (tests).
  int ring_entries = 0;
  // io_uring: a request made ready by a completion (a callback's submit(), a short transfer's
  // remainder) goes to the kernel right after that completion, one io_uring_enter each, rather
  // than with the rest of the completions reaped together. Costs a system call per request;
  // keeps the device's queue full (4 KiB random reads: ~1.2x the IOPS on a virtio disk).
  bool eager_resubmit = true;
  // With checksums: after a read is verified, and before its callback runs, evict its bytes from
  // the CPU caches (clflushopt). For callers that hand the bytes on without reading them soon
  // (a buffer refilled by the next read, data sent elsewhere by DMA): verification leaves every
  // line of the buffer cached on this core, and the device's next write into it then has to take
  // them back first. On this project's virtio disk that cost ~7% of 4 KiB random-read IOPS
  // (BENCHMARKS.md, issue 8). A callback that reads the bytes pays a memory read instead of a
  // cache hit, so it is off by default. No effect where the CPU lacks clflushopt.
  bool evict_verified_lines = false;
  // Test hook: io_uring setup starts this far down its ladder of flags (0: single issuer +
  // deferred task run, 1: cooperative task run, 2: plain), as on kernels that refuse the newer.
  int ring_setup_rung_for_test = 0;
  // Test hook: ask the kernel for only half of each request's first transfer, so every request
  // of more than one block completes short and must be resubmitted for the remainder.
  bool split_transfers_for_test = false;
};

using FileId = int32_t;
// Called once per request on an engine thread: `error` is empty on success. It must not block
// on the engine (no wait()/synchronize()); it may submit() more requests. Keep it short: it
// runs on the thread that reaps completions.
using Callback = std::function<void(const std::string& error)>;

struct Request {
  Op op = Op::kRead;
  FileId file = -1;
  int64_t offset = 0;    // bytes, multiple of kBlockSize
  void* data = nullptr;  // kBlockSize-aligned; for writes, unchanged until completion
  size_t length = 0;     // bytes, multiple of kBlockSize, > 0
  Callback on_complete;
};

struct IOStats {
  int64_t requests = 0;           // completed requests, successful or not
  int64_t failed = 0;             // completed with an error
  int64_t bytes_read = 0;         // by successful reads
  int64_t bytes_written = 0;      // by successful writes
  int64_t short_transfers = 0;    // transfers that ended before the request did: resubmitted
  int64_t retries = 0;            // EAGAIN/EINTR resubmissions
  int64_t sqe_waits = 0;          // io_uring: no free SQE, so submitted and retried
  int64_t max_in_flight = 0;      // high-water mark of requests in the kernel at once
  int64_t fixed_buffer_ios = 0;   // io_uring transfers issued as READ_FIXED / WRITE_FIXED
  int64_t blocks_verified = 0;    // read blocks whose checksum matched
  int64_t checksum_failures = 0;  // read blocks whose checksum did not match
  int64_t kernel_calls = 0;       // io_uring: io_uring_enter calls (submissions and waits)
  int64_t kernel_waits = 0;       // io_uring: of those, calls that slept for a completion
  int64_t bytes_evicted = 0;      // read bytes dropped from the caches once verified
};

namespace detail {
struct TicketState;
struct Pending;
struct FileRecord;
struct Counters;
}  // namespace detail

// The status of one request. Cheap to copy (shared state).
class Ticket {
 public:
  Ticket() = default;
  bool valid() const { return state_ != nullptr; }
  // Completed, successfully or not. Never blocks.
  bool ready() const;
  // Completed successfully.
  bool ok() const;
  // Blocks until completed; throws mammoth::Error with the request's error if it failed.
  void wait() const;
  // The error of a failed request; empty while pending or after success.
  std::string error() const;

 private:
  friend class AsyncIO;
  explicit Ticket(std::shared_ptr<detail::TicketState> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::TicketState> state_;
};

class AsyncIO {
 public:
  virtual ~AsyncIO();
  AsyncIO(const AsyncIO&) = delete;
  AsyncIO& operator=(const AsyncIO&) = delete;

  virtual EngineKind kind() const = 0;
  const char* name() const { return engine_kind_name(kind()); }
  const AsyncIOOptions& options() const { return options_; }
  // Why make_async_io fell back from io_uring to threads; empty when it did not.
  const std::string& fallback_reason() const { return fallback_reason_; }

  // Opens (creating if missing, mode 0600) `path` for O_DIRECT reads and writes. Throws Error
  // naming the path and strerror, with a hint when the filesystem refuses O_DIRECT.
  FileId open(const std::string& path);
  // Closes a file with no requests in flight (else Error). Its checksums are forgotten.
  void close(FileId file);
  const std::string& path(FileId file) const;

  // Registers [data, data + length) with the kernel (io_uring: pinned, used by READ_FIXED /
  // WRITE_FIXED for requests inside it). Returns false when the engine cannot (threads engine,
  // table full, memlock limit): requests on it still work, just without the fast path.
  virtual bool register_buffer(void* data, size_t length);
  // Forgets a registration (after the requests using it have completed).
  virtual void unregister_buffer(void* data);

  // Queues a batch; returns one Ticket per request, in order. Throws Error (queuing nothing) if
  // any request is malformed: unknown file, unaligned buffer/offset/length, zero length.
  std::vector<Ticket> submit(std::vector<Request> batch);
  // One request, as a batch of one, without the batch's and the result's vectors.
  Ticket submit_one(Request request);
  // One request whose outcome goes only to its callback (and to synchronize(), which throws the
  // first failure as for any request): no Ticket is made. With request records recycled, this
  // is the allocation-free path of a callback-driven pipeline (each completion's callback
  // posting the next read): it allocates nothing once warm, where a batch of one costs the
  // caller's vector, submit()'s two vectors and a ticket state (six per request, with the
  // record, before records were recycled).
  void post(Request request);
  // Request records allocated so far (the rest were recycled from completed requests).
  int64_t request_records_allocated() const;
  Ticket read(FileId file, int64_t offset, void* data, size_t length, Callback on_complete = {});
  Ticket write(FileId file, int64_t offset, const void* data, size_t length,
               Callback on_complete = {});

  // Waits until every submitted request has completed. If any failed since the last
  // synchronize(), throws Error with the first failure (and how many others failed).
  void synchronize();
  // Requests submitted and not yet completed.
  int64_t outstanding() const { return outstanding_.load(std::memory_order_acquire); }
  IOStats stats() const;

 protected:
  explicit AsyncIO(const AsyncIOOptions& options);

  // Engines take ownership of the requests and call complete() for each exactly once.
  virtual void start(std::vector<detail::Pending*> batch) = 0;
  // The same for one request (submit_one(), post()); the default wraps it in a batch.
  virtual void start_one(detail::Pending* p);
  // Hooks run by open()/close(), serialised with each other (io_uring registers the fd).
  virtual void on_open(FileId /*file*/, int /*fd*/) {}
  virtual void on_close(FileId /*file*/, int /*fd*/) {}

  // Finishes a request: on success verifies (read) or records (write) its checksums, then
  // runs the callback, resolves the ticket and deletes `p`. `error` empty means all bytes moved.
  void complete(detail::Pending* p, std::string error);
  // "read of FILE at offset O, length L" for error messages.
  static std::string describe(const detail::Pending& p);
  // Waits for outstanding() == 0 without throwing (engine destructors).
  void drain();

  detail::Counters& counters() { return *counters_; }

 private:
  friend std::unique_ptr<AsyncIO> make_async_io(const AsyncIOOptions&, const std::string&);
  std::string verify(const detail::Pending& p, int64_t* verified);
  // Throws Error if `r` (the index-th of its batch) is malformed. Caller holds files_mu_.
  void check_request_locked(const Request& r, size_t index) const;
  // A record for a checked request (taking its callback), counted in its file's in_flight.
  detail::Pending* make_pending_locked(Request& r, bool with_ticket);
  detail::Pending* enqueue_one(Request& request, bool with_ticket);
  void checksum_write(detail::Pending* p) const;
  // Completed requests' records are kept for reuse (up to kMaxPooledRequests) instead of being
  // freed: a request then costs no heap allocation for its record.
  detail::Pending* new_pending();
  void recycle(detail::Pending* p);
  static constexpr size_t kMaxPooledRequests = 1024;

  AsyncIOOptions options_;
  std::string fallback_reason_;
  std::unique_ptr<detail::Counters> counters_;

  std::mutex open_close_mu_;
  mutable std::mutex files_mu_;
  std::vector<std::unique_ptr<detail::FileRecord>> files_;  // index = FileId; null when closed

  std::atomic<int64_t> outstanding_{0};
  std::mutex pool_mu_;
  detail::Pending* free_pending_ = nullptr;  // recycled records, linked by next_free
  size_t pooled_ = 0;
  std::atomic<int64_t> pending_allocated_{0};
  std::mutex error_mu_;
  std::string first_error_;  // since the last synchronize()
  int64_t errors_since_sync_ = 0;
};

// Validates `options`, builds the engine it names and probes it with an O_DIRECT round trip on a
// temporary file in `probe_dir` (the swap directory). kAuto falls back from io_uring to threads
// with a warning on stderr (and fallback_reason()) when the kernel refuses io_uring's setup or
// the probe; a probe failing on the fallback too, or a directory refusing O_DIRECT, throws.
std::unique_ptr<AsyncIO> make_async_io(const AsyncIOOptions& options, const std::string& probe_dir);

}  // namespace mammoth::memory::io
