#include "memory/chunks/chunk_manager.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>

#include "base/error.h"
#include "engine/profile/profile.h"
#include "memory/chunks/cuda_tier.h"

namespace mammoth::memory::chunks {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

constexpr int64_t kNever = std::numeric_limits<int64_t>::max() / 4;

}  // namespace

const char* tier_name(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kNvme:
      return "nvme";
  }
  return "?";
}

const char* chunk_state_name(ChunkState state) {
  switch (state) {
    case ChunkState::kEvicted:
      return "evicted";
    case ChunkState::kInFlight:
      return "in flight";
    case ChunkState::kResident:
      return "resident";
  }
  return "?";
}

int64_t parse_bytes(const std::string& text, const std::string& option) {
  MAMMOTH_CHECK(!text.empty()) << "[" << option << "] is empty; expected a size like 512M or 2G";
  double mult = 1;
  std::string digits = text;
  const char last = text.back();
  if (last == 'K' || last == 'k') mult = 1024.0;
  if (last == 'M' || last == 'm') mult = 1024.0 * 1024;
  if (last == 'G' || last == 'g') mult = 1024.0 * 1024 * 1024;
  if (last == 'T' || last == 't') mult = 1024.0 * 1024 * 1024 * 1024;
  if (mult != 1) digits.pop_back();
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(digits, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MAMMOTH_CHECK(used == digits.size() && used > 0 && v >= 0 && std::isfinite(v))
      << "[" << option << "] must be a size like 4096, 64K, 512M or 1.5G, got '" << text << "'";
  return static_cast<int64_t>(std::llround(v * mult));
}

DeviceMemSpec parse_device_mem(const std::string& text) {
  if (text.rfind("auto", 0) != 0) return {false, parse_bytes(text, "--device-mem")};
  // The device's size: on the CPU backend an emulated one must be given (auto:SIZE).
  MAMMOTH_CHECK(text.size() > 5 && text[4] == ':')
      << "[--device-mem] " << text
      << ": on the CPU backend auto needs the emulated device's size, e.g. auto:8G";
  const int64_t size = parse_bytes(text.substr(5), "--device-mem auto:");
  MAMMOTH_CHECK(size > 0) << "[--device-mem] auto: needs a size > 0";
  return {true, size};
}

std::string short_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int i = 0;
  while (std::fabs(v) >= 1024 && i < 4) {
    v /= 1024;
    ++i;
  }
  char buf[32];
  if (i == 0)
    std::snprintf(buf, sizeof(buf), "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof(buf), "%.1f %s", v, units[i]);
  return buf;
}

// ---- internals ----

// A finished-or-not memcpy on the copy thread.
struct CopyDone {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool ready() {
    std::lock_guard<std::mutex> lock(mu);
    return done;
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
};

// One thread doing host -> device copies in FIFO order, so prefetches overlap the kernels.
// (On a GPU this is a copy stream; on the CPU backend it is a memcpy on another core.)
struct ChunkManager::Copier {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool stop = false;
  std::thread thread;

  Copier() {
    thread = std::thread([this] {
      for (;;) {
        std::function<void()> task;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || !queue.empty(); });
          if (queue.empty()) return;
          task = std::move(queue.front());
          queue.pop_front();
        }
        task();
      }
    });
  }
  ~Copier() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    thread.join();
  }
  std::shared_ptr<CopyDone> copy(void* dst, const void* src, size_t n) {
    auto done = std::make_shared<CopyDone>();
    {
      std::lock_guard<std::mutex> lock(mu);
      queue.push_back([dst, src, n, done] {
        std::memcpy(dst, src, n);
        {
          std::lock_guard<std::mutex> l(done->mu);
          done->done = true;
        }
        done->cv.notify_all();
      });
    }
    cv.notify_one();
    return done;
  }
};

// Memory for chunks: an AlignedBuffer on the CPU backend; on a CUDA device tier, device memory
// (device homes and slots) or pinned host memory (host homes, staging slots) from CudaTier.
struct ChunkManager::Buffer {
  io::AlignedBuffer host;
  void* ptr = nullptr;
  size_t size = 0;
  bool on_device = false;
  CudaTier* cuda = nullptr;

  char* data() { return ptr != nullptr ? static_cast<char*>(ptr) : host.data(); }
  ~Buffer() {
    if (cuda == nullptr || ptr == nullptr) return;
    try {
      if (on_device)
        cuda->device_free(ptr, size);
      else
        cuda->host_free(ptr);
    } catch (const std::exception&) {
      // Destructors do not throw; a failing free surfaces at the next checked CUDA call.
    }
  }
};

struct ChunkManager::Chunk {
  int list = 0;
  int64_t used = 0;
  Tier home = Tier::kDevice;
  Tier compute = Tier::kDevice;
  ChunkState state = ChunkState::kEvicted;
  char* home_ptr = nullptr;  // device/host home copy; nullptr for NVMe
  int64_t nvme_offset = -1;
  int slot = -1;  // cache slot while in flight or resident (cached chunks)
  bool dirty = false;
  bool discarded = false;
  // Handed to the host for writing (acquire_home): not prefetched until the next acquire() or
  // end_step(), so no load copies the home bytes while the host is still changing them.
  bool host_written = false;
  uint64_t last_use = 0;
  int span = 0;  // on a span's first piece: its pieces (declare_span)
  std::function<void(void*)> on_move;
  std::shared_ptr<CopyDone> copy;  // pending host -> compute load
  io::Ticket read;                 // pending NVMe -> compute load
  io::Ticket write_back;           // last NVMe write of this chunk
  void* event = nullptr;           // CUDA: the last copy-stream operation on this chunk
  std::string label;               // what the chunk holds, for the profiler (set_label)
};

// Chunk-sized slots on a compute tier caching chunks homed further away.
struct ChunkManager::Pool {
  Tier tier = Tier::kDevice;
  int min_resident = 1;  // chunks one operation may need at once
  // Slot memory: each arena is one allocation of consecutive slots, so chunks in consecutive
  // slots of one arena are one contiguous buffer (acquire_span); growth adds an arena.
  std::vector<std::unique_ptr<Buffer>> arenas;
  std::vector<char*> slot;           // each slot's address
  std::vector<int> arena;            // each slot's arena
  std::vector<ChunkId> owner;        // -1: free
  std::vector<io::Ticket> draining;  // NVMe write-back still reading the slot
  // CUDA: the chunk whose write-back last read the slot (-1: none). Its event orders a kernel
  // writing the slot's next occupant after that copy when no load of its own does.
  std::vector<ChunkId> last_write_back;
  // The last min_resident chunks acquired, newest first. A demand load keeps the newest
  // min_resident - 1 (with the one it loads, that is what one op may touch); a prefetch keeps
  // them all, so it never pulls an argument from under the op about to run.
  std::deque<ChunkId> recent;
  int in_flight = 0;
};

ChunkManager::ChunkManager(const ChunkManagerOptions& options) : options_(options) {
  MAMMOTH_CHECK(options.chunk_bytes > 0)
      << "[ChunkManager] --chunk-mb must be > 0, got " << options.chunk_bytes << " bytes";
  MAMMOTH_CHECK(options.device_budget >= 0 && options.host_budget >= 0)
      << "[ChunkManager] budgets must be >= 0, got --device-mem " << options.device_budget
      << ", --host-mem " << options.host_budget;
  MAMMOTH_CHECK(options.prefetch_depth >= 0 && options.host_staging_slots >= 1)
      << "[ChunkManager] prefetch_depth must be >= 0 and host_staging_slots >= 1";
  const int64_t b = static_cast<int64_t>(io::kBlockSize);
  chunk_bytes_ = (options.chunk_bytes + b - 1) / b * b;
  MAMMOTH_CHECK(!options.dry_run || !options.device.is_cuda())
      << "[ChunkManager] a dry run emulates the device with host memory: give Device::cpu()";
  if (options.device.is_cuda()) cuda_ = std::make_unique<CudaTier>(options.device.index);
}

ChunkManager::~ChunkManager() {
  copier_.reset();  // finishes queued copies first
  if (cuda_) {
    try {
      cuda_->synchronize();  // no copy or kernel still touches the memory freed below
    } catch (const std::exception&) {
      // Reported by whoever synchronises next; the memory goes anyway.
    }
    for (auto& c : chunks_) cuda_->free_event(c->event);
  }
  if (io_) {
    try {
      io_->synchronize();
    } catch (const std::exception&) {
      // Errors were reported to whoever waited; the file is about to be removed anyway.
    }
    if (file_ >= 0) io_->close(file_);
  }
  io_.reset();
  swap_.reset();
  device_pool_.reset();
  host_pool_.reset();
  home_buffers_.clear();
}

std::unique_ptr<ChunkManager::Buffer> ChunkManager::make_buffer(Tier tier, int64_t bytes) {
  auto b = std::make_unique<Buffer>();
  if (cuda_) {
    b->cuda = cuda_.get();
    b->size = static_cast<size_t>(bytes);
    b->on_device = tier == Tier::kDevice;
    b->ptr = b->on_device ? cuda_->device_alloc(b->size) : cuda_->host_alloc(b->size);
  } else {
    b->host = io::AlignedBuffer(static_cast<size_t>(bytes));
  }
  stats_[static_cast<int>(tier)].reserved_bytes += bytes;
  return b;
}

void ChunkManager::check(ChunkId id, const char* fn) const {
  MAMMOTH_CHECK(id >= 0 && id < num_chunks()) << "[ChunkManager::" << fn << "] chunk " << id
                                              << " out of range (" << num_chunks() << " chunks)";
}

int ChunkManager::add_list(const ChunkListSpec& spec) {
  MAMMOTH_CHECK(!finalized_) << "[ChunkManager::add_list] after finalize()";
  MAMMOTH_CHECK(spec.compute != Tier::kNvme)
      << "[ChunkManager::add_list] list '" << spec.name << "' cannot be computed on NVMe";
  MAMMOTH_CHECK(!spec.homes.empty())
      << "[ChunkManager::add_list] list '" << spec.name << "' has no home tiers";
  for (Tier t : spec.homes) {
    MAMMOTH_CHECK(static_cast<int>(t) >= static_cast<int>(spec.compute))
        << "[ChunkManager::add_list] list '" << spec.name << "' computed on "
        << tier_name(spec.compute) << " cannot live on " << tier_name(t);
  }
  lists_.push_back(spec);
  list_home_.push_back(spec.homes.front());
  return static_cast<int>(lists_.size()) - 1;
}

ChunkId ChunkManager::add_chunk(int list, int64_t used_bytes) {
  MAMMOTH_CHECK(!finalized_) << "[ChunkManager::add_chunk] after finalize()";
  MAMMOTH_CHECK(list >= 0 && list < num_lists())
      << "[ChunkManager::add_chunk] list " << list << " out of range";
  MAMMOTH_CHECK(used_bytes >= 0 && used_bytes <= chunk_bytes_)
      << "[ChunkManager::add_chunk] " << used_bytes << " bytes do not fit a chunk of "
      << chunk_bytes_ << " bytes (list '" << lists_[list].name << "')";
  auto c = std::make_unique<Chunk>();
  c->list = list;
  c->used = used_bytes;
  c->compute = lists_[list].compute;
  chunks_.push_back(std::move(c));
  positions_.emplace_back();
  return static_cast<ChunkId>(chunks_.size()) - 1;
}

void ChunkManager::declare_span(ChunkId first, int count) {
  MAMMOTH_CHECK(!finalized_) << "[ChunkManager::declare_span] after finalize()";
  MAMMOTH_CHECK(count >= 2 && first >= 0 && first + count <= num_chunks())
      << "[ChunkManager::declare_span] chunks " << first << " + " << count << " out of range ("
      << num_chunks() << " chunks)";
  for (int j = 0; j < count; ++j) {
    const Chunk& c = *chunks_[first + j];
    MAMMOTH_CHECK(c.list == chunks_[first]->list && (j == count - 1 || c.used == chunk_bytes_))
        << "[ChunkManager::declare_span] chunk " << first + j << " of the span from " << first
        << " is not a full chunk of list '" << lists_[chunks_[first]->list].name << "'";
  }
  chunks_[first]->span = count;
}

void ChunkManager::add_slots(Pool& pool, int64_t n) {
  if (n <= 0) return;
  pool.arenas.push_back(make_buffer(pool.tier, n * chunk_bytes_));
  char* base = pool.arenas.back()->data();
  for (int64_t i = 0; i < n; ++i) {
    pool.slot.push_back(base + i * chunk_bytes_);
    pool.arena.push_back(static_cast<int>(pool.arenas.size()) - 1);
  }
}

int64_t ChunkManager::set_device_budget(int64_t bytes) {
  MAMMOTH_CHECK(finalized_) << "[ChunkManager::set_device_budget] before finalize()";
  MAMMOTH_CHECK(bytes > 0) << "[ChunkManager] a device budget must be > 0, got " << bytes;
  const TierStats& d = stats_[0];
  const int64_t home = d.home_bytes;
  if (!device_pool_) {
    // Everything computed on the device lives there already.
    MAMMOTH_CHECK(bytes >= home) << "[ChunkManager] a device budget of " << short_bytes(bytes)
                                 << " cannot hold the " << short_bytes(home)
                                 << " of device-homed chunks";
    if (options_.device_budget > 0) {
      options_.device_budget = std::max(options_.device_budget, bytes);
      stats_[0].budget = options_.device_budget;
    }
    return options_.device_budget;
  }
  const int64_t slots = (bytes - home) / chunk_bytes_;
  Pool& pool = *device_pool_;
  const int64_t have = static_cast<int64_t>(pool.slot.size());
  if (slots <= have) return options_.device_budget;
  synchronize();  // no transfer in flight while the pool's vectors grow
  // New slots are free; the chunks in the old ones stay where they are (slots are held by
  // pointer: growing the vector moves no memory).
  add_slots(pool, slots - have);
  pool.owner.resize(static_cast<size_t>(slots), -1);
  pool.draining.resize(static_cast<size_t>(slots));
  pool.last_write_back.resize(static_cast<size_t>(slots), -1);
  options_.device_budget = bytes;
  stats_[0].budget = bytes;
  stats_[0].slots = slots;
  return bytes;
}

int ChunkManager::device_min_slots() const { return device_pool_ ? device_pool_->min_resident : 0; }

void ChunkManager::add_used(Tier tier, int64_t delta) {
  TierStats& s = stats_[static_cast<int>(tier)];
  s.used_bytes += delta;
  s.peak_bytes = std::max(s.peak_bytes, s.used_bytes);
  if (profile::on()) {
    char name[48];
    std::snprintf(name, sizeof(name), "chunks.%s", tier_name(tier));
    profile::counter(name, s.used_bytes);
  }
  // The invariant the whole policy exists for; a violation is a bug here, not a user error.
  MAMMOTH_CHECK(s.budget == 0 || tier == Tier::kNvme || s.used_bytes <= s.budget)
      << "[ChunkManager] internal: " << tier_name(tier) << " usage " << s.used_bytes
      << " bytes exceeds the budget of " << s.budget << " bytes";
}

void ChunkManager::finalize() {
  MAMMOTH_CHECK(!finalized_) << "[ChunkManager::finalize] called twice";
  finalized_ = true;
  std::vector<int64_t> list_chunks(lists_.size(), 0);
  for (const auto& c : chunks_) ++list_chunks[c->list];
  auto list_bytes = [&](size_t l) { return list_chunks[l] * chunk_bytes_; };
  stats_[0].budget = options_.device_budget;
  stats_[1].budget = options_.host_budget;

  // Device: everything computed there lives there when it all fits; otherwise nothing does
  // and the budget becomes a cache of slots (simple, and the trace-driven cache keeps whatever
  // is used soonest, which a static split would have to guess).
  int64_t device_wanted = 0;
  for (size_t l = 0; l < lists_.size(); ++l) {
    if (lists_[l].homes.front() == Tier::kDevice) device_wanted += list_bytes(l);
  }
  const bool all_on_device = options_.device_budget == 0 || device_wanted <= options_.device_budget;
  int64_t host_home = 0;
  for (size_t l = 0; l < lists_.size(); ++l) {
    const ChunkListSpec& spec = lists_[l];
    bool placed = false;
    std::ostringstream why;
    for (Tier t : spec.homes) {
      if (t == Tier::kDevice) {
        if (all_on_device) {
          list_home_[l] = t;
          placed = true;
          break;
        }
        why << " device: everything computed there needs " << short_bytes(device_wanted)
            << " > --device-mem " << short_bytes(options_.device_budget) << ";";
      } else if (t == Tier::kHost) {
        if (options_.host_budget == 0 || host_home + list_bytes(l) <= options_.host_budget) {
          list_home_[l] = t;
          host_home += list_bytes(l);
          placed = true;
          break;
        }
        why << " host: " << short_bytes(list_bytes(l)) << " with " << short_bytes(host_home)
            << " already placed > --host-mem " << short_bytes(options_.host_budget) << ";";
      } else {
        if (!options_.nvme_dir.empty()) {
          list_home_[l] = t;
          placed = true;
          break;
        }
        why << " nvme: no --nvme-dir given;";
      }
    }
    MAMMOTH_CHECK(placed) << "[ChunkManager] '" << spec.name << "' (" << list_chunks[l]
                          << " chunks of " << short_bytes(chunk_bytes_) << " = "
                          << short_bytes(list_bytes(l)) << ") fits none of its tiers:" << why.str()
                          << " raise the budget or offload further (--offload=nvme --nvme-dir)";
  }

  for (size_t l = 0; l < lists_.size(); ++l) {
    // A GPU reads chunks from device memory, and loads them from pinned host memory; an NVMe
    // home would need a host staging hop that only host-computed lists have.
    MAMMOTH_CHECK(!cuda_ || lists_[l].compute != Tier::kDevice || list_home_[l] != Tier::kNvme)
        << "[ChunkManager] '" << lists_[l].name << "' is computed on the GPU and would live on "
        << "NVMe: a CUDA device tier pages device chunks through host memory only";
  }

  // Pools: which lists are cached on which compute tier, and the longest span each must hold.
  int device_cached_lists = 0, host_cached_lists = 0;
  int device_span = 0, host_span = 0;
  for (const auto& c : chunks_) {
    if (c->span == 0 || list_home_[c->list] == lists_[c->list].compute) continue;
    int& span = lists_[c->list].compute == Tier::kDevice ? device_span : host_span;
    span = std::max(span, c->span);
  }
  // A span beside one more chunk (a bias, the op's other argument); else one update's lists.
  auto span_text = [](int span) {
    return "a tensor spanning " + std::to_string(span) +
           " chunks needs them resident at once, with one more beside them";
  };
  std::string device_roles, host_roles;
  for (size_t l = 0; l < lists_.size(); ++l) {
    if (list_home_[l] == lists_[l].compute || list_chunks[l] == 0) continue;
    std::string& roles = lists_[l].compute == Tier::kDevice ? device_roles : host_roles;
    roles +=
        (roles.empty() ? "" : ", ") + (lists_[l].role.empty() ? lists_[l].name : lists_[l].role);
    ++(lists_[l].compute == Tier::kDevice ? device_cached_lists : host_cached_lists);
  }
  int64_t device_home = 0, nvme_total = 0;
  for (size_t l = 0; l < lists_.size(); ++l) {
    if (list_home_[l] == Tier::kDevice) device_home += list_bytes(l);
    if (list_home_[l] == Tier::kNvme) nvme_total += list_bytes(l);
  }
  if (device_cached_lists > 0) {
    const int64_t room = options_.device_budget - device_home;
    // Unlimited: a slot for every cached chunk (lists homed only off the device, as the CUDA
    // flow of --offload=host|nvme homes parameters and gradients on the host).
    int64_t cached_chunks = 0;
    for (size_t l = 0; l < lists_.size(); ++l) {
      if (lists_[l].compute == Tier::kDevice && list_home_[l] != Tier::kDevice)
        cached_chunks += list_chunks[l];
    }
    const int need = std::max(device_cached_lists, device_span > 0 ? device_span + 1 : 0);
    const int64_t slots =
        options_.device_budget == 0 ? std::max<int64_t>(cached_chunks, need) : room / chunk_bytes_;
    MAMMOTH_CHECK(slots >= need) << "[ChunkManager] --device-mem "
                                 << short_bytes(options_.device_budget) << " holds " << slots
                                 << " chunk(s) of " << short_bytes(chunk_bytes_)
                                 << " (--chunk-mb), but "
                                 << (need > device_cached_lists
                                         ? span_text(device_span)
                                         : "one update needs " + std::to_string(need) +
                                               " resident at once (" + device_roles + ")")
                                 << ": raise --device-mem to at least "
                                 << short_bytes(device_home + need * chunk_bytes_)
                                 << (need > device_cached_lists ? "" : " or lower --chunk-mb");
    device_pool_ = std::make_unique<Pool>();
    device_pool_->tier = Tier::kDevice;
    device_pool_->min_resident = need;
    add_slots(*device_pool_, slots);
    device_pool_->owner.assign(slots, -1);
    device_pool_->draining.resize(slots);
    device_pool_->last_write_back.assign(slots, -1);
    stats_[0].slots = slots;
  }
  if (host_cached_lists > 0) {
    const int need = std::max(host_cached_lists, host_span > 0 ? host_span + 1 : 0);
    int64_t slots = std::max(options_.host_staging_slots, need);
    if (options_.host_budget > 0)
      slots = std::min<int64_t>(slots, (options_.host_budget - host_home) / chunk_bytes_);
    MAMMOTH_CHECK(slots >= need)
        << "[ChunkManager] --host-mem " << short_bytes(options_.host_budget) << " leaves "
        << short_bytes(std::max<int64_t>(0, options_.host_budget - host_home))
        << " after host-resident chunks (" << short_bytes(host_home) << "): room for " << slots
        << " staging chunk(s) of " << short_bytes(chunk_bytes_) << ", but "
        << (need > host_cached_lists
                ? span_text(host_span)
                : "updating NVMe-resident " + host_roles + " needs " + std::to_string(need))
        << ": raise --host-mem to at least " << short_bytes(host_home + need * chunk_bytes_)
        << (need > host_cached_lists ? "" : " or lower --chunk-mb");
    host_pool_ = std::make_unique<Pool>();
    host_pool_->tier = Tier::kHost;
    host_pool_->min_resident = need;
    add_slots(*host_pool_, slots);
    host_pool_->owner.assign(slots, -1);
    host_pool_->draining.resize(slots);
    host_pool_->last_write_back.assign(slots, -1);
    stats_[1].slots = slots;
  }

  // Home memory: one zeroed block per device- or host-homed list.
  for (size_t l = 0; l < lists_.size(); ++l) {
    const Tier home = list_home_[l];
    TierStats& s = stats_[static_cast<int>(home)];
    s.home_bytes += list_bytes(l);
    s.home_chunks += list_chunks[l];
    if (home == Tier::kNvme || list_chunks[l] == 0) continue;
    home_buffers_.push_back(make_buffer(home, list_bytes(l)));
    char* base = home_buffers_.back()->data();
    int64_t k = 0;
    for (auto& c : chunks_) {
      if (c->list != static_cast<int>(l)) continue;
      c->home_ptr = base + k++ * chunk_bytes_;
    }
    add_used(home, list_bytes(l));
  }
  int64_t nvme_offset = 0;
  for (auto& c : chunks_) {
    c->home = list_home_[c->list];
    if (c->home == c->compute) c->state = ChunkState::kResident;
    if (c->home == Tier::kNvme) {
      c->nvme_offset = nvme_offset;
      nvme_offset += chunk_bytes_;
    }
  }
  if (cuda_) {
    for (auto& c : chunks_) {
      if (c->compute == Tier::kDevice && c->home != Tier::kDevice) c->event = cuda_->new_event();
    }
  }
  if (device_pool_ && !cuda_) {
    for (size_t l = 0; l < lists_.size(); ++l) {
      if (lists_[l].compute == Tier::kDevice && list_home_[l] == Tier::kHost) {
        copier_ = std::make_unique<Copier>();
        break;
      }
    }
  }
  if (nvme_total > 0 && options_.dry_run) {
    stats_[2].budget = stats_[2].used_bytes = stats_[2].peak_bytes = nvme_total;
  } else if (nvme_total > 0) {
    stats_[2].budget = nvme_total;
    swap_ = std::make_unique<io::SwapDir>(options_.nvme_dir, nvme_total);
    file_path_ = swap_->create_file("chunks.bin", nvme_total);
    io_ = io::make_async_io(options_.io, swap_->path());
    file_ = io_->open(file_path_);
    // Every chunk starts as zeros on disk, so its first read has checksums to verify.
    io::AlignedBuffer zeros(chunk_bytes_);
    std::vector<io::Request> batch;
    for (auto& c : chunks_) {
      if (c->home != Tier::kNvme) continue;
      batch.push_back(io::Request{io::Op::kWrite,
                                  file_,
                                  c->nvme_offset,
                                  zeros.data(),
                                  static_cast<size_t>(chunk_bytes_),
                                  {}});
    }
    io_->submit(std::move(batch));
    io_->synchronize();
    stats_[2].used_bytes = stats_[2].peak_bytes = nvme_total;
  }
}

ChunkManager::Pool* ChunkManager::pool_of(const Chunk& c) {
  if (c.home == c.compute) return nullptr;
  return c.compute == Tier::kDevice ? device_pool_.get() : host_pool_.get();
}

bool ChunkManager::protected_in(const Pool& pool, ChunkId id, bool demand) const {
  const size_t keep = demand ? static_cast<size_t>(pool.min_resident - 1) : pool.recent.size();
  for (size_t i = 0; i < keep && i < pool.recent.size(); ++i) {
    if (pool.recent[i] == id) return true;
  }
  return false;
}

void ChunkManager::drain_slot(Pool& pool, int slot) {
  io::Ticket& t = pool.draining[static_cast<size_t>(slot)];
  if (!t.valid()) return;
  t.wait();  // throws naming the file when the write-back failed
  t = io::Ticket();
  add_used(pool.tier, -chunk_bytes_);
}

void ChunkManager::reclaim_drained(Pool& pool, bool wait) {
  for (size_t s = 0; s < pool.draining.size(); ++s) {
    if (wait || (pool.draining[s].valid() && pool.draining[s].ready()))
      drain_slot(pool, static_cast<int>(s));
  }
}

int64_t ChunkManager::next_use(ChunkId id) const {
  const std::vector<int64_t>& pos = positions_[id];
  if (pos.empty() || trace_.empty()) return kNever;
  auto it = std::lower_bound(pos.begin(), pos.end(), cursor_);
  if (it != pos.end()) return *it - cursor_;
  return pos.front() + static_cast<int64_t>(trace_.size()) - cursor_;
}

int ChunkManager::take_slot(Pool& pool, ChunkId for_chunk, bool demand) {
  reclaim_drained(pool, false);
  auto free_slot = [&]() -> int {
    for (size_t s = 0; s < pool.owner.size(); ++s) {
      if (pool.owner[s] < 0 && !pool.draining[s].valid()) return static_cast<int>(s);
    }
    return -1;
  };
  if (int s = free_slot(); s >= 0) return s;
  const int64_t target_next = next_use(for_chunk);
  // Victim: the resident, unprotected chunk used farthest ahead (or least recently before the
  // trace exists). A prefetch only displaces chunks needed later than the one it loads.
  ChunkId victim = -1;
  for (ChunkId o : pool.owner) {
    if (o < 0 || protected_in(pool, o, demand)) continue;
    const Chunk& c = *chunks_[o];
    if (c.state != ChunkState::kResident) continue;
    if (!demand && (!frozen_ || next_use(o) <= target_next)) continue;
    if (victim < 0) {
      victim = o;
      continue;
    }
    const Chunk& v = *chunks_[victim];
    const bool better = frozen_ ? next_use(o) > next_use(victim) : c.last_use < v.last_use;
    if (better) victim = o;
  }
  if (victim < 0 && demand) {
    // Only loads in flight or write-backs draining: wait for one and take its slot.
    for (ChunkId o : pool.owner) {
      if (o >= 0 && !protected_in(pool, o, true) && chunks_[o]->state == ChunkState::kInFlight) {
        victim = o;
        break;
      }
    }
    if (victim < 0) {
      reclaim_drained(pool, true);
      if (int s = free_slot(); s >= 0) return s;
    }
  }
  if (victim < 0) {
    MAMMOTH_CHECK(!demand) << "[ChunkManager] internal: no evictable chunk among "
                           << pool.owner.size() << " " << tier_name(pool.tier) << " slots";
    return -1;
  }
  const int slot = chunks_[victim]->slot;
  evict(victim);
  if (pool.draining[slot].valid()) {
    if (!demand) return -1;
    drain_slot(pool, slot);
  }
  return slot;
}

void ChunkManager::evict(ChunkId id) {
  Chunk& c = *chunks_[id];
  profile::Scope scope(profile::Lane::kIo, "chunk_evict");
  if (scope.active()) describe_move(c, id, scope.args());
  Pool& pool = *pool_of(c);
  if (c.state == ChunkState::kInFlight) finish_load(id);
  const int slot = c.slot;
  char* src = pool.slot[slot];
  TierStats& from = stats_[static_cast<int>(c.compute)];
  TierStats& to = stats_[static_cast<int>(c.home)];
  bool draining = false;
  if (c.dirty && !c.discarded) {
    if (c.home == Tier::kNvme) {
      if (!options_.dry_run) {
        c.write_back = io_->write(file_, c.nvme_offset, src, static_cast<size_t>(chunk_bytes_));
        pool.draining[slot] = c.write_back;
        draining = true;
      }
      from.bytes_out += chunk_bytes_;
      to.bytes_in += chunk_bytes_;
    } else {
      write_back_home(c, src);
      pool.last_write_back[slot] = id;
      from.bytes_out += c.used;
      to.bytes_in += c.used;
    }
    ++from.moves_out;
    ++to.moves_in;
  }
  pool.owner[slot] = -1;
  if (!draining) add_used(pool.tier, -chunk_bytes_);
  c.slot = -1;
  c.state = ChunkState::kEvicted;
  c.dirty = false;
  auto it = std::find(pool.recent.begin(), pool.recent.end(), id);
  if (it != pool.recent.end()) pool.recent.erase(it);
  // On a GPU the home copy is host memory no kernel can read: storage gets no address until the
  // next acquire (a read that bypasses it fails loudly instead of reading the wrong memory).
  if (c.on_move) c.on_move(cuda_ && c.compute == Tier::kDevice ? nullptr : c.home_ptr);
}

void ChunkManager::write_back_home(Chunk& c, const char* src) {
  if (cuda_ && c.compute == Tier::kDevice) {
    // After every kernel queued so far (those writing this chunk among them), on the copy
    // stream; a later load of the chunk is queued behind it, host readers wait for the event.
    cuda_->copy_after_compute();
    cuda_->write_back(c.home_ptr, src, static_cast<size_t>(c.used), c.event);
    return;
  }
  // Synchronous: tensor storage points at the home copy from now on, so it must be valid.
  std::memcpy(c.home_ptr, src, static_cast<size_t>(c.used));
}

// A chunk move's profile args: the chunk, its list, the tiers, the bytes it spans and as much of
// its label as the args buffer has room for.
void ChunkManager::describe_move(const Chunk& c, ChunkId id, char* args) const {
  const int n = std::snprintf(args, profile::Scope::kArgs,
                              "\"chunk\":%d,\"list\":\"%.40s\",\"home\":\"%s\",\"compute\":\"%s\","
                              "\"bytes\":%lld,\"dirty\":%s",
                              static_cast<int>(id), lists_[c.list].name.c_str(), tier_name(c.home),
                              tier_name(c.compute), static_cast<long long>(chunk_bytes_),
                              c.dirty ? "true" : "false");
  const int room = static_cast<int>(profile::Scope::kArgs) - n - 16;  // ,"tensors":"" + NUL
  if (n > 0 && room > 0 && !c.label.empty()) {
    std::snprintf(args + n, profile::Scope::kArgs - static_cast<size_t>(n), ",\"tensors\":\"%.*s\"",
                  room, c.label.c_str());
  }
}

void ChunkManager::start_load(ChunkId id, int slot, bool prefetch) {
  Chunk& c = *chunks_[id];
  profile::Scope scope(profile::Lane::kIo, prefetch ? "chunk_prefetch" : "chunk_load");
  if (scope.active()) describe_move(c, id, scope.args());
  Pool& pool = *pool_of(c);
  c.slot = slot;
  pool.owner[slot] = id;
  add_used(pool.tier, chunk_bytes_);
  char* dst = pool.slot[slot];
  if (c.discarded) {  // nothing worth moving
    // On a GPU the kernels about to overwrite the slot must not overtake a write-back still
    // reading it on the copy stream (a load of our own would be queued behind it instead).
    const ChunkId prev = pool.last_write_back[slot];
    if (cuda_ && c.compute == Tier::kDevice && prev >= 0) cuda_->compute_wait(chunks_[prev]->event);
    c.state = ChunkState::kResident;
    if (c.on_move) c.on_move(dst);
    return;
  }
  TierStats& to = stats_[static_cast<int>(c.compute)];
  TierStats& from = stats_[static_cast<int>(c.home)];
  ++(prefetch ? to.prefetches : to.demand_loads);
  ++to.moves_in;
  ++from.moves_out;
  c.state = ChunkState::kInFlight;
  ++pool.in_flight;
  if (c.home == Tier::kNvme) {
    // The same bytes may still be on their way out: a read must not overtake that write.
    if (c.write_back.valid()) c.write_back.wait();
    if (!options_.dry_run)
      c.read = io_->read(file_, c.nvme_offset, dst, static_cast<size_t>(chunk_bytes_));
    to.bytes_in += chunk_bytes_;
    from.bytes_out += chunk_bytes_;
  } else if (cuda_ && c.compute == Tier::kDevice) {
    // The slot's previous occupant may still be read by queued kernels: the copy stream waits
    // for them, then copies; acquire() makes the compute stream wait for this copy's event.
    cuda_->copy_after_compute();
    cuda_->load(dst, c.home_ptr, static_cast<size_t>(c.used), c.event);
    to.bytes_in += c.used;
    from.bytes_out += c.used;
  } else if (prefetch) {
    c.copy = copier_->copy(dst, c.home_ptr, static_cast<size_t>(c.used));
    to.bytes_in += c.used;
    from.bytes_out += c.used;
  } else {
    std::memcpy(dst, c.home_ptr, static_cast<size_t>(c.used));
    to.bytes_in += c.used;
    from.bytes_out += c.used;
  }
}

void ChunkManager::finish_load(ChunkId id) {
  Chunk& c = *chunks_[id];
  if (c.state != ChunkState::kInFlight) return;
  Pool& pool = *pool_of(c);
  TierStats& s = stats_[static_cast<int>(c.compute)];
  if (c.copy) {
    if (!c.copy->ready()) {
      const auto t0 = Clock::now();
      c.copy->wait();
      s.stall_s += seconds_since(t0);
    }
    c.copy.reset();
  }
  if (c.read.valid()) {
    const auto t0 = Clock::now();
    const bool was_ready = c.read.ready();
    try {
      c.read.wait();
    } catch (const Error& e) {
      c.read = io::Ticket();
      --pool.in_flight;
      c.state = ChunkState::kEvicted;
      pool.owner[c.slot] = -1;
      add_used(pool.tier, -chunk_bytes_);
      c.slot = -1;
      MAMMOTH_THROW() << "[ChunkManager] loading chunk " << id << " of '" << lists_[c.list].name
                      << "' from NVMe (" << file_path_ << ", offset " << c.nvme_offset
                      << "): " << e.what();
    }
    if (!was_ready) s.stall_s += seconds_since(t0);
    c.read = io::Ticket();
  }
  // A GPU load completes for compute when the compute stream waits for its event: the host
  // does not wait (so the stall of a CUDA tier is not measured here; it is GPU time).
  if (cuda_ && c.event != nullptr) cuda_->compute_wait(c.event);
  --pool.in_flight;
  c.state = ChunkState::kResident;
  if (c.on_move) c.on_move(pool.slot[c.slot]);
}

void ChunkManager::note_access(ChunkId id, int count) {
  if (id == last_ && count == last_count_) return;
  last_ = id;
  last_count_ = count;
  if (!frozen_) {
    // A span's entry is a use of each of its pieces (their next use drives eviction).
    for (int j = 0; j < count; ++j)
      positions_[id + j].push_back(static_cast<int64_t>(trace_.size()));
    trace_.push_back(id);
    trace_count_.push_back(count);
    return;
  }
  const int64_t n = static_cast<int64_t>(trace_.size());
  for (int64_t k = 0; k < options_.lookahead && cursor_ + k < n; ++k) {
    if (trace_[cursor_ + k] == id && trace_count_[cursor_ + k] == count) {
      cursor_ += k + 1;
      return;
    }
  }
  // Off the trace (an evaluation pass, a checkpoint): keep the cursor where it was.
}

void ChunkManager::prefetch() {
  const int64_t n = static_cast<int64_t>(trace_.size());
  if (!frozen_ || n == 0 || options_.prefetch_depth == 0) return;
  bool blocked[2] = {false, false};
  for (int64_t k = 0; k < options_.lookahead && k < n; ++k) {
    if (trace_count_[(cursor_ + k) % n] > 1) continue;  // spans load on demand
    const ChunkId id = trace_[(cursor_ + k) % n];
    Chunk& c = *chunks_[id];
    if (c.home == c.compute || c.state != ChunkState::kEvicted || c.discarded || c.host_written)
      continue;
    Pool* pool = pool_of(c);
    const int p = pool->tier == Tier::kDevice ? 0 : 1;
    if (blocked[p]) continue;
    if (pool->in_flight >= options_.prefetch_depth) {
      blocked[p] = true;
      continue;
    }
    const int slot = take_slot(*pool, id, false);
    if (slot < 0) {
      blocked[p] = true;  // later chunks are needed even later: nothing to gain
      continue;
    }
    start_load(id, slot, true);
    if (blocked[0] && blocked[1]) break;
  }
}

void* ChunkManager::acquire(ChunkId id, bool write) {
  check(id, "acquire");
  MAMMOTH_CHECK(finalized_) << "[ChunkManager::acquire] before finalize()";
  Chunk& c = *chunks_[id];
  if (c.home == c.compute) {
    c.dirty |= write;
    return c.home_ptr;
  }
  note_access(id);
  c.host_written = false;  // the host is done with the home copy: the caller wants it here
  Pool& pool = *pool_of(c);
  if (c.state == ChunkState::kInFlight) {
    finish_load(id);
  } else if (c.state == ChunkState::kEvicted) {
    // The whole demand load is the stall; finish_load's own share of it must not count twice.
    TierStats& s = stats_[static_cast<int>(c.compute)];
    const double before = s.stall_s;
    const auto t0 = Clock::now();
    const int slot = take_slot(pool, id, true);
    start_load(id, slot, false);
    finish_load(id);
    if (!c.discarded) s.stall_s = before + seconds_since(t0);
  }
  c.last_use = ++clock_;
  if (write) {
    c.dirty = true;
    c.discarded = false;
  }
  auto it = std::find(pool.recent.begin(), pool.recent.end(), id);
  if (it != pool.recent.end()) pool.recent.erase(it);
  pool.recent.push_front(id);
  while (static_cast<int>(pool.recent.size()) > pool.min_resident) pool.recent.pop_back();
  void* at = pool.slot[c.slot];
  prefetch();
  return at;
}

// The window of `count` consecutive slots of one arena to load the span from `first` into:
// fewest chunks in `keep` (the op's other arguments, moved out of the way when they are in it),
// then most pieces already in place, then fewest other occupants, then those used farthest ahead.
int ChunkManager::span_window(const Pool& pool, ChunkId first, int count,
                              const std::vector<ChunkId>& keep) const {
  const int slots = static_cast<int>(pool.slot.size());
  int best = -1;
  int64_t best_key[4] = {0, 0, 0, 0};
  for (int w = 0; w + count <= slots; ++w) {
    if (pool.arena[w] != pool.arena[w + count - 1]) continue;
    int64_t kept = 0, in_place = 0, others = 0, soonest = kNever;
    for (int j = 0; j < count; ++j) {
      const ChunkId o = pool.owner[w + j];
      if (o == first + j) {
        ++in_place;
      } else if (o >= 0) {
        if (std::find(keep.begin(), keep.end(), o) != keep.end()) ++kept;
        ++others;
        if (frozen_) soonest = std::min(soonest, next_use(o));
      }
    }
    const int64_t key[4] = {kept, -in_place, others, -soonest};  // smaller is better
    if (best < 0 || std::lexicographical_compare(key, key + 4, best_key, best_key + 4)) {
      best = w;
      std::copy(key, key + 4, best_key);
    }
  }
  MAMMOTH_CHECK(best >= 0) << "[ChunkManager] internal: no run of " << count
                           << " consecutive slots among " << slots << " " << tier_name(pool.tier)
                           << " slots";
  return best;
}

// Moves `id` (kept resident for the op under way) out of the window [window, window + count):
// into a free slot outside it, else one whose occupant is neither kept nor a piece of the span.
// Through its home (evict, then load), which orders the copies on every tier as any move does.
void ChunkManager::relocate(Pool& pool, ChunkId id, int window, int count,
                            const std::vector<ChunkId>& keep) {
  const int slots = static_cast<int>(pool.slot.size());
  int target = -1;
  for (int s = 0; s < slots && target < 0; ++s) {
    if (s >= window && s < window + count) continue;
    if (pool.owner[s] < 0) target = s;
  }
  for (int s = 0; s < slots && target < 0; ++s) {
    if (s >= window && s < window + count) continue;
    const ChunkId o = pool.owner[s];
    if (std::find(keep.begin(), keep.end(), o) == keep.end()) target = s;
  }
  MAMMOTH_CHECK(target >= 0) << "[ChunkManager] internal: no slot outside the span's window for "
                             << "chunk " << id << " among " << slots << " " << tier_name(pool.tier)
                             << " slots";
  if (pool.owner[target] >= 0) evict(pool.owner[target]);
  drain_slot(pool, target);
  evict(id);  // written back when dirty, so the load below brings the same bytes
  start_load(id, target, false);
  finish_load(id);
}

void* ChunkManager::acquire_span(ChunkId first, int count, bool write) {
  if (count == 1) return acquire(first, write);
  check(first, "acquire_span");
  MAMMOTH_CHECK(finalized_) << "[ChunkManager::acquire_span] before finalize()";
  MAMMOTH_CHECK(chunks_[first]->span == count)
      << "[ChunkManager::acquire_span] chunks " << first << " .. " << first + count - 1
      << " are not a declared span";
  Chunk& head = *chunks_[first];
  if (head.home == head.compute) {
    // Consecutive chunks of one list are consecutive in the list's home block.
    for (int j = 0; j < count; ++j) chunks_[first + j]->dirty |= write;
    return head.home_ptr;
  }
  note_access(first, count);
  Pool& pool = *pool_of(head);
  // The chunks the op under way may already hold: as acquire() keeps the newest
  // min_resident - 1, a span of `count` keeps the newest min_resident - count others.
  std::vector<ChunkId> keep;
  for (ChunkId r : pool.recent) {
    if (static_cast<int>(keep.size()) >= pool.min_resident - count) break;
    if (r < first || r >= first + count) keep.push_back(r);
  }
  TierStats& s = stats_[static_cast<int>(head.compute)];
  const double before = s.stall_s;
  const auto t0 = Clock::now();
  bool loaded = false;
  reclaim_drained(pool, false);
  const int w = span_window(pool, first, count, keep);
  for (int j = 0; j < count; ++j) {
    const ChunkId o = pool.owner[w + j];
    if (o >= 0 && o != first + j && std::find(keep.begin(), keep.end(), o) != keep.end())
      relocate(pool, o, w, count, keep);
  }
  for (int j = 0; j < count; ++j) {
    const ChunkId id = first + j;
    Chunk& c = *chunks_[id];
    c.host_written = false;
    const int slot = w + j;
    if (pool.owner[slot] == id) {
      finish_load(id);  // resident already, or a load of it in flight
      continue;
    }
    if (pool.owner[slot] >= 0) evict(pool.owner[slot]);
    drain_slot(pool, slot);
    if (c.state != ChunkState::kEvicted) evict(id);  // in another slot: through its home
    start_load(id, slot, false);
    finish_load(id);
    loaded = loaded || !c.discarded;
  }
  if (loaded) s.stall_s = before + seconds_since(t0);
  for (int j = 0; j < count; ++j) {
    Chunk& c = *chunks_[first + j];
    c.last_use = ++clock_;
    if (write) {
      c.dirty = true;
      c.discarded = false;
    }
  }
  // Newest first: the span, then what was kept (relocations took it out of the list).
  std::deque<ChunkId> recent;
  for (int j = 0; j < count; ++j) recent.push_back(first + j);
  for (ChunkId r : keep) {
    if (chunks_[r]->state == ChunkState::kResident) recent.push_back(r);
  }
  for (ChunkId r : pool.recent) {
    if (std::find(recent.begin(), recent.end(), r) == recent.end()) recent.push_back(r);
  }
  while (static_cast<int>(recent.size()) > pool.min_resident) recent.pop_back();
  pool.recent = std::move(recent);
  void* at = pool.slot[w];
  prefetch();
  return at;
}

void* ChunkManager::acquire_home(ChunkId id, bool write) {
  check(id, "acquire_home");
  MAMMOTH_CHECK(finalized_) << "[ChunkManager::acquire_home] before finalize()";
  Chunk& c = *chunks_[id];
  MAMMOTH_CHECK(c.compute == Tier::kDevice && c.home == Tier::kHost)
      << "[ChunkManager::acquire_home] chunk " << id << " of '" << lists_[c.list].name
      << "' is computed on " << tier_name(c.compute) << " and homed on " << tier_name(c.home)
      << "; only device-computed, host-homed chunks have a host copy to hand out";
  if (c.state == ChunkState::kInFlight) finish_load(id);
  if (c.state == ChunkState::kResident) {
    if (c.dirty && !c.discarded) {
      write_back_home(c, device_pool_->slot[c.slot]);
      device_pool_->last_write_back[c.slot] = id;
      TierStats& from = stats_[static_cast<int>(Tier::kDevice)];
      TierStats& to = stats_[static_cast<int>(Tier::kHost)];
      ++from.moves_out;
      ++to.moves_in;
      from.bytes_out += c.used;
      to.bytes_in += c.used;
    }
    c.dirty = false;
    if (write) evict(id);  // clean now: frees the slot without another copy
  }
  if (cuda_) {
    // A write-back just queued, or a load still reading the home copy.
    const auto t0 = Clock::now();
    cuda_->host_wait(c.event);
    stats_[static_cast<int>(Tier::kHost)].stall_s += seconds_since(t0);
  }
  if (write) {
    c.discarded = false;
    c.host_written = true;
  }
  return c.home_ptr;
}

void ChunkManager::discard(ChunkId id) {
  check(id, "discard");
  Chunk& c = *chunks_[id];
  if (c.home == c.compute) return;
  c.discarded = true;
  c.dirty = false;
}

void ChunkManager::set_label(ChunkId id, std::string label) {
  check(id, "set_label");
  chunks_[id]->label = std::move(label);
}

void ChunkManager::set_observer(ChunkId id, std::function<void(void*)> on_move) {
  check(id, "set_observer");
  chunks_[id]->on_move = std::move(on_move);
  if (finalized_ && chunks_[id]->on_move) chunks_[id]->on_move(current_address(id));
}

void* ChunkManager::current_address(ChunkId id) const {
  check(id, "current_address");
  const Chunk& c = *chunks_[id];
  if (c.home == c.compute) return c.home_ptr;
  if (c.state == ChunkState::kResident) {
    const Pool& pool = c.compute == Tier::kDevice ? *device_pool_ : *host_pool_;
    return pool.slot[c.slot];
  }
  return c.home_ptr;
}

void ChunkManager::restart_trace() {
  trace_.clear();
  trace_count_.clear();
  for (auto& p : positions_) p.clear();
  frozen_ = false;
  cursor_ = 0;
  last_ = -1;
  last_count_ = 0;
}

void ChunkManager::end_step() {
  for (auto& c : chunks_) c->host_written = false;
  if (!frozen_ && !trace_.empty()) frozen_ = true;
  cursor_ = 0;
  last_ = -1;
  last_count_ = 0;
  prefetch();
}

void ChunkManager::synchronize() {
  for (auto& c : chunks_) {
    if (c->state == ChunkState::kInFlight) finish_load(static_cast<ChunkId>(&c - &chunks_[0]));
  }
  for (Pool* p : {device_pool_.get(), host_pool_.get()}) {
    if (p) reclaim_drained(*p, true);
  }
  if (io_) io_->synchronize();
  if (cuda_) cuda_->synchronize();
}

Tier ChunkManager::home(ChunkId id) const {
  check(id, "home");
  return chunks_[id]->home;
}
Tier ChunkManager::compute(ChunkId id) const {
  check(id, "compute");
  return chunks_[id]->compute;
}
ChunkState ChunkManager::state(ChunkId id) const {
  check(id, "state");
  return chunks_[id]->state;
}
int ChunkManager::list_of(ChunkId id) const {
  check(id, "list_of");
  return chunks_[id]->list;
}
std::string ChunkManager::nvme_file() const { return file_path_; }
int64_t ChunkManager::nvme_offset(ChunkId id) const {
  check(id, "nvme_offset");
  return chunks_[id]->nvme_offset;
}

std::string ChunkManager::report() const {
  std::ostringstream os;
  char line[256];
  std::vector<int64_t> count(lists_.size(), 0), used(lists_.size(), 0);
  for (const auto& c : chunks_) {
    ++count[c->list];
    used[c->list] += c->used;
  }
  os << "[offload] where everything lives (chunks of " << short_bytes(chunk_bytes_) << "):\n";
  if (cuda_) {
    os << "  device tier: " << options_.device << " (" << short_bytes(stats_[0].reserved_bytes)
       << " of GPU memory held for chunks; host homes and staging in pinned memory)\n";
  }
  for (size_t l = 0; l < lists_.size(); ++l) {
    const bool cached = list_home_[l] != lists_[l].compute;
    std::snprintf(line, sizeof(line), "  %-12s %5lld chunks %11s  home %-6s  computed on %s%s\n",
                  lists_[l].name.c_str(), static_cast<long long>(count[l]),
                  short_bytes(used[l]).c_str(), tier_name(list_home_[l]),
                  tier_name(lists_[l].compute), cached ? " (paged)" : "");
    os << line;
  }
  std::snprintf(line, sizeof(line), "  %-7s %11s %11s %6s %11s %18s %18s %9s\n", "tier", "budget",
                "home", "slots", "peak", "moved in", "moved out", "stall s");
  os << line;
  for (int t = 0; t < kNumTiers; ++t) {
    const TierStats& s = stats_[t];
    const std::string in = std::to_string(s.moves_in) + " / " + short_bytes(s.bytes_in);
    const std::string out = std::to_string(s.moves_out) + " / " + short_bytes(s.bytes_out);
    std::snprintf(line, sizeof(line), "  %-7s %11s %11s %6lld %11s %18s %18s %9.3f\n",
                  tier_name(static_cast<Tier>(t)),
                  s.budget > 0 ? short_bytes(s.budget).c_str() : "unlimited",
                  short_bytes(s.home_bytes).c_str(), static_cast<long long>(s.slots),
                  short_bytes(s.peak_bytes).c_str(), in.c_str(), out.c_str(), s.stall_s);
    os << line;
  }
  return os.str();
}

}  // namespace mammoth::memory::chunks
