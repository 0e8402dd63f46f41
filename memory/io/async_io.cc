#include "memory/io/async_io.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "base/error.h"
#include "engine/profile/profile.h"
#include "memory/io/aligned_buffer.h"
#include "memory/io/block_checksum.h"
#include "memory/io/internal.h"
#include "memory/io/thread_engine.h"
#include "memory/io/uring_engine.h"

namespace mammoth::memory::io {

using detail::FileRecord;
using detail::Pending;
using detail::TicketState;

const char* engine_kind_name(EngineKind kind) {
  switch (kind) {
    case EngineKind::kAuto:
      return "auto";
    case EngineKind::kUring:
      return "io_uring";
    case EngineKind::kThreads:
      return "threads";
  }
  return "?";
}

EngineKind parse_engine_kind(std::string_view value, std::string_view option) {
  if (value == "auto") return EngineKind::kAuto;
  if (value == "io_uring" || value == "uring") return EngineKind::kUring;
  if (value == "threads") return EngineKind::kThreads;
  MAMMOTH_THROW() << "[io] " << option << " must be auto, io_uring or threads, got '" << value
                  << "'";
}

// ---- Ticket ----

bool Ticket::ready() const {
  MAMMOTH_CHECK(state_) << "[io] Ticket::ready on an empty ticket";
  return state_->status.load(std::memory_order_acquire) != detail::kPendingStatus;
}

bool Ticket::ok() const {
  MAMMOTH_CHECK(state_) << "[io] Ticket::ok on an empty ticket";
  return state_->status.load(std::memory_order_acquire) == detail::kOkStatus;
}

void Ticket::wait() const {
  MAMMOTH_CHECK(state_) << "[io] Ticket::wait on an empty ticket";
  int s;
  while ((s = state_->status.load(std::memory_order_acquire)) == detail::kPendingStatus) {
    state_->status.wait(detail::kPendingStatus, std::memory_order_acquire);
  }
  if (s == detail::kFailedStatus) MAMMOTH_THROW() << state_->error;
}

std::string Ticket::error() const {
  MAMMOTH_CHECK(state_) << "[io] Ticket::error on an empty ticket";
  return state_->status.load(std::memory_order_acquire) == detail::kFailedStatus ? state_->error
                                                                                 : std::string();
}

// ---- AsyncIO ----

AsyncIO::AsyncIO(const AsyncIOOptions& options)
    : options_(options), counters_(std::make_unique<detail::Counters>()) {}

AsyncIO::~AsyncIO() {
  while (Pending* p = free_pending_) {
    free_pending_ = p->next_free;
    delete p;
  }
  // Engines drain and stop their threads in their own destructors; what is left are the fds.
  for (auto& f : files_) {
    if (f && f->fd >= 0) ::close(f->fd);
  }
}

FileId AsyncIO::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int e = errno;
    MAMMOTH_THROW() << "[io] cannot open " << path << " for direct I/O: " << std::strerror(e)
                    << (e == EINVAL ? " (the filesystem refuses O_DIRECT, e.g. an old tmpfs or "
                                      "overlay; put the swap directory on a disk filesystem)"
                                    : "");
  }
  // open/close are serialised among themselves so the engine's fd registration for a slot
  // happens in order, but not under files_mu_: io_uring registers on its I/O thread, whose
  // callbacks may be in submit() waiting for files_mu_.
  std::lock_guard<std::mutex> serial(open_close_mu_);
  FileId id = 0;
  {
    std::lock_guard<std::mutex> lock(files_mu_);
    while (id < static_cast<FileId>(files_.size()) && files_[id]) ++id;
    if (id == static_cast<FileId>(files_.size())) files_.emplace_back();
    auto rec = std::make_unique<FileRecord>();
    rec->path = path;
    rec->fd = fd;
    files_[id] = std::move(rec);
  }
  on_open(id, fd);
  return id;
}

void AsyncIO::close(FileId file) {
  std::lock_guard<std::mutex> serial(open_close_mu_);
  std::unique_ptr<FileRecord> rec;
  {
    std::lock_guard<std::mutex> lock(files_mu_);
    MAMMOTH_CHECK(file >= 0 && file < static_cast<FileId>(files_.size()) && files_[file])
        << "[io] close: no open file with id " << file;
    const int64_t busy = files_[file]->in_flight.load(std::memory_order_acquire);
    MAMMOTH_CHECK(busy == 0) << "[io] close: " << files_[file]->path << " still has " << busy
                             << " requests in flight (wait for them first)";
    rec = std::move(files_[file]);  // the slot is free for reuse only after on_close below,
  }                                 // because open() also holds open_close_mu_
  on_close(file, rec->fd);
  ::close(rec->fd);
}

const std::string& AsyncIO::path(FileId file) const {
  std::lock_guard<std::mutex> lock(files_mu_);
  MAMMOTH_CHECK(file >= 0 && file < static_cast<FileId>(files_.size()) && files_[file])
      << "[io] no open file with id " << file;
  return files_[file]->path;
}

bool AsyncIO::register_buffer(void*, size_t) { return false; }
void AsyncIO::unregister_buffer(void*) {}

void AsyncIO::check_request_locked(const Request& r, size_t index) const {
  const char* what = r.op == Op::kRead ? "read" : "write";
  MAMMOTH_CHECK(r.file >= 0 && r.file < static_cast<FileId>(files_.size()) && files_[r.file])
      << "[io] " << what << " #" << index << " of the batch: no open file with id " << r.file;
  const std::string& p = files_[r.file]->path;
  MAMMOTH_CHECK(r.length > 0 && r.length % kBlockSize == 0)
      << "[io] " << what << " of " << p << ": length " << r.length
      << " must be a positive multiple of " << kBlockSize;
  MAMMOTH_CHECK(r.offset >= 0 && r.offset % static_cast<int64_t>(kBlockSize) == 0)
      << "[io] " << what << " of " << p << ": offset " << r.offset
      << " must be a non-negative multiple of " << kBlockSize;
  MAMMOTH_CHECK(r.data != nullptr && reinterpret_cast<uintptr_t>(r.data) % kBlockSize == 0)
      << "[io] " << what << " of " << p << ": buffer " << r.data << " must be aligned to "
      << kBlockSize << " bytes (use AlignedBuffer)";
}

Pending* AsyncIO::make_pending_locked(Request& r, bool with_ticket) {
  Pending* p = new_pending();
  p->op = r.op;
  p->id = r.file;
  p->file = files_[r.file].get();
  p->offset = r.offset;
  p->data = static_cast<char*>(r.data);
  p->length = r.length;
  p->callback = std::move(r.on_complete);
  if (with_ticket) p->ticket = std::make_shared<TicketState>();
  p->submitted_ns = profile::on() ? profile::now_ns() : 0;
  p->file->in_flight.fetch_add(1, std::memory_order_relaxed);
  return p;
}

void AsyncIO::checksum_write(Pending* p) const {
  // Checksums of writes are taken now, from the caller's thread, so they cost the I/O thread
  // nothing and describe exactly the bytes handed over.
  if (!options_.checksums || p->op != Op::kWrite) return;
  p->crc.resize(p->length / kBlockSize);
  crc32c_blocks(p->data, kBlockSize, p->crc.size(), p->crc.data());
}

Pending* AsyncIO::new_pending() {
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (Pending* p = free_pending_) {
      free_pending_ = p->next_free;
      --pooled_;
      p->next_free = nullptr;
      return p;
    }
  }
  pending_allocated_.fetch_add(1, std::memory_order_relaxed);
  return new Pending;
}

void AsyncIO::recycle(Pending* p) {
  // Everything a request owned goes now (a callback's captures must not outlive it); the crc
  // vector keeps its capacity for the next write.
  p->callback = nullptr;
  p->ticket.reset();
  p->crc.clear();
  p->file = nullptr;
  p->done = p->asked = 0;
  p->attempts = 0;
  p->buf_index = -2;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (pooled_ < kMaxPooledRequests) {
      p->next_free = free_pending_;
      free_pending_ = p;
      ++pooled_;
      return;
    }
  }
  delete p;
}

std::vector<Ticket> AsyncIO::submit(std::vector<Request> batch) {
  std::vector<Pending*> pending;
  std::vector<Ticket> tickets;
  pending.reserve(batch.size());
  tickets.reserve(batch.size());
  {
    // Validate everything first so a bad request queues nothing.
    std::lock_guard<std::mutex> lock(files_mu_);
    for (size_t i = 0; i < batch.size(); ++i) check_request_locked(batch[i], i);
    for (Request& r : batch) {
      Pending* p = make_pending_locked(r, true);
      tickets.push_back(Ticket(p->ticket));
      pending.push_back(p);
    }
  }
  for (Pending* p : pending) checksum_write(p);
  outstanding_.fetch_add(static_cast<int64_t>(pending.size()), std::memory_order_acq_rel);
  if (!pending.empty()) start(std::move(pending));
  return tickets;
}

Pending* AsyncIO::enqueue_one(Request& request, bool with_ticket) {
  Pending* p;
  {
    std::lock_guard<std::mutex> lock(files_mu_);
    check_request_locked(request, 0);
    p = make_pending_locked(request, with_ticket);
  }
  checksum_write(p);
  return p;
}

Ticket AsyncIO::submit_one(Request request) {
  Pending* p = enqueue_one(request, true);
  Ticket t(p->ticket);  // before start(): the engine may complete and recycle p at once
  outstanding_.fetch_add(1, std::memory_order_acq_rel);
  start_one(p);
  return t;
}

void AsyncIO::post(Request request) {
  Pending* p = enqueue_one(request, false);
  outstanding_.fetch_add(1, std::memory_order_acq_rel);
  start_one(p);
}

void AsyncIO::start_one(Pending* p) { start(std::vector<Pending*>{p}); }

int64_t AsyncIO::request_records_allocated() const {
  return pending_allocated_.load(std::memory_order_relaxed);
}

Ticket AsyncIO::read(FileId file, int64_t offset, void* data, size_t length, Callback cb) {
  return submit_one({Op::kRead, file, offset, data, length, std::move(cb)});
}

Ticket AsyncIO::write(FileId file, int64_t offset, const void* data, size_t length, Callback cb) {
  // The engine only reads from a write's buffer.
  return submit_one({Op::kWrite, file, offset, const_cast<void*>(data), length, std::move(cb)});
}

std::string AsyncIO::describe(const Pending& p) {
  std::ostringstream s;
  s << (p.op == Op::kRead ? "read of " : "write of ") << p.file->path << " at offset " << p.offset
    << ", length " << p.length;
  return s.str();
}

std::string AsyncIO::verify(const Pending& p, int64_t* verified) {
  const size_t n = p.length / kBlockSize;
  const size_t first = static_cast<size_t>(p.offset) / kBlockSize;
  // Most reads are a few blocks (a 4 KiB random read is one): their checksums fit on the stack,
  // so the successful path allocates nothing.
  constexpr size_t kOnStack = 64;
  uint32_t stack[kOnStack];
  std::vector<uint32_t> heap;
  uint32_t* got = stack;
  if (n > kOnStack) {
    heap.resize(n);
    got = heap.data();
  }
  crc32c_blocks(p.data, kBlockSize, n, got);
  size_t bad = n;
  uint64_t want = 0;
  {
    std::lock_guard<std::mutex> lock(p.file->mu);
    const std::vector<uint64_t>& table = p.file->crc;
    for (size_t i = 0; i < n; ++i) {
      const size_t b = first + i;
      want = b < table.size() ? table[b] : 0;
      if (want == 0 || static_cast<uint32_t>(want) != got[i]) {
        bad = i;
        break;
      }
    }
  }
  if (bad == n) {
    *verified = static_cast<int64_t>(n);
    return {};
  }
  const size_t b = first + bad;
  std::ostringstream s;
  if (want == 0) {
    s << "[io] " << describe(p) << ": block " << b << " (offset " << b * kBlockSize
      << ") has no checksum: it was never written through this engine, or its last write "
         "failed";
    return s.str();
  }
  counters_->checksum_failures.fetch_add(1, std::memory_order_relaxed);
  s << "[io] checksum mismatch in " << p.file->path << " block " << b << " (offset "
    << b * kBlockSize << ", " << kBlockSize << " bytes): crc32c 0x" << std::hex << got[bad]
    << ", written 0x" << static_cast<uint32_t>(want) << std::dec
    << "; the file was changed outside Mammoth or the device returned corrupt data";
  return s.str();
}

namespace {

#if defined(__x86_64__)
bool have_clflushopt() {
  static const bool yes = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b & (1u << 23)) != 0;  // CPUID.(EAX=7,ECX=0):EBX bit 23
  }();
  return yes;
}

__attribute__((target("clflushopt"))) void flush_lines(const char* data, size_t length) {
  for (size_t i = 0; i < length; i += 64) __builtin_ia32_clflushopt(data + i);
}
#endif

// Drops [data, data + length) from every cache level (see AsyncIOOptions::evict_verified_lines);
// false where the CPU cannot.
bool evict_lines(const char* data, size_t length) {
#if defined(__x86_64__)
  if (!have_clflushopt()) return false;
  flush_lines(data, length);
  return true;
#else
  (void)data;
  (void)length;
  return false;
#endif
}

}  // namespace

bool cache_eviction_supported() {
#if defined(__x86_64__)
  return have_clflushopt();
#else
  return false;
#endif
}

void AsyncIO::complete(Pending* p, std::string error) {
  detail::Counters& c = *counters_;
  if (p->submitted_ns && profile::on()) {
    char args[96];
    std::snprintf(args, sizeof(args), "\"bytes\":%zu,\"offset\":%lld,\"file\":%d", p->length,
                  static_cast<long long>(p->offset), static_cast<int>(p->id));
    profile::complete(profile::Lane::kIo, p->op == Op::kRead ? "nvme_read" : "nvme_write",
                      p->submitted_ns, profile::now_ns(), args);
  }
  if (options_.checksums) {
    if (p->op == Op::kRead && error.empty()) {
      int64_t verified = 0;
      error = verify(*p, &verified);
      if (options_.evict_verified_lines && error.empty() && evict_lines(p->data, p->length)) {
        c.bytes_evicted.fetch_add(static_cast<int64_t>(p->length), std::memory_order_relaxed);
      }
      c.blocks_verified.fetch_add(verified, std::memory_order_relaxed);
    } else if (p->op == Op::kWrite) {
      // A failed write leaves its blocks undefined: drop their checksums so a later read fails
      // clearly instead of "verifying" stale data.
      const size_t first = static_cast<size_t>(p->offset) / kBlockSize;
      const size_t n = p->length / kBlockSize;
      std::lock_guard<std::mutex> lock(p->file->mu);
      std::vector<uint64_t>& table = p->file->crc;
      if (table.size() < first + n) table.resize(first + n, 0);
      for (size_t i = 0; i < n; ++i) {
        table[first + i] = error.empty() ? (uint64_t{1} << 32) | p->crc[i] : 0;
      }
    }
  }
  if (p->callback) {
    try {
      p->callback(error);
    } catch (const std::exception& e) {
      if (error.empty()) error = std::string("[io] completion callback threw: ") + e.what();
    }
  }
  c.requests.fetch_add(1, std::memory_order_relaxed);
  if (error.empty()) {
    (p->op == Op::kRead ? c.bytes_read : c.bytes_written)
        .fetch_add(static_cast<int64_t>(p->length), std::memory_order_relaxed);
  } else {
    c.failed.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(error_mu_);
    if (errors_since_sync_++ == 0) first_error_ = error;
  }
  p->file->in_flight.fetch_sub(1, std::memory_order_acq_rel);
  if (p->ticket) {
    TicketState& t = *p->ticket;
    t.error = std::move(error);
    t.status.store(t.error.empty() ? detail::kOkStatus : detail::kFailedStatus,
                   std::memory_order_release);
    t.status.notify_all();
  }
  recycle(p);
  if (outstanding_.fetch_sub(1, std::memory_order_acq_rel) == 1) outstanding_.notify_all();
}

void AsyncIO::drain() {
  int64_t n;
  while ((n = outstanding_.load(std::memory_order_acquire)) != 0) outstanding_.wait(n);
}

void AsyncIO::synchronize() {
  drain();
  std::string error;
  int64_t count;
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    count = errors_since_sync_;
    error = std::move(first_error_);
    errors_since_sync_ = 0;
    first_error_.clear();
  }
  if (count == 0) return;
  if (count == 1) MAMMOTH_THROW() << error;
  MAMMOTH_THROW() << error << " (and " << count - 1 << " more failed requests)";
}

IOStats AsyncIO::stats() const {
  const detail::Counters& c = *counters_;
  auto get = [](const std::atomic<int64_t>& a) { return a.load(std::memory_order_relaxed); };
  IOStats s;
  s.requests = get(c.requests);
  s.failed = get(c.failed);
  s.bytes_read = get(c.bytes_read);
  s.bytes_written = get(c.bytes_written);
  s.short_transfers = get(c.short_transfers);
  s.retries = get(c.retries);
  s.sqe_waits = get(c.sqe_waits);
  s.max_in_flight = get(c.max_in_flight);
  s.fixed_buffer_ios = get(c.fixed_buffer_ios);
  s.blocks_verified = get(c.blocks_verified);
  s.checksum_failures = get(c.checksum_failures);
  s.kernel_calls = get(c.kernel_calls);
  s.kernel_waits = get(c.kernel_waits);
  s.bytes_evicted = get(c.bytes_evicted);
  return s;
}

// ---- engine choice ----

namespace {

// Writes two blocks through `io` and reads them back into another buffer; throws Error with the
// engine's own message when any step fails or the bytes differ.
void probe_round_trip(AsyncIO& io, const std::string& dir) {
  std::string tmpl = dir + "/.mammoth-io-probe-XXXXXX";
  const int fd = ::mkstemp(tmpl.data());
  MAMMOTH_CHECK(fd >= 0) << "[io] cannot create a probe file in " << dir << ": "
                         << std::strerror(errno);
  ::close(fd);
  struct Unlink {
    std::string path;
    ~Unlink() { ::unlink(path.c_str()); }
  } unlink_probe{tmpl};
  const FileId f = io.open(tmpl);
  AlignedBuffer out(2 * kBlockSize), in(2 * kBlockSize);
  for (size_t i = 0; i < out.size(); ++i) out.data()[i] = static_cast<char>(i * 131 + 7);
  struct Close {
    AsyncIO& io;
    FileId f;
    ~Close() {
      try {
        io.synchronize();
      } catch (const Error&) {
      }
      try {
        io.close(f);
      } catch (const Error&) {
      }
    }
  } close_probe{io, f};
  io.write(f, 0, out.data(), out.size()).wait();
  io.read(f, 0, in.data(), in.size()).wait();
  MAMMOTH_CHECK(std::memcmp(out.data(), in.data(), out.size()) == 0)
      << "[io] the " << io.name() << " engine's probe read back different bytes from " << tmpl;
  io.synchronize();
}

void reset(detail::Counters& c) {
  for (std::atomic<int64_t>* a :
       {&c.requests, &c.failed, &c.bytes_read, &c.bytes_written, &c.short_transfers, &c.retries,
        &c.sqe_waits, &c.max_in_flight, &c.fixed_buffer_ios, &c.blocks_verified,
        &c.checksum_failures, &c.kernel_calls, &c.kernel_waits, &c.bytes_evicted}) {
    a->store(0, std::memory_order_relaxed);
  }
}

// The directory half of the probe, done before any engine so that a directory problem is
// reported as such instead of as io_uring being refused.
void check_probe_dir(const std::string& dir) {
  std::string tmpl = dir + "/.mammoth-io-probe-XXXXXX";
  const int fd = ::mkstemp(tmpl.data());
  MAMMOTH_CHECK(fd >= 0) << "[io] cannot create a file in " << dir << ": " << std::strerror(errno);
  ::close(fd);
  const int direct = ::open(tmpl.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  const int e = errno;
  if (direct >= 0) ::close(direct);
  ::unlink(tmpl.c_str());
  MAMMOTH_CHECK(direct >= 0) << "[io] " << dir << " refuses O_DIRECT files: " << std::strerror(e)
                             << (e == EINVAL ? " (choose a directory on a disk filesystem such "
                                               "as ext4 or xfs, not tmpfs or overlay)"
                                             : "");
}

void check_options(const AsyncIOOptions& o) {
  MAMMOTH_CHECK(o.queue_depth >= 1 && o.queue_depth <= 4096)
      << "[io] queue depth must be in [1, 4096], got " << o.queue_depth;
  MAMMOTH_CHECK(o.threads >= 0 && o.threads <= 1024)
      << "[io] threads must be in [0, 1024], got " << o.threads;
  MAMMOTH_CHECK(o.max_registered_buffers >= 0 && o.max_registered_buffers <= 16384)
      << "[io] max_registered_buffers must be in [0, 16384], got " << o.max_registered_buffers;
  MAMMOTH_CHECK(o.max_registered_files >= 0 && o.max_registered_files <= 65536)
      << "[io] max_registered_files must be in [0, 65536], got " << o.max_registered_files;
  MAMMOTH_CHECK(o.ring_setup_rung_for_test >= 0 && o.ring_setup_rung_for_test <= 2)
      << "[io] ring_setup_rung_for_test must be in [0, 2], got " << o.ring_setup_rung_for_test;
  MAMMOTH_CHECK(o.ring_entries >= 0 && o.ring_entries <= 4096)
      << "[io] ring_entries must be in [0, 4096], got " << o.ring_entries;
}

}  // namespace

std::unique_ptr<AsyncIO> make_async_io(const AsyncIOOptions& options,
                                       const std::string& probe_dir) {
  check_options(options);
  check_probe_dir(probe_dir);
  if (options.engine != EngineKind::kThreads) {
    try {
      auto io = std::make_unique<UringEngine>(options);
      probe_round_trip(*io, probe_dir);
      reset(io->counters());  // statistics describe the caller's requests only
      return io;
    } catch (const Error& e) {
      if (options.engine == EngineKind::kUring) throw;
      std::string reason = e.message();
      std::fprintf(stderr,
                   "[io] warning: io_uring is not usable here (%s); falling back to the "
                   "pread/pwrite thread engine, which is slower\n",
                   reason.c_str());
      auto io = std::make_unique<ThreadEngine>(options);
      probe_round_trip(*io, probe_dir);
      reset(io->counters());
      io->fallback_reason_ = std::move(reason);
      return io;
    }
  }
  auto io = std::make_unique<ThreadEngine>(options);
  probe_round_trip(*io, probe_dir);
  reset(io->counters());
  return io;
}

}  // namespace mammoth::memory::io
