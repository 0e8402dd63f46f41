#include "plan/fit.h"

#include <algorithm>

#include "base/dtype.h"
#include "base/error.h"
#include "models/analyze.h"
#include "plan/memory_model.h"

namespace mammoth::plan {
namespace {

// engine/offload's --device-mem auto: the chunks get what the traced peak leaves, less 1/8 of
// that peak (offload.h kAutoMarginDivisor).
constexpr int64_t kAutoMarginDivisor = 8;

struct Setting {
  const char* name;
  const char* offload;
  bool paged;
  int device_lists;  // chunk lists computed on the device: one chunk of each stays resident
};
constexpr Setting kSettings[] = {
    {"none", "none", false, 0},      {"host", "host", false, 0},      {"nvme", "nvme", false, 0},
    {"host-paged", "none", true, 4}, {"nvme-paged", "nvme", true, 2},
};

// A chunk holds at least the largest parameter (engine/offload: none straddles chunks); offload
// runs without tp, so the parameters are whole.
int64_t chunk_bytes(const models::ModelConfig& c, const ParallelPlan& p) {
  const int64_t largest =
      std::max({c.vocab_size * c.d_model, c.d_model * std::max(c.d_ff, 3 * c.d_model),
                c.max_seq * c.d_model});
  return std::max(static_cast<int64_t>(p.chunk_mb * 1048576.0),
                  largest * static_cast<int64_t>(dtype_size(c.dtype)));
}

ParallelPlan plan_for(const Setting& s, const ParallelPlan& base, int64_t device_mem,
                      int64_t host_mem) {
  ParallelPlan p = base;
  p.offload = s.offload;
  p.device_mem = 0;
  p.auto_device_mem = s.paged ? device_mem : 0;
  p.host_mem = s.offload == std::string("none") && !s.paged ? 0 : host_mem;
  // The depth search changes n_layer: the stage cut follows it.
  p.stage_cut.clear();
  return p;
}

struct Need {
  std::string invalid;
  int64_t device = 0, host = 0, nvme = 0;
  bool fits = false;
};

Need need(const Setting& s, const models::ModelConfig& c, const ParallelPlan& p, int64_t device_mem,
          int64_t host_mem) {
  Need n;
  n.invalid = check(p, {.model = &c});
  if (!n.invalid.empty()) return n;
  const MemoryPrediction m = predict_memory(c, p);
  for (const StageMemory& st : m.stages) {
    int64_t device = st.device_peak + st.chunks_device, host = st.host;
    if (s.paged && device_mem > 0) {
      // auto:D caches the chunks in what the step's peak and the margin leave; when they do
      // not all fit, every device-computed list is homed on the host (memory/chunks
      // ChunkManager) and the device keeps at least one chunk of each resident.
      const int64_t reserved = st.device_peak + st.device_peak / kAutoMarginDivisor;
      if (st.chunks_device > device_mem - reserved) {
        const int64_t cache = std::max(device_mem - reserved, s.device_lists * chunk_bytes(c, p));
        device = reserved + cache;
        host += st.chunks_device;
      }
    }
    n.device = std::max(n.device, device);
    n.host = std::max(n.host, host);
    n.nvme = std::max(n.nvme, st.nvme);
  }
  n.fits = (device_mem == 0 || n.device <= device_mem) && (host_mem == 0 || n.host <= host_mem);
  return n;
}

}  // namespace

std::vector<OffloadFit> offload_fits(const models::ModelConfig& config, const ParallelPlan& base,
                                     int64_t device_mem, int64_t host_mem) {
  MAMMOTH_CHECK(device_mem >= 0 && host_mem >= 0)
      << "[fit] budgets must be >= 0, got device " << device_mem << ", host " << host_mem;
  std::vector<OffloadFit> out;
  for (const Setting& s : kSettings) {
    OffloadFit f;
    f.setting = s.name;
    f.plan = plan_for(s, base, device_mem, host_mem);
    const Need n = need(s, config, f.plan, device_mem, host_mem);
    f.invalid = n.invalid;
    f.device_bytes = n.device;
    f.host_bytes = n.host;
    f.nvme_bytes = n.nvme;
    f.fits = n.fits;
    // Memory grows with depth: double, then bisect, the deepest fitting n_layer (capped, as
    // unlimited budgets fit any depth), from the fewest layers the pipeline can cut.
    constexpr int64_t kCap = 1 << 20;
    auto ok = [&](int64_t layers) {
      models::ModelConfig c = config;
      c.n_layer = layers;
      return need(s, c, f.plan, device_mem, host_mem).fits;
    };
    const int64_t fewest = static_cast<int64_t>(base.pp) * std::max(1, base.virtual_stages);
    int64_t lo = 0, hi = fewest;
    while (hi <= kCap && ok(hi)) {
      lo = hi;
      hi *= 2;
    }
    if (hi > kCap) {
      lo = kCap;
    } else if (lo > 0) {
      while (hi - lo > 1) {
        const int64_t mid = lo + (hi - lo) / 2;
        (ok(mid) ? lo : hi) = mid;
      }
    }
    f.max_layers = lo;
    if (lo > 0) {
      models::ModelConfig c = config;
      c.n_layer = lo;
      f.max_params = models::count_parameters(c);
    }
    out.push_back(f);
  }
  return out;
}

json::Value offload_fits_to_json(const std::vector<OffloadFit>& fits, int64_t device_mem,
                                 int64_t host_mem) {
  json::Value rows = json::Value::array();
  for (const OffloadFit& f : fits) {
    json::Value row = json::Value::object()
                          .set("setting", f.setting)
                          .set("plan", plan_to_json(f.plan))
                          .set("device_bytes", f.device_bytes)
                          .set("host_bytes", f.host_bytes)
                          .set("nvme_bytes", f.nvme_bytes)
                          .set("fits", f.fits)
                          .set("max_layers", f.max_layers)
                          .set("max_params", f.max_params);
    if (!f.invalid.empty()) row.set("invalid", f.invalid);
    rows.push_back(std::move(row));
  }
  return json::Value::object()
      .set("device_mem", device_mem)
      .set("host_mem", host_mem)
      .set("settings", std::move(rows));
}

}  // namespace mammoth::plan
