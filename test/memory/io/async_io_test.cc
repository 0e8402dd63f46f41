// Tests of memory/io/async_io.h on both engines: round trips, batching beyond the queue depth,
// short transfers, checksums, error reporting, and the choice of engine when the kernel refuses
// io_uring (simulated with a seccomp filter in a child process).
#include "memory/io/async_io.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "memory/io/aligned_buffer.h"
#include "memory/io/uring_engine.h"
#include "test/memory/io/child_process.h"
#include "test/memory/io/error_of.h"
#include "test/testing/test_dir.h"

namespace mammoth::memory::io {
namespace {

using testing::run_in_child;

void fill_random(AlignedBuffer& b, uint32_t seed) {
  std::mt19937 rng(seed);
  auto* w = reinterpret_cast<uint32_t*>(b.data());
  for (size_t i = 0; i < b.size() / 4; ++i) w[i] = rng();
}

std::unique_ptr<AsyncIO> make(EngineKind kind, const std::string& dir, AsyncIOOptions o = {}) {
  o.engine = kind;
  auto io = make_async_io(o, dir);
  REQUIRE(io->kind() == kind);
  return io;
}

using testing::error_of;

// Denies one system call with EPERM for this process (and its future threads), as a container
// runtime's seccomp profile does for io_uring.
bool deny_syscall(long nr) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

TEST_CASE("round trips of many sizes and offsets", "[io]") {
  const EngineKind kind = GENERATE(EngineKind::kUring, EngineKind::kThreads);
  CAPTURE(engine_kind_name(kind));
  mammoth::testing::TestDir dir;
  auto io = make(kind, dir.path());
  const FileId f = io->open(dir.file("data"));
  struct Case {
    int64_t offset;
    size_t length;
  };
  // Disjoint ranges: single blocks, odd block counts, a MiB boundary crossed, a multi-MiB run.
  const std::vector<Case> cases = {{0, 4096},
                                   {4096, 8192},
                                   {16384, 4096 * 7},
                                   {1 << 20, 4096},
                                   {(1 << 20) - 8192, 8192},
                                   {3 << 20, 3 << 20},
                                   {(2 << 20) + 4096, 65536},
                                   {40 << 20, 1 << 20}};
  std::vector<AlignedBuffer> out, in;
  std::vector<Ticket> writes;
  for (size_t i = 0; i < cases.size(); ++i) {
    out.emplace_back(cases[i].length);
    fill_random(out.back(), static_cast<uint32_t>(i + 1));
    writes.push_back(io->write(f, cases[i].offset, out.back().data(), cases[i].length));
  }
  for (Ticket& t : writes) t.wait();
  std::vector<Ticket> reads;
  for (size_t i = 0; i < cases.size(); ++i) {
    in.emplace_back(cases[i].length);
    reads.push_back(io->read(f, cases[i].offset, in.back().data(), cases[i].length));
  }
  io->synchronize();
  int64_t total = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    CAPTURE(i, cases[i].offset, cases[i].length);
    REQUIRE(reads[i].ok());
    REQUIRE(std::memcmp(out[i].data(), in[i].data(), cases[i].length) == 0);
    total += static_cast<int64_t>(cases[i].length);
  }
  const IOStats s = io->stats();
  CHECK(s.bytes_written == total);
  CHECK(s.bytes_read == total);
  CHECK(s.failed == 0);
  CHECK(s.blocks_verified == total / 4096);
  CHECK(s.requests == static_cast<int64_t>(2 * cases.size()));
}

TEST_CASE("a batch far beyond the queue depth completes with the depth respected", "[io]") {
  const EngineKind kind = GENERATE(EngineKind::kUring, EngineKind::kThreads);
  CAPTURE(engine_kind_name(kind));
  mammoth::testing::TestDir dir;
  auto io = make(kind, dir.path(), {.queue_depth = 4});
  const FileId f = io->open(dir.file("data"));
  constexpr int kRequests = 300;
  AlignedBuffer out(kRequests * 3 * 4096), in(kRequests * 3 * 4096);
  fill_random(out, 7);
  std::atomic<int> callbacks{0};
  std::vector<Request> batch;
  for (int i = 0; i < kRequests; ++i) {
    const size_t len = 4096 * static_cast<size_t>(1 + i % 3);  // 4, 8 or 12 KiB
    const int64_t off = int64_t{i} * 3 * 4096;
    batch.push_back({Op::kWrite, f, off, out.data() + off, len,
                     [&](const std::string& e) { callbacks += e.empty() ? 1 : 1000; }});
  }
  auto tickets = io->submit(std::move(batch));
  REQUIRE(tickets.size() == kRequests);
  io->synchronize();
  CHECK(callbacks == kRequests);
  for (const Ticket& t : tickets) REQUIRE(t.ok());
  for (int i = 0; i < kRequests; ++i) {
    const size_t len = 4096 * static_cast<size_t>(1 + i % 3);
    const int64_t off = int64_t{i} * 3 * 4096;
    batch.push_back({Op::kRead, f, off, in.data() + off, len, {}});
  }
  io->submit(std::move(batch));
  io->synchronize();
  for (int i = 0; i < kRequests; ++i) {
    const size_t len = 4096 * static_cast<size_t>(1 + i % 3);
    const size_t off = size_t(i) * 3 * 4096;
    REQUIRE(std::memcmp(out.data() + off, in.data() + off, len) == 0);
  }
  const IOStats s = io->stats();
  CHECK(s.max_in_flight <= 4);
  CHECK(s.max_in_flight >= 1);
  CHECK(s.requests == 2 * kRequests);
}

TEST_CASE("io_uring: a batch larger than the submission ring waits for SQEs", "[io]") {
  mammoth::testing::TestDir dir;
  auto io = make(EngineKind::kUring, dir.path(), {.queue_depth = 32, .ring_entries = 4});
  const FileId f = io->open(dir.file("data"));
  AlignedBuffer out(128 * 4096), in(128 * 4096);
  fill_random(out, 11);
  std::vector<Request> batch;
  for (int i = 0; i < 128; ++i) {
    batch.push_back({Op::kWrite, f, int64_t{i} * 4096, out.data() + i * 4096, 4096, {}});
  }
  io->submit(std::move(batch));
  io->synchronize();
  io->read(f, 0, in.data(), in.size()).wait();
  REQUIRE(std::memcmp(out.data(), in.data(), in.size()) == 0);
  CHECK(io->stats().sqe_waits > 0);
}

TEST_CASE("short transfers are resubmitted for the remainder", "[io]") {
  const EngineKind kind = GENERATE(EngineKind::kUring, EngineKind::kThreads);
  CAPTURE(engine_kind_name(kind));
  mammoth::testing::TestDir dir;
  // Every multi-block request first moves only half its blocks (the hook), so the remainder
  // path must compute the right offset and buffer position or the data comes back wrong.
  auto io = make(kind, dir.path(), {.split_transfers_for_test = true});
  const FileId f = io->open(dir.file("data"));
  const std::vector<size_t> lengths = {4096, 8192, 12288, 65536, 1 << 20, (1 << 20) + 4096};
  int64_t off = 0;
  int multi = 0;
  for (size_t len : lengths) {
    CAPTURE(len);
    AlignedBuffer out(len), in(len);
    fill_random(out, static_cast<uint32_t>(len));
    io->write(f, off, out.data(), len).wait();
    io->read(f, off, in.data(), len).wait();
    REQUIRE(std::memcmp(out.data(), in.data(), len) == 0);
    off += static_cast<int64_t>(len);
    multi += len > 4096 ? 1 : 0;
  }
  CHECK(io->stats().short_transfers == 2 * multi);
}

// The pipeline a prefetcher (and the bench's random reads) runs: each completion's callback
// submits the chain's next read into the same buffer, on the engine's thread. With io_uring's
// eager resubmission that read enters the kernel before the rest of the reaped batch is handled,
// through a different path from the batch loop: both must keep every request's data, checksum,
// remainder (every multi-block read first moves half: the hook) and error its own.
TEST_CASE("callbacks that submit the next read: a pipeline at full depth", "[io]") {
  struct Mode {
    EngineKind kind;
    bool eager;
    int rung;  // io_uring setup: deferred task run, cooperative, plain (older kernels)
  };
  const Mode mode = GENERATE(Mode{EngineKind::kUring, true, 0}, Mode{EngineKind::kUring, false, 0},
                             Mode{EngineKind::kUring, true, 1}, Mode{EngineKind::kUring, true, 2},
                             Mode{EngineKind::kThreads, true, 0});
  CAPTURE(engine_kind_name(mode.kind), mode.eager, mode.rung);
  mammoth::testing::TestDir dir;
  constexpr int kDepth = 8, kPerChain = 60;
  constexpr size_t kFileBlocks = 512, kMaxBlocks = 3;
  auto io = make(mode.kind, dir.path(),
                 {.queue_depth = kDepth,
                  .eager_resubmit = mode.eager,
                  .ring_setup_rung_for_test = mode.rung,
                  .split_transfers_for_test = true});
  if (auto* u = dynamic_cast<UringEngine*>(io.get())) {
    // The rung asked for, or a lower one where this kernel refuses it.
    CHECK(static_cast<int>(u->task_run()) >= mode.rung);
  }
  const FileId f = io->open(dir.file("data"));
  AlignedBuffer out(kFileBlocks * 4096);
  fill_random(out, 21);
  io->write(f, 0, out.data(), out.size()).wait();

  struct Chain {
    int step = 0;
    std::atomic<int> done{0};
  };
  std::vector<Chain> chains(kDepth);
  AlignedBuffer slots(kDepth * kMaxBlocks * 4096);
  std::atomic<int> wrong_data{0}, errors{0}, eof_errors{0};
  // Chain c's step s reads 1-3 blocks at a pseudo-random block; chain 3's step 17 reads past the
  // end of the file instead (an injected failure in the middle of the pipeline).
  auto where = [&](int c, int s) {
    const size_t blocks = 1 + static_cast<size_t>(c + s) % kMaxBlocks;
    const size_t first = c == 3 && s == 17 ? kFileBlocks + 10
                                           : (static_cast<size_t>(c) * 7919 + s * 104729) %
                                                 (kFileBlocks - kMaxBlocks);
    return std::pair<size_t, size_t>(first, blocks);
  };
  std::function<Request(int)> next = [&](int c) {
    const auto [first, blocks] = where(c, chains[c].step);
    char* buf = slots.data() + static_cast<size_t>(c) * kMaxBlocks * 4096;
    return Request{Op::kRead,
                   f,
                   static_cast<int64_t>(first * 4096),
                   buf,
                   blocks * 4096,
                   [&, c, first = first, blocks = blocks, buf](const std::string& e) {
                     if (!e.empty()) {
                       ++errors;
                       if (e.find("end of the file") != std::string::npos) ++eof_errors;
                     } else if (std::memcmp(buf, out.data() + first * 4096, blocks * 4096) != 0) {
                       ++wrong_data;
                     }
                     chains[c].done.fetch_add(1);
                     if (++chains[c].step < kPerChain) io->submit({next(c)});
                   }};
  };
  std::vector<Request> first_reads;
  for (int c = 0; c < kDepth; ++c) first_reads.push_back(next(c));
  io->submit(std::move(first_reads));
  const std::string e = error_of([&] { io->synchronize(); });
  CHECK(e.find("end of the file") != std::string::npos);
  for (int c = 0; c < kDepth; ++c) REQUIRE(chains[c].done == kPerChain);
  CHECK(wrong_data == 0);
  CHECK(errors == 1);
  CHECK(eof_errors == 1);
  const IOStats s = io->stats();
  CHECK(s.requests == 1 + kDepth * kPerChain);
  CHECK(s.failed == 1);
  CHECK(s.max_in_flight <= kDepth);
  int64_t multi = 0, blocks = 0;
  for (int c = 0; c < kDepth; ++c) {
    for (int st = 0; st < kPerChain; ++st) {
      if (c == 3 && st == 17) continue;
      multi += where(c, st).second > 1 ? 1 : 0;
      blocks += static_cast<int64_t>(where(c, st).second);
    }
  }
  CHECK(s.blocks_verified == blocks);
  CHECK(s.short_transfers >= multi);
  if (mode.kind == EngineKind::kUring && mode.eager) {
    // Each chained read entered the kernel on its own, right after its predecessor completed.
    CHECK(s.kernel_calls >= kDepth * (kPerChain - 1));
  }
}

TEST_CASE("reading past the end of the file is an error naming the file and offset", "[io]") {
  const EngineKind kind = GENERATE(EngineKind::kUring, EngineKind::kThreads);
  CAPTURE(engine_kind_name(kind));
  mammoth::testing::TestDir dir;
  auto io = make(kind, dir.path(), {.checksums = false});
  const std::string path = dir.file("short");
  const FileId f = io->open(path);
  AlignedBuffer out(12288), in(16384);
  fill_random(out, 3);
  io->write(f, 0, out.data(), out.size()).wait();

  // 16 KiB from a 12 KiB file: the kernel returns 12 KiB, the remainder returns 0.
  Ticket t = io->read(f, 0, in.data(), in.size());
  const std::string e = error_of([&] { t.wait(); });
  CHECK(t.ready());
  CHECK_FALSE(t.ok());
  CHECK(e.find(path) != std::string::npos);
  CHECK(e.find("at offset 0, length 16384") != std::string::npos);
  CHECK(e.find("end of the file after 12288 bytes") != std::string::npos);
  CHECK(std::memcmp(out.data(), in.data(), out.size()) == 0);  // what was there did arrive
  CHECK(io->stats().short_transfers >= 1);

  Ticket beyond = io->read(f, 1 << 20, in.data(), 4096);
  CHECK(error_of([&] { beyond.wait(); }).find("end of the file after 0 bytes") !=
        std::string::npos);
  // synchronize() reports the first failure and counts the rest.
  const std::string s = error_of([&] { io->synchronize(); });
  CHECK(s.find("length 16384") != std::string::npos);
  CHECK(s.find("and 1 more failed requests") != std::string::npos);
  io->synchronize();  // errors are reported once
}

TEST_CASE("a block changed behind the engine's back fails its read", "[io]") {
  const EngineKind kind = GENERATE(EngineKind::kUring, EngineKind::kThreads);
  CAPTURE(engine_kind_name(kind));
  mammoth::testing::TestDir dir;
  auto io = make(kind, dir.path());
  const std::string path = dir.file("chunk");
  const FileId f = io->open(path);
  AlignedBuffer out(16 * 4096), in(16 * 4096);
  fill_random(out, 5);
  io->write(f, 0, out.data(), out.size()).wait();

  // Flip one byte of block 9 through an ordinary descriptor.
  const int fd = ::open(path.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  char byte;
  REQUIRE(::pread(fd, &byte, 1, 9 * 4096 + 123) == 1);
  byte = static_cast<char>(byte ^ 0x20);
  REQUIRE(::pwrite(fd, &byte, 1, 9 * 4096 + 123) == 1);
  ::fsync(fd);
  ::close(fd);

  const std::string e = error_of([&] { io->read(f, 0, in.data(), in.size()).wait(); });
  CHECK(e.find("checksum mismatch in " + path + " block 9 (offset 36864") != std::string::npos);
  CHECK(io->stats().checksum_failures == 1);
  // Blocks before it are intact and still verify.
  io->read(f, 0, in.data(), 9 * 4096).wait();
  CHECK(std::memcmp(out.data(), in.data(), 9 * 4096) == 0);
  // Rewriting the block through the engine makes it good again.
  io->write(f, 9 * 4096, out.data() + 9 * 4096, 4096).wait();
  io->read(f, 0, in.data(), in.size()).wait();
  CHECK(std::memcmp(out.data(), in.data(), in.size()) == 0);
  // A block never written through the engine has no checksum to verify against.
  io->write(f, 20 * 4096, out.data(), 4096).wait();  // extends the file past block 16..19
  const std::string never = error_of([&] { io->read(f, 17 * 4096, in.data(), 4096).wait(); });
  CHECK(never.find("block 17") != std::string::npos);
  CHECK(never.find("never written") != std::string::npos);
  error_of([&] { io->synchronize(); });
}

TEST_CASE("malformed requests are rejected at submission and queue nothing", "[io]") {
  const EngineKind kind = GENERATE(EngineKind::kUring, EngineKind::kThreads);
  CAPTURE(engine_kind_name(kind));
  mammoth::testing::TestDir dir;
  auto io = make(kind, dir.path());
  const FileId f = io->open(dir.file("data"));
  AlignedBuffer b(8192);
  CHECK(error_of([&] { io->write(f, 0, b.data() + 512, 4096); }).find("aligned to 4096") !=
        std::string::npos);
  CHECK(error_of([&] { io->write(f, 512, b.data(), 4096); }).find("offset 512") !=
        std::string::npos);
  CHECK(error_of([&] { io->read(f, 0, b.data(), 1000); }).find("length 1000") != std::string::npos);
  CHECK(error_of([&] { io->read(f, 0, b.data(), 0); }).find("length 0") != std::string::npos);
  CHECK(error_of([&] { io->read(f + 5, 0, b.data(), 4096); }).find("no open file with id") !=
        std::string::npos);
  // One bad request in a batch queues none of them.
  std::vector<Request> batch = {{Op::kWrite, f, 0, b.data(), 4096, {}},
                                {Op::kWrite, f, 4096, b.data(), 100, {}}};
  CHECK(error_of([&] { io->submit(std::move(batch)); }).find("length 100") != std::string::npos);
  CHECK(io->outstanding() == 0);
  CHECK(io->stats().requests == 0);
}

TEST_CASE("close refuses a file with requests in flight and forgets its id", "[io]") {
  mammoth::testing::TestDir dir;
  auto io = make(EngineKind::kThreads, dir.path(), {.queue_depth = 1});
  const FileId a = io->open(dir.file("a"));
  const FileId b = io->open(dir.file("b"));
  AlignedBuffer big(8 << 20);
  // Queue several large writes behind one worker so some are surely still pending.
  std::vector<Ticket> ts;
  for (int i = 0; i < 4; ++i) ts.push_back(io->write(a, int64_t{i} << 23, big.data(), big.size()));
  CHECK(error_of([&] { io->close(a); }).find("in flight") != std::string::npos);
  io->synchronize();
  io->close(a);
  CHECK(error_of([&] { io->read(a, 0, big.data(), 4096); }).find("no open file") !=
        std::string::npos);
  io->close(b);
}

TEST_CASE("io_uring: registered buffers take the fixed path", "[io]") {
  mammoth::testing::TestDir dir;
  auto io = make(EngineKind::kUring, dir.path());
  auto* uring = dynamic_cast<UringEngine*>(io.get());
  REQUIRE(uring != nullptr);
  CHECK(uring->registered_file_slots() > 0);
  const FileId f = io->open(dir.file("data"));
  AlignedBuffer staging(1 << 20), in(1 << 20);
  fill_random(staging, 9);
  REQUIRE(io->register_buffer(staging.data(), staging.size()));
  // A request inside the registered range (not at its start) uses it too.
  io->write(f, 0, staging.data(), 512 * 1024).wait();
  io->write(f, 512 * 1024, staging.data() + 512 * 1024, 512 * 1024).wait();
  CHECK(io->stats().fixed_buffer_ios == 2);
  io->read(f, 0, in.data(), in.size()).wait();  // not registered: plain read
  CHECK(io->stats().fixed_buffer_ios == 2);
  CHECK(std::memcmp(staging.data(), in.data(), in.size()) == 0);
  io->unregister_buffer(staging.data());
  io->read(f, 0, staging.data(), staging.size()).wait();
  CHECK(io->stats().fixed_buffer_ios == 2);
  CHECK(std::memcmp(staging.data(), in.data(), in.size()) == 0);
  // The threads engine has nothing to register.
  auto threads = make(EngineKind::kThreads, dir.path());
  CHECK_FALSE(threads->register_buffer(staging.data(), staging.size()));
}

TEST_CASE("a write refused by the kernel is an error naming file, offset, length", "[io][fork]") {
  const EngineKind kind = GENERATE(EngineKind::kUring, EngineKind::kThreads);
  CAPTURE(engine_kind_name(kind));
  mammoth::testing::TestDir dir;
  const std::string path = dir.file("limited");
  // RLIMIT_FSIZE makes writes past 1 MiB fail with EFBIG, as a full disk fails with ENOSPC.
  const std::string out = run_in_child([&]() -> std::string {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{1 << 20, 1 << 20};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) return "setrlimit failed";
    auto io = make_async_io({.engine = kind}, dir.path());
    const FileId f = io->open(path);
    AlignedBuffer b(512 * 1024);
    io->write(f, 0, b.data(), b.size()).wait();
    Ticket t = io->write(f, 2 << 20, b.data(), b.size());
    // Two statements: the operands of + are unsequenced, and stats must be read after wait.
    const std::string error = error_of([&] { t.wait(); });
    return error + "\nstats.failed=" + std::to_string(io->stats().failed);
  });
  INFO(out);
  CHECK(out.find("write of " + path +
                 " at offset 2097152, length 524288 failed after 0 bytes: "
                 "File too large") != std::string::npos);
  CHECK(out.find("stats.failed=1") != std::string::npos);
}

TEST_CASE("engine choice: forced, and falling back when the kernel refuses io_uring",
          "[io][fork]") {
  mammoth::testing::TestDir dir;
  {
    // Gone (their threads joined) before the forks below: forking while an engine's threads
    // are still starting can leave the child's allocator or thread registry locked (seen under
    // AddressSanitizer as a child that never returned).
    auto forced = make_async_io({.engine = EngineKind::kThreads}, dir.path());
    CHECK(forced->kind() == EngineKind::kThreads);
    CHECK(forced->fallback_reason().empty());
    auto automatic = make_async_io({}, dir.path());
    CHECK(automatic->kind() == EngineKind::kUring);  // this machine's kernel accepts io_uring
    CHECK(automatic->fallback_reason().empty());
  }

  struct Refusal {
    long syscall;
    const char* reason;
  };
  for (const Refusal r : {Refusal{SYS_io_uring_setup, "io_uring_queue_init_params"},
                          Refusal{SYS_io_uring_enter, "io_uring_enter failed"}}) {
    CAPTURE(r.reason);
    const std::string out = run_in_child([&]() -> std::string {
      if (!deny_syscall(r.syscall)) return "seccomp unavailable";
      auto io = make_async_io({}, dir.path());
      AlignedBuffer a(4096), b(4096);
      fill_random(a, 1);
      const FileId f = io->open(dir.file("fallback"));
      io->write(f, 0, a.data(), 4096).wait();
      io->read(f, 0, b.data(), 4096).wait();
      const bool same = std::memcmp(a.data(), b.data(), 4096) == 0;
      const std::string forced_uring =
          error_of([&] { make_async_io({.engine = EngineKind::kUring}, dir.path()); });
      return std::string(io->name()) + "|" + io->fallback_reason() + "|" +
             (same ? "same" : "different") + "|" + forced_uring;
    });
    INFO(out);
    if (out == "seccomp unavailable") {
      WARN("seccomp filters are not available here; the fallback is not exercised");
      continue;
    }
    CHECK(out.rfind("threads|", 0) == 0);
    CHECK(out.find(r.reason) != std::string::npos);
    CHECK(out.find("Operation not permitted|same|") != std::string::npos);
    // Forcing io_uring where it is refused is an error, not a silent fallback.
    CHECK(out.find("|same|") != std::string::npos);
    CHECK(out.substr(out.find("|same|")).find(r.reason) != std::string::npos);
  }
}

TEST_CASE("options and engine names are checked", "[io]") {
  mammoth::testing::TestDir dir;
  CHECK(error_of([&] {
          make_async_io({.queue_depth = 0}, dir.path());
        }).find("queue depth must be in [1, 4096], got 0") != std::string::npos);
  CHECK(error_of([&] {
          make_async_io({.ring_setup_rung_for_test = 3}, dir.path());
        }).find("ring_setup_rung_for_test must be in [0, 2], got 3") != std::string::npos);
  CHECK(parse_engine_kind("io_uring") == EngineKind::kUring);
  CHECK(parse_engine_kind("threads") == EngineKind::kThreads);
  CHECK(parse_engine_kind("auto") == EngineKind::kAuto);
  CHECK(error_of([] {
          parse_engine_kind("aio", "--io-engine");
        }).find("--io-engine must be auto, io_uring or threads, got 'aio'") != std::string::npos);
  CHECK(error_of([&] { make_async_io({}, dir.file("missing")); }).find(dir.file("missing")) !=
        std::string::npos);
}

}  // namespace
}  // namespace mammoth::memory::io
