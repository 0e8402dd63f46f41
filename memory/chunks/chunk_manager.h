// ChunkManager: fixed-size chunks of bytes paged between the device, host memory and NVMe.
//
// Parameters, gradients and optimizer states are packed into chunks (as in ColossalAI's
// Gemini); the chunk, not the tensor, is what moves. The manager knows nothing about tensors
// (memory/ is a leaf): clients group chunks into lists that share a placement ("params",
// "grads", "exp_avg", ...) and tell it when a chunk is used; the engine's offload runtime maps
// tensors onto chunk bytes (engine/offload/offload.h).
//
// Each chunk has
//   - a compute tier: where kernels read and write it (kDevice, or kHost for the CPU AdamW);
//   - a home tier: where it lives when it is not being used (kDevice, kHost or kNvme), chosen
//     by the placement policy in finalize() from each list's preference order and the budgets;
//   - a state: kResident (usable on its compute tier), kInFlight (being loaded) or kEvicted.
// A chunk whose home is its compute tier is always resident. The others are cached: the
// compute tier keeps a pool of chunk-sized slots ("device cache" within --device-mem, "host
// staging" within --host-mem) and acquire() loads a chunk into a slot, evicting another when
// the pool is full (written back home only when dirty).
//
// Policy. During the first step (until the first end_step()) the manager records the order in
// which chunks are acquired. Afterwards that trace drives both decisions: eviction picks the
// resident chunk whose next use lies farthest ahead (Belady), and after every acquire the next
// chunks of the trace are loaded ahead asynchronously (a copy thread for host -> device, the
// io_uring engine for NVMe), so transfers overlap the kernels that run in between. Before the
// trace exists eviction is least-recently-used. The last few chunks acquired in a pool are
// never evicted, so an op whose arguments span several chunks (an AdamW update touches four)
// finds them all resident: a pool smaller than that minimum is a start-up error naming sizes.
//
// Spans. A tensor larger than a chunk (a token table) is packed into consecutive chunks of one
// list, declared a span. Each piece stays a chunk of its own (an elementwise update pages piece
// by piece, so only a piece of the parameter and one of its gradient are resident together);
// a kernel that reads the tensor whole calls acquire_span(), which makes every piece resident
// in consecutive slots of one arena (each pool's slots are one allocation), so the pieces are
// one contiguous buffer. The pool then needs the span plus one more chunk beside it; spans are
// loaded on demand (prefetch skips them: it fills single slots, and a piece prefetched into the
// wrong slot would only move again).
//
// On the CPU backend the "device" is host memory counted against --device-mem, so the whole
// mechanism runs (and is tested) without a GPU. Accounting is exact: device usage = device-home
// chunks + occupied device slots, checked against the budget on every change; the memory held
// for a tier (TierStats::reserved_bytes: home blocks + every slot) never exceeds it either.
//
// The CUDA device tier (ChunkManagerOptions::device = Device::cuda(i); memory/chunks/cuda_tier.h):
//   - memory: device-homed chunks and device slots are cudaMalloc'd by the manager (not through
//     the caching allocator, so reserved_bytes is exactly the GPU memory chunks take); host
//     homes and NVMe staging slots are pinned host memory. A device-computed list cannot be
//     homed on NVMe (a start-up error).
//   - loads (host -> device, prefetch or demand) run on one dedicated copy stream: the copy
//     stream first waits for everything the compute stream (the calling thread's
//     memory::cuda::current_stream(), where its kernels launch) has queued, since the slot's
//     previous occupant may still be read; then cudaMemcpyAsync; then the chunk's event is
//     recorded. A load is complete for compute only when acquire() makes the compute stream
//     wait for that event: the host never waits on the hot path (so stall_s is not measured
//     for a CUDA tier; it is GPU time).
//   - eviction of a dirty chunk: the copy stream waits for the compute stream's queued work
//     (the kernels writing it), copies device -> host, records the chunk's event. A later load
//     of the chunk is queued behind it on the same stream; host readers of the home copy wait
//     for the event. An evicted chunk's storage gets no address (nullptr) until re-acquired.
//   - acquire_home() hands a device-computed, host-homed chunk's host copy to host code (the
//     CPU AdamW of engine/offload's host-update flow): dirty device bytes are written back and
//     waited for; a write drops the device copy so the next acquire() loads the new bytes.
// Without the CUDA backend in the build, asking for a CUDA tier is an error saying so.
//
// Threading: acquire()/evict and the policy run on one thread (the one launching kernels);
// transfers complete on the copy thread (the copy stream on CUDA) and the I/O engine's threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/device.h"
#include "memory/io/aligned_buffer.h"
#include "memory/io/async_io.h"
#include "memory/io/swap_dir.h"

namespace mammoth::memory::chunks {

enum class Tier : uint8_t { kDevice = 0, kHost = 1, kNvme = 2 };
inline constexpr int kNumTiers = 3;
const char* tier_name(Tier tier);  // "device", "host", "nvme"

enum class ChunkState : uint8_t { kEvicted, kInFlight, kResident };
const char* chunk_state_name(ChunkState state);

using ChunkId = int32_t;
class CudaTier;  // memory/chunks/cuda_tier.h

// "1.5G", "512M", "64K", "4096": bytes with binary suffixes (K = 1024); 0 allowed. Throws
// Error naming `option` otherwise.
int64_t parse_bytes(const std::string& text, const std::string& option);
// --device-mem: "SIZE" (a static budget; 0: unlimited) or "auto:SIZE" (a device of SIZE > 0
// whose chunk budget the first step's traced peak decides). Throws Error naming the flag.
struct DeviceMemSpec {
  bool auto_budget = false;
  int64_t bytes = 0;  // the budget, or with auto_budget the device's size
};
DeviceMemSpec parse_device_mem(const std::string& text);
// "12.0 MiB": short sizes for tables.
std::string short_bytes(int64_t bytes);

struct ChunkListSpec {
  std::string name;              // "params", "grads", "exp_avg", ...
  Tier compute = Tier::kDevice;  // kDevice or kHost
  std::vector<Tier> homes;       // preference order, e.g. {kDevice, kHost}
  std::string role;              // for the "too small" error: "param", "grad", ...
};

struct ChunkManagerOptions {
  int64_t chunk_bytes = 32ll << 20;  // rounded up to io::kBlockSize
  int64_t device_budget = 0;         // bytes; 0: unlimited
  int64_t host_budget = 0;           // bytes; 0: unlimited
  std::string nvme_dir;              // required when a list's home is kNvme
  io::AsyncIOOptions io;
  int prefetch_depth = 2;      // loads in flight ahead of use, per pool
  int host_staging_slots = 8;  // most NVMe-homed chunks held in host memory at once
  int lookahead = 64;          // trace entries scanned for prefetch
  // What the device tier is: Device::cpu() emulates it with host memory counted against
  // device_budget; Device::cuda(i) puts it on that GPU (see "The CUDA device tier" above; the
  // constructor throws when there is no such GPU or no CUDA backend in the build).
  Device device = Device::cpu();
  // A dry run (the planner's, plan/offload_traffic.h): every placement, eviction, prefetch and
  // statistic as in a real run, but NVMe-homed chunks are neither written nor read (no file;
  // nvme_dir only has to be non-empty), so their bytes are unspecified. The CPU device only.
  bool dry_run = false;
};

// Per tier. "in"/"out" are moves into and out of the tier (a host -> device load is device in
// and host out); stall is the time acquire() waited for loads computed on this tier.
struct TierStats {
  int64_t budget = 0;      // 0: unlimited (nvme: the reserved file size)
  int64_t home_bytes = 0;  // capacity of chunks whose home is this tier
  int64_t home_chunks = 0;
  int64_t slots = 0;       // cache slots (device cache, host staging)
  int64_t used_bytes = 0;  // home bytes + occupied slots (device, host)
  int64_t peak_bytes = 0;
  int64_t reserved_bytes = 0;  // memory held for the tier: home blocks + every slot (<= budget)
  int64_t moves_in = 0, bytes_in = 0;
  int64_t moves_out = 0, bytes_out = 0;
  int64_t prefetches = 0;    // loads started ahead of use
  int64_t demand_loads = 0;  // loads started by acquire() itself
  double stall_s = 0;
};

class ChunkManager {
 public:
  explicit ChunkManager(const ChunkManagerOptions& options);
  ~ChunkManager();
  ChunkManager(const ChunkManager&) = delete;
  ChunkManager& operator=(const ChunkManager&) = delete;

  int64_t chunk_bytes() const { return chunk_bytes_; }

  // ---- set-up (before finalize) ----
  int add_list(const ChunkListSpec& spec);
  // A chunk of `list` holding `used_bytes` (<= chunk_bytes()) of data.
  ChunkId add_chunk(int list, int64_t used_bytes);
  // Chunks first .. first + count - 1 (consecutive ids of one list, added in order, all but the
  // last full) hold one tensor: acquire_span() may be called for them. count >= 2.
  void declare_span(ChunkId first, int count);
  // Places every chunk (home tiers, pools), allocates memory, creates the NVMe file and zeroes
  // NVMe-homed chunks. Throws Error naming the option and the sizes when the budgets cannot
  // hold what must be resident at once.
  void finalize();

  // After finalize: a new device budget for the chunks, e.g. what the traced peak of the first
  // step leaves (--device-mem auto). Grows the device cache by whole slots (never shrinks it:
  // a budget below the current one keeps the current one); with everything already
  // device-homed it only checks that they fit. Returns the budget now in force. Throws Error
  // naming the sizes when `bytes` cannot hold the device-homed chunks.
  int64_t set_device_budget(int64_t bytes);
  int64_t device_budget() const { return options_.device_budget; }
  // Chunk-sized slots one operation needs on the device at once (0: no device cache).
  int device_min_slots() const;

  // ---- use ----
  // Makes `id` resident on its compute tier and returns its address there (valid until a later
  // acquire evicts it: the last few acquires of a pool stay resident). write: the chunk will be
  // modified (so it is written back when evicted).
  void* acquire(ChunkId id, bool write);
  // For a consumer on the host (the CPU AdamW of --offload=host|nvme on CUDA) of a chunk
  // computed on the device and homed on the host: returns its home copy, up to date. A dirty
  // device copy is written back first (after the compute stream's work on it) and the host
  // waits for that copy; write: the host will modify the home copy, so the device copy (now
  // stale) is dropped without write-back and the next acquire() loads the new bytes; until that
  // acquire() or end_step() the chunk is not prefetched (a load must not copy the home bytes
  // while the host still writes them). Not part of the recorded trace.
  void* acquire_home(ChunkId id, bool write);
  // A declared span resident at once in consecutive slots; returns the first piece's address
  // (the pieces follow at chunk_bytes() strides). Like acquire() for each piece, and the chunks
  // the last few acquires made resident stay resident (possibly moved to another slot, their
  // observers told: callers take addresses after all of an op's acquires, as kernel launches
  // do). count == 1 is acquire().
  void* acquire_span(ChunkId first, int count, bool write);
  // The contents of `id` are dead (e.g. gradients after the update): no write-back, and the
  // next acquire does not load them (the bytes are then unspecified until written).
  void discard(ChunkId id);
  // What the chunk holds, in the profiler's chunk-move events ("tensors"; cut to what the
  // event's args have room for, ~40 bytes, so name the first and last of many). Must not hold
  // '"' or '\\'.
  void set_label(ChunkId id, std::string label);
  // Called with the chunk's current address whenever it changes: the compute-tier slot when
  // it becomes resident, its home copy when evicted (nullptr for NVMe). The engine points
  // tensor storage at it, so reads that bypass acquire() still see valid bytes.
  void set_observer(ChunkId id, std::function<void(void*)> on_move);
  // Where the chunk's bytes can be read now without moving it (resident slot or home copy;
  // nullptr when only NVMe holds them).
  void* current_address(ChunkId id) const;

  // Forgets the accesses recorded so far (set-up work that is not part of a step).
  void restart_trace();
  // Step boundary: the first call freezes the access trace; every call rewinds the cursor.
  void end_step();
  bool trace_frozen() const { return frozen_; }
  size_t trace_length() const { return trace_.size(); }
  // Waits for every transfer (tests).
  void synchronize();

  // ---- introspection ----
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  int num_lists() const { return static_cast<int>(lists_.size()); }
  Tier home(ChunkId id) const;
  Tier compute(ChunkId id) const;
  ChunkState state(ChunkId id) const;
  int list_of(ChunkId id) const;
  const TierStats& stats(Tier tier) const { return stats_[static_cast<int>(tier)]; }
  // The NVMe file and a chunk's byte offset in it (tests corrupt it); "" / -1 without NVMe.
  std::string nvme_file() const;
  int64_t nvme_offset(ChunkId id) const;
  // "where everything lives": per list and per tier, several lines.
  std::string report() const;

 private:
  struct Chunk;
  struct Pool;
  struct Copier;
  struct Buffer;
  std::unique_ptr<Buffer> make_buffer(Tier tier, int64_t bytes);
  void write_back_home(Chunk& c, const char* src);
  void describe_move(const Chunk& c, ChunkId id, char* args) const;
  void check(ChunkId id, const char* fn) const;
  Pool* pool_of(const Chunk& c);
  void add_used(Tier tier, int64_t delta);
  int take_slot(Pool& pool, ChunkId for_chunk, bool demand);
  int64_t next_use(ChunkId id) const;
  void evict(ChunkId id);
  void start_load(ChunkId id, int slot, bool prefetch);
  void finish_load(ChunkId id);
  void add_slots(Pool& pool, int64_t n);
  int span_window(const Pool& pool, ChunkId first, int count,
                  const std::vector<ChunkId>& keep) const;
  void relocate(Pool& pool, ChunkId id, int window, int count, const std::vector<ChunkId>& keep);
  void note_access(ChunkId id, int count = 1);
  void prefetch();
  bool protected_in(const Pool& pool, ChunkId id, bool demand) const;
  // A slot whose occupant's NVMe write-back is still draining: wait for it, free the slot.
  void drain_slot(Pool& pool, int slot);
  void reclaim_drained(Pool& pool, bool wait);

  ChunkManagerOptions options_;
  // The GPU side of a CUDA device tier (null on the CPU backend). Declared before every buffer
  // so that it is destroyed after them.
  std::unique_ptr<CudaTier> cuda_;
  int64_t chunk_bytes_ = 0;
  bool finalized_ = false;
  std::vector<ChunkListSpec> lists_;
  std::vector<Tier> list_home_;
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::unique_ptr<Pool> device_pool_, host_pool_;
  std::vector<std::unique_ptr<Buffer>> home_buffers_;  // one per tier-homed list (device, host)
  TierStats stats_[kNumTiers];

  // NVMe tier.
  std::unique_ptr<io::SwapDir> swap_;
  std::unique_ptr<io::AsyncIO> io_;
  io::FileId file_ = -1;
  std::string file_path_;
  std::unique_ptr<Copier> copier_;

  // Trace-driven policy.
  bool frozen_ = false;
  std::vector<ChunkId> trace_;
  std::vector<int> trace_count_;  // per trace entry: 1, or the pieces of a span from it
  std::vector<std::vector<int64_t>> positions_;  // per chunk: its indices in trace_
  int64_t cursor_ = 0;
  ChunkId last_ = -1;
  int last_count_ = 0;
  uint64_t clock_ = 0;
};

}  // namespace mammoth::memory::chunks
