// Tests of memory/io's single-request paths (AsyncIO::submit_one, AsyncIO::post) and of the
// recycled request records behind them: a callback-driven pipeline allocates nothing once warm,
// records are reused without leaking anything of the request before, and errors still reach
// callbacks and synchronize(). This binary replaces the global operator new to count heap
// allocations, so it is kept apart from the other memory/io tests. Also here: the eviction of
// verified reads' lines (AsyncIOOptions::evict_verified_lines), a step of the same hot path.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "memory/io/aligned_buffer.h"
#include "memory/io/async_io.h"
#include "test/memory/io/error_of.h"
#include "test/testing/test_dir.h"

namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

// Every operator new of the process: the count the pipeline test reads.
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
// Every form, so that no allocation reaches a delete of another allocator (AddressSanitizer
// replaces the forms left out, and then frees ours with its own).
void* operator new[](std::size_t n) { return ::operator new(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(n == 0 ? 1 : n);
}
void* operator new[](std::size_t n, const std::nothrow_t& t) noexcept {
  return ::operator new(n, t);
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace mammoth::memory::io {
namespace {

constexpr size_t kBlock = 4096;

void fill_random(AlignedBuffer& b, uint32_t seed) {
  std::mt19937 rng(seed);
  auto* w = reinterpret_cast<uint32_t*>(b.data());
  for (size_t i = 0; i < b.size() / 4; ++i) w[i] = rng();
}

using testing::error_of;

// kDepth chains of 1-block reads at pseudo-random blocks; each completion checks its bytes and
// starts the chain's next read from its callback, through post() or through submit() of a batch
// of one. Returns the heap allocations made while it ran.
struct Pipeline {
  static constexpr int kDepth = 8;
  AsyncIO& io;
  FileId f;
  const AlignedBuffer& expect;
  size_t file_blocks;
  int steps;
  bool use_post;
  AlignedBuffer slots{kDepth * kBlock};
  std::atomic<int> wrong{0}, errors{0}, done{0};
  int step[kDepth] = {};

  Request next(int c) {
    const size_t block = (static_cast<size_t>(c) * 7919 + static_cast<size_t>(step[c]) * 104729 +
                          static_cast<size_t>(use_post)) %
                         file_blocks;
    char* buf = slots.data() + static_cast<size_t>(c) * kBlock;
    // Captures: this, c, block, buf: 32 bytes would not fit std::function's local storage, so
    // the block and buffer are recomputed from (this, c) in the callback.
    return {Op::kRead, f,      static_cast<int64_t>(block * kBlock),
            buf,       kBlock, [this, c](const std::string& e) { on_done(c, e); }};
  }
  void on_done(int c, const std::string& e) {
    const size_t block = (static_cast<size_t>(c) * 7919 + static_cast<size_t>(step[c]) * 104729 +
                          static_cast<size_t>(use_post)) %
                         file_blocks;
    if (!e.empty()) {
      errors.fetch_add(1);
    } else if (std::memcmp(slots.data() + static_cast<size_t>(c) * kBlock,
                           expect.data() + block * kBlock, kBlock) != 0) {
      wrong.fetch_add(1);
    }
    done.fetch_add(1);
    if (++step[c] >= steps) return;
    if (use_post) {
      io.post(next(c));
    } else {
      std::vector<Request> one;
      one.push_back(next(c));
      io.submit(std::move(one));
    }
  }
  int64_t run() {
    const int64_t before = g_allocations.load();
    for (int c = 0; c < kDepth; ++c) io.post(next(c));
    io.synchronize();
    return g_allocations.load() - before;
  }
};

TEST_CASE("post(): a callback pipeline allocates nothing once warm", "[io]") {
  const EngineKind kind = GENERATE(EngineKind::kUring, EngineKind::kThreads);
  CAPTURE(engine_kind_name(kind));
  mammoth::testing::TestDir dir;
  auto io = make_async_io({.engine = kind, .queue_depth = Pipeline::kDepth}, dir.path());
  REQUIRE(io->kind() == kind);
  constexpr size_t kFileBlocks = 256;
  constexpr int kSteps = 300;
  const FileId f = io->open(dir.file("data"));
  AlignedBuffer out(kFileBlocks * kBlock);
  fill_random(out, 3);
  io->write(f, 0, out.data(), out.size()).wait();

  Pipeline warm{*io, f, out, kFileBlocks, kSteps, true};
  warm.run();
  Pipeline posted{*io, f, out, kFileBlocks, kSteps, true};
  const int64_t posted_allocs = posted.run();
  Pipeline batched{*io, f, out, kFileBlocks, kSteps, false};
  const int64_t batched_allocs = batched.run();
  const int64_t reads = int64_t{Pipeline::kDepth} * kSteps;
  for (const Pipeline* p : {&warm, &posted, &batched}) {
    CHECK(p->done == reads);
    CHECK(p->wrong == 0);
    CHECK(p->errors == 0);
  }
  INFO("heap allocations per read: post() " << static_cast<double>(posted_allocs) / reads
                                            << ", submit() of one "
                                            << static_cast<double>(batched_allocs) / reads);
  // The engines' queues are deques, which allocate a node every few dozen pushes; nothing else
  // may allocate per request.
  CHECK(posted_allocs * 20 < reads);
  // The counter sees what a batch of one costs (its vectors and the ticket state): the bound
  // above is a real difference, not a blind counter.
  CHECK(batched_allocs >= 2 * reads);
  // Records came back for reuse: at most two per chain are alive at once (the completing read
  // and the next one its callback posted).
  CHECK(io->request_records_allocated() <= 2 * Pipeline::kDepth + 2);
  CHECK(io->stats().blocks_verified == 3 * reads);
}

TEST_CASE("recycled request records: reused across waves, nothing of an old request left", "[io]") {
  const EngineKind kind = GENERATE(EngineKind::kUring, EngineKind::kThreads);
  CAPTURE(engine_kind_name(kind));
  mammoth::testing::TestDir dir;
  auto io = make_async_io({.engine = kind, .queue_depth = 16}, dir.path());
  constexpr size_t kFileBlocks = 64;
  const FileId f = io->open(dir.file("data"));
  AlignedBuffer out(kFileBlocks * kBlock);
  fill_random(out, 9);
  io->write(f, 0, out.data(), out.size()).wait();
  const int64_t after_write = io->request_records_allocated();

  // Waves of posted reads, the later ones larger than every record made before them (the pool
  // runs dry and is refilled), the last past the pool's cap. Each callback holds a shared_ptr:
  // a record that kept its old callback would keep the count up.
  for (const int wave : {64, 128, 1500}) {
    CAPTURE(wave);
    AlignedBuffer in(static_cast<size_t>(wave) * kBlock);
    auto token = std::make_shared<int>(0);
    std::atomic<int> ok{0};
    for (int i = 0; i < wave; ++i) {
      const size_t block = static_cast<size_t>(i * 13) % kFileBlocks;
      char* buf = in.data() + static_cast<size_t>(i) * kBlock;
      io->post({Op::kRead, f, static_cast<int64_t>(block * kBlock), buf, kBlock,
                [&ok, token, buf, block, &out](const std::string& e) {
                  if (e.empty() && std::memcmp(buf, out.data() + block * kBlock, kBlock) == 0) {
                    ok.fetch_add(1);
                  }
                }});
    }
    io->synchronize();
    CHECK(ok == wave);
    CHECK(token.use_count() == 1);
  }
  // Never more records than requests alive at once (1500 at most), though 1692 were posted.
  CHECK(io->request_records_allocated() - after_write <= 1500);

  // A recycled record that carried a write's checksums and a ticket serves a ticketless read
  // and then a ticketed write correctly.
  AlignedBuffer blk(kBlock);
  fill_random(blk, 77);
  io->write(f, 5 * kBlock, blk.data(), kBlock).wait();
  AlignedBuffer back(kBlock);
  std::atomic<bool> read_ok{false};
  io->post({Op::kRead, f, 5 * kBlock, back.data(), kBlock,
            [&](const std::string& e) { read_ok = e.empty(); }});
  io->synchronize();
  CHECK(read_ok);
  CHECK(std::memcmp(back.data(), blk.data(), kBlock) == 0);
}

TEST_CASE("post() and submit_one(): errors reach the callback, the ticket and synchronize()",
          "[io]") {
  const EngineKind kind = GENERATE(EngineKind::kUring, EngineKind::kThreads);
  CAPTURE(engine_kind_name(kind));
  mammoth::testing::TestDir dir;
  auto io = make_async_io({.engine = kind}, dir.path());
  const FileId f = io->open(dir.file("data"));
  AlignedBuffer b(4 * kBlock);
  fill_random(b, 1);
  io->submit_one({Op::kWrite, f, 0, b.data(), 2 * kBlock, {}}).wait();
  io->submit_one({Op::kWrite, f, 4 * kBlock, b.data(), kBlock, {}}).wait();  // file: 5 blocks

  // Blocks 2 and 3 were never written through the engine: no checksum to verify against.
  std::string seen;
  io->post({Op::kRead, f, 0, b.data(), 4 * kBlock, [&](const std::string& e) { seen = e; }});
  const std::string e = error_of([&] { io->synchronize(); });
  CHECK(seen.find("block 2") != std::string::npos);
  CHECK(seen.find("never written") != std::string::npos);
  CHECK(e.find(seen) != std::string::npos);

  Ticket t = io->submit_one({Op::kRead, f, 2 * kBlock, b.data(), kBlock, {}});
  CHECK(error_of([&] { t.wait(); }).find("block 2") != std::string::npos);
  CHECK(!t.ok());
  error_of([&] { io->synchronize(); });
  Ticket good = io->submit_one({Op::kRead, f, 0, b.data(), 2 * kBlock, {}});
  good.wait();
  CHECK(good.ok());
  // A ticket is marked done before the engine drops its request from outstanding(): drain.
  io->synchronize();

  // Malformed single requests throw at the call and queue nothing.
  CHECK(error_of([&] {
          io->post({Op::kRead, f, 0, b.data() + 8, kBlock, {}});
        }).find("aligned to 4096") != std::string::npos);
  CHECK(error_of([&] {
          io->submit_one({Op::kRead, f + 3, 0, b.data(), kBlock, {}});
        }).find("no open file with id") != std::string::npos);
  CHECK(io->outstanding() == 0);
  io->synchronize();
}

TEST_CASE("evict_verified_lines: verified reads leave the caches, bytes and errors unchanged",
          "[io]") {
  const EngineKind kind = GENERATE(EngineKind::kUring, EngineKind::kThreads);
  const bool evict = GENERATE(true, false);
  CAPTURE(engine_kind_name(kind), evict);
  mammoth::testing::TestDir dir;
  auto io =
      make_async_io({.engine = kind, .queue_depth = 8, .evict_verified_lines = evict}, dir.path());
  constexpr size_t kFileBlocks = 128;
  const FileId f = io->open(dir.file("data"));
  AlignedBuffer out(kFileBlocks * kBlock);
  fill_random(out, 11);
  io->write(f, 0, out.data(), out.size()).wait();
  Pipeline p{*io, f, out, kFileBlocks, 50, true};
  p.run();
  // A multi-block read too, and one that fails verification (a block never written).
  AlignedBuffer in(kFileBlocks * kBlock);
  io->read(f, 0, in.data(), in.size()).wait();
  CHECK(std::memcmp(in.data(), out.data(), in.size()) == 0);
  CHECK(p.wrong == 0);
  CHECK(p.errors == 0);
  io->write(f, static_cast<int64_t>((kFileBlocks + 1) * kBlock), out.data(), kBlock).wait();
  CHECK(error_of([&] {
          io->read(f, static_cast<int64_t>(kFileBlocks * kBlock), in.data(), kBlock).wait();
        }).find("never written") != std::string::npos);
  error_of([&] { io->synchronize(); });
  const IOStats s = io->stats();
  const int64_t read_bytes = (int64_t{Pipeline::kDepth} * 50 + int64_t{kFileBlocks}) * kBlock;
  CHECK(s.bytes_read == read_bytes);
  // Only verified reads are evicted (the failed one is not), and only when asked and possible.
  CHECK(s.bytes_evicted == (evict && cache_eviction_supported() ? read_bytes : 0));
}

}  // namespace
}  // namespace mammoth::memory::io
