#include "plan/offload_traffic.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <sstream>

#include "base/error.h"
#include "memory/chunks/chunk_manager.h"
#include "memory/chunks/layout.h"
#include "memory/io/async_io.h"
#include "plan/memory_model.h"
#include "plan/parallel_plan.h"

namespace mammoth::plan {
namespace {

namespace mc = memory::chunks;
using mc::Tier;

struct Snapshot {
  double device_in = 0, device_out = 0, nvme_in = 0, nvme_out = 0, device_moves = 0;
  int64_t demand = 0, prefetched = 0;
};

Snapshot snapshot(const mc::ChunkManager& m) {
  const mc::TierStats& d = m.stats(Tier::kDevice);
  const mc::TierStats& n = m.stats(Tier::kNvme);
  return {static_cast<double>(d.bytes_in),
          static_cast<double>(d.bytes_out),
          static_cast<double>(n.bytes_in),
          static_cast<double>(n.bytes_out),
          static_cast<double>(d.moves_in + d.moves_out),
          d.demand_loads,
          d.prefetches};
}

OffloadPhase difference(const Snapshot& a, const Snapshot& b, double scale) {
  OffloadPhase p;
  p.device_in = (b.device_in - a.device_in) * scale;
  p.device_out = (b.device_out - a.device_out) * scale;
  p.nvme_write = (b.nvme_in - a.nvme_in) * scale;
  p.nvme_read = (b.nvme_out - a.nvme_out) * scale;
  p.device_moves = b.device_moves - a.device_moves;
  const double loads = static_cast<double>((b.demand - a.demand) + (b.prefetched - a.prefetched));
  p.device_demand_in =
      loads > 0 ? p.device_in * static_cast<double>(b.demand - a.demand) / loads : 0;
  return p;
}

OffloadPhase scaled_sum(const OffloadPhase& a, const OffloadPhase& b, double k) {
  return {a.device_in + k * b.device_in,
          a.device_out + k * b.device_out,
          a.nvme_read + k * b.nvme_read,
          a.nvme_write + k * b.nvme_write,
          a.device_demand_in + k * b.device_demand_in,
          a.device_moves + k * b.device_moves};
}

OffloadPhase minus(const OffloadPhase& a, const OffloadPhase& b) { return scaled_sum(a, b, -1.0); }

// One dry run at `m` micro-batches: the third step's traffic.
OffloadTraffic run(const OffloadSetup& s, int m) {
  OffloadTraffic out;
  const int device_lists = s.offload == "none" ? 4 : 2;
  const mc::ChunkSizing sizing =
      mc::choose_chunk_bytes(s.chunk_bytes, s.largest, s.device_mem, device_lists, s.host_mem,
                             s.offload == "nvme", s.dp == 1 && !s.host_update);
  const int64_t block = static_cast<int64_t>(memory::io::kBlockSize);
  const int64_t real = (sizing.chunk_bytes + block - 1) / block * block;
  const mc::ChunkLayout layout = mc::pack_chunks(s.tensors, real);
  out.chunk_bytes = real;
  out.spans = sizing.spans;
  out.chunks = static_cast<int64_t>(layout.used.size());
  const int n = static_cast<int>(layout.used.size());

  // One block per chunk: budgets in the same chunks, so every placement and slot count holds.
  const double scale = static_cast<double>(real) / static_cast<double>(block);
  auto scaled = [&](int64_t bytes) {
    return bytes <= 0
               ? int64_t{0}
               : std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(bytes) / scale));
  };
  mc::ChunkManagerOptions mo;
  mo.chunk_bytes = block;
  mo.device_budget = scaled(s.device_mem);
  mo.host_budget = scaled(s.host_mem);
  mo.nvme_dir = "(dry run)";
  mo.prefetch_depth = s.prefetch_depth;
  mo.dry_run = true;
  mc::ChunkManager mgr(mo);

  const std::vector<Tier> device_first = s.host_update
                                             ? std::vector<Tier>{Tier::kHost}
                                             : std::vector<Tier>{Tier::kDevice, Tier::kHost};
  const std::vector<Tier> param_homes = s.offload_params == "nvme" ? std::vector<Tier>{Tier::kNvme}
                                        : s.offload_params == "host"
                                            ? std::vector<Tier>{Tier::kHost}
                                            : device_first;
  const Tier state_home = s.offload == "host" ? Tier::kHost : Tier::kNvme;
  const mc::ChunkListSpec specs[4] = {
      {"params", Tier::kDevice, param_homes, "param"},
      {"grads", Tier::kDevice, param_homes, "grad"},
      s.offload == "none" ? mc::ChunkListSpec{"exp_avg", Tier::kDevice, device_first, "exp_avg"}
                          : mc::ChunkListSpec{"exp_avg", Tier::kHost, {state_home}, "exp_avg"},
      s.offload == "none"
          ? mc::ChunkListSpec{"exp_avg_sq", Tier::kDevice, device_first, "exp_avg_sq"}
          : mc::ChunkListSpec{"exp_avg_sq", Tier::kHost, {state_home}, "exp_avg_sq"},
  };
  std::vector<mc::ChunkId> ids[4];
  for (int l = 0; l < 4; ++l) {
    const int list = mgr.add_list(specs[l]);
    for (int k = 0; k < n; ++k) {
      const bool held = l < 2 || k % s.dp == 0;  // rank 0's states
      const int64_t used = std::min(
          block,
          std::max<int64_t>(
              1, std::llround(static_cast<double>(layout.used[static_cast<size_t>(k)]) / scale)));
      ids[l].push_back(held ? mgr.add_chunk(list, used) : -1);
    }
  }
  for (const mc::ChunkPlace& p : layout.places) {
    if (p.pieces < 2) continue;
    for (int l = 0; l < 4; ++l) {
      if (ids[l][static_cast<size_t>(p.chunk)] >= 0)
        mgr.declare_span(ids[l][static_cast<size_t>(p.chunk)], p.pieces);
    }
  }
  try {
    mgr.finalize();
  } catch (const Error& e) {
    out.error = e.what();
    return out;
  }

  auto use = [&](int l, const mc::ChunkPlace& p, bool write) {
    const mc::ChunkId id = ids[l][static_cast<size_t>(p.chunk)];
    if (p.pieces > 1) {
      mgr.acquire_span(id, p.pieces, write);
    } else {
      mgr.acquire(id, write);
    }
  };
  const std::vector<mc::ChunkPlace>& places = layout.places;
  std::vector<mc::ChunkPlace> reads;
  if (s.uses.empty()) {
    reads = places;
  } else {
    for (int i : s.uses) reads.push_back(places.at(static_cast<size_t>(i)));
  }
  Snapshot at_start, after_compute, at_end;
  for (int step = 0; step < 3; ++step) {
    if (step == 2) at_start = snapshot(mgr);
    for (int mb = 0; mb < m; ++mb) {
      for (const mc::ChunkPlace& p : reads) use(0, p, false);
      for (auto p = reads.rbegin(); p != reads.rend(); ++p) {
        use(0, *p, false);  // the input gradient reads the weight
        use(1, *p, true);   // the weight gradient lands in (or adds into) its chunk
      }
    }
    if (s.dp > 1) {  // each gradient chunk averaged: read out, the average written back
      for (int k = n - 1; k >= 0; --k) {
        mgr.acquire(ids[1][static_cast<size_t>(k)], false);
        mgr.acquire(ids[1][static_cast<size_t>(k)], true);
      }
    }
    if (step == 2) after_compute = snapshot(mgr);
    for (const mc::ChunkPlace& p : places) use(1, p, false);  // the gradient norm
    for (size_t i = 0; i < places.size(); ++i) {              // AdamW, chunk by chunk
      const mc::ChunkPlace& p = places[i];
      const bool owned = p.chunk % s.dp == 0;
      for (int j = 0; j < p.pieces && owned; ++j) {
        const mc::ChunkPlace piece{p.chunk + j, 0, 1};
        if (s.host_update) {
          mgr.acquire_home(ids[0][static_cast<size_t>(piece.chunk)], true);
          mgr.acquire_home(ids[1][static_cast<size_t>(piece.chunk)], false);
        } else {
          use(0, piece, true);
          use(1, piece, false);
        }
        use(2, piece, true);
        use(3, piece, true);
      }
      const bool last_of_chunk = i + 1 == places.size() || places[i + 1].chunk != p.chunk;
      if (s.dp > 1 && last_of_chunk) mgr.acquire(ids[0][static_cast<size_t>(p.chunk)], !owned);
    }
    for (mc::ChunkId id : ids[1]) mgr.discard(id);
    mgr.end_step();
    if (step == 2) at_end = snapshot(mgr);
  }
  mgr.synchronize();
  out.compute = difference(at_start, after_compute, scale);
  out.optimizer = difference(after_compute, at_end, scale);
  return out;
}

}  // namespace

OffloadTraffic simulate_offload(const OffloadSetup& setup) {
  MAMMOTH_CHECK(setup.micro_batches >= 1 && setup.dp >= 1 && !setup.tensors.empty())
      << "[plan] offload dry run: " << setup.tensors.size() << " tensors, " << setup.micro_batches
      << " micro-batches, dp " << setup.dp;
  std::ostringstream key;
  key << setup.micro_batches << ' ' << setup.dp << ' ' << setup.offload << ' '
      << setup.offload_params << ' ' << setup.host_update << ' ' << setup.chunk_bytes << ' '
      << setup.device_mem << ' ' << setup.host_mem << ' ' << setup.prefetch_depth << ' '
      << setup.largest << ':';
  for (int64_t t : setup.tensors) key << ' ' << t;
  key << ':';
  for (int i : setup.uses) key << ' ' << i;
  static std::mutex mutex;
  static std::map<std::string, OffloadTraffic> cache;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key.str());
    if (it != cache.end()) return it->second;
  }
  // Every middle micro-batch pages the same chunks: beyond four, extrapolate from 3 and 4.
  const int m = setup.micro_batches;
  OffloadTraffic t = run(setup, std::min(m, 4));
  if (m > 4 && t.error.empty()) {
    const OffloadTraffic three = run(setup, 3);
    t.compute = scaled_sum(t.compute, minus(t.compute, three.compute), m - 4);
  }
  std::lock_guard<std::mutex> lock(mutex);
  cache.emplace(key.str(), t);
  return t;
}

OffloadSetup offload_setup(const StageMemory& stage, const ParallelPlan& plan) {
  OffloadSetup o;
  o.tensors = stage.offload_tensors;
  o.uses = stage.offload_uses;
  o.largest = stage.offload_largest;
  o.micro_batches = plan.grad_accum;
  o.dp = plan.dp;
  o.offload = plan.offload;
  o.offload_params = plan.offload_params;
  o.host_update = plan.device == "cuda" && plan.offload != "none";
  o.chunk_bytes = static_cast<int64_t>(plan.chunk_mb * 1048576.0);
  o.device_mem = plan.device_mem;
  if (plan.auto_device_mem > 0) {
    // engine/offload: what the first step's traced peak and its margin (1/8) leave.
    o.device_mem =
        std::max<int64_t>(1, plan.auto_device_mem - stage.device_peak - stage.device_peak / 8);
  }
  o.host_mem = plan.host_mem;
  return o;
}

OffloadPhase add(const OffloadPhase& a, const OffloadPhase& b) { return scaled_sum(a, b, 1.0); }

std::string describe(const OffloadPhase& p) {
  return "device in " + mc::short_bytes(std::llround(p.device_in)) + " out " +
         mc::short_bytes(std::llround(p.device_out)) + ", nvme read " +
         mc::short_bytes(std::llround(p.nvme_read)) + " write " +
         mc::short_bytes(std::llround(p.nvme_write));
}

}  // namespace mammoth::plan
