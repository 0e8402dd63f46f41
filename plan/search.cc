#include "plan/search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <tuple>
#include <utility>

#include "base/error.h"

namespace mammoth::plan {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d * d <= n; ++d) {
    if (n % d != 0) continue;
    out.push_back(d);
    if (d != n / d) out.push_back(n / d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The fixed order of the tie-break after time and memory: smaller degrees and simpler choices
// first, so that of two plans predicted equal the one with less machinery wins.
auto tie_key(const ParallelPlan& p) {
  return std::make_tuple(p.tp, p.sp, p.pp, p.ep, p.sp_mode, p.pp_schedule, p.virtual_stages,
                         -p.micro_batch, p.zero, p.offload, p.recompute_blocks);
}

bool better(const RankedPlan& a, const RankedPlan& b) {
  if (a.time.step_time != b.time.step_time) return a.time.step_time < b.time.step_time;
  const int64_t ma = a.memory.stages.empty() ? 0 : a.memory.device_peak();
  const int64_t mb = b.memory.stages.empty() ? 0 : b.memory.device_peak();
  if (ma != mb) return ma < mb;
  return tie_key(a.plan) < tie_key(b.plan);
}

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return buf;
}

std::string secs(double s) {
  char buf[32];
  if (std::abs(s) >= 1)
    std::snprintf(buf, sizeof buf, "%+.3f s", s);
  else
    std::snprintf(buf, sizeof buf, "%+.2f ms", s * 1e3);
  return buf;
}

}  // namespace

json::Value RankedPlan::to_json() const {
  json::Value v = json::Value::object();
  v.set("plan", plan_to_json(plan));
  v.set("summary", plan_summary(plan));
  v.set("time", time.to_json());
  if (!memory.stages.empty()) v.set("memory", memory.to_json());
  if (!note.empty()) v.set("note", note);
  return v;
}

json::Value SearchResult::to_json() const {
  json::Value list = json::Value::array();
  for (const RankedPlan& p : plans) list.push_back(p.to_json());
  return json::Value::object()
      .set("plans", std::move(list))
      .set("search", json::Value::object()
                         .set("cores", cores)
                         .set("cores_bounded", cores_bounded)
                         .set("cores_refused", cores_refused)
                         .set("cores_over_memory", cores_over_memory)
                         .set("candidates", candidates)
                         .set("invalid", invalid)
                         .set("over_memory", over_memory)
                         .set("evaluated", evaluated)
                         .set("seconds", seconds)
                         .set("cpu_seconds", cpu_seconds));
}

std::string memory_misfit(const MemoryPrediction& memory, const Cluster& cluster,
                          bool count_model_copy) {
  const int64_t host_share = cluster.host_memory / cluster.devices_per_node;
  const int64_t nvme_share = cluster.nvme_capacity / cluster.devices_per_node;
  for (size_t s = 0; s < memory.stages.size(); ++s) {
    const StageMemory& m = memory.stages[s];
    std::ostringstream os;
    const int64_t device = count_model_copy ? m.device_peak : m.planned_peak();
    if (device > cluster.device_memory) {
      os << "stage " << s << " needs " << gib(device) << " of device memory, the GPU has "
         << gib(cluster.device_memory);
    } else if (m.host > host_share) {
      os << "stage " << s << " needs " << gib(m.host) << " of host memory per rank, a node has "
         << gib(host_share) << " per GPU";
    } else if (m.nvme > nvme_share) {
      os << "stage " << s << " needs " << gib(m.nvme) << " of NVMe per rank, a node has "
         << gib(nvme_share) << " per GPU";
    }
    if (!os.str().empty()) return os.str();
  }
  return "";
}

SearchResult search(const models::ModelConfig& config, const Cluster& cluster,
                    const SearchOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  const std::clock_t cpu_start = std::clock();
  MAMMOTH_CHECK(o.world >= 1) << "[plan] --world must be >= 1, got " << o.world;
  MAMMOTH_CHECK(o.world <= cluster.world())
      << "[plan] --world " << o.world << " exceeds cluster " << cluster.name << "'s "
      << cluster.world() << " GPUs (" << cluster.nodes << " nodes x " << cluster.devices_per_node
      << ")";
  MAMMOTH_CHECK(o.global_batch >= 1)
      << "[plan] --global-batch must be >= 1, got " << o.global_batch;
  MAMMOTH_CHECK(o.top_k >= 1) << "[plan] --top must be >= 1, got " << o.top_k;
  TimeModel model(config, cluster, o.time);
  const size_t k = static_cast<size_t>(o.top_k);
  SearchResult result;

  // Cores: what the compute bound depends on.
  struct Core {
    ParallelPlan plan;
    double bound = 0;
  };
  std::vector<Core> cores;
  for (int64_t tp : divisors(o.world)) {
    if (tp > 1 && (config.n_head % tp != 0 || config.d_ff % tp != 0)) continue;
    for (int64_t sp : divisors(o.world / tp)) {
      for (int64_t pp : divisors(o.world / tp / sp)) {
        if (pp > config.n_layer) continue;
        const int64_t dp = o.world / tp / sp / pp;
        if (o.global_batch % dp != 0) continue;
        std::vector<std::string> modes;
        if (sp > 1) {
          modes = {"ulysses", "ring"};
        } else {
          modes = {"none"};
          if (tp > 1) modes.push_back("split_gather");
        }
        for (const std::string& mode : modes) {
          for (int64_t mb : divisors(o.global_batch / dp)) {
            if (mb > o.max_micro_batch) break;
            for (int64_t recompute : {int64_t{0}, int64_t{-1}}) {
              Core c;
              ParallelPlan& p = c.plan;
              p.dp = static_cast<int>(dp);
              p.pp = static_cast<int>(pp);
              p.tp = static_cast<int>(tp);
              p.sp = static_cast<int>(sp);
              p.sp_mode = mode;
              p.micro_batch = mb;
              p.grad_accum = o.global_batch / dp / mb;
              p.seq_len = o.seq_len;
              p.recompute_blocks = recompute;
              p.amp = o.amp;
              p.device = o.device;
              p.pp_schedule = "1f1b";
              c.bound = model.compute_lower_bound(p);
              cores.push_back(std::move(c));
            }
          }
        }
      }
    }
  }
  std::stable_sort(cores.begin(), cores.end(), [](const Core& a, const Core& b) {
    if (a.bound != b.bound) return a.bound < b.bound;
    return tie_key(a.plan) < tie_key(b.plan);
  });
  result.cores = static_cast<int64_t>(cores.size());

  PlanContext context;
  context.world = o.world;
  context.model = &config;
  // The rules of a combination as the CPU backend (which runs every strategy) sees them; what
  // the device cannot run yet is a note on the plan unless runnable_only.
  auto refused = [&](const ParallelPlan& p) {
    ParallelPlan on_cpu = p;
    on_cpu.device = "cpu";
    return !check(on_cpu, context).empty();
  };
  std::vector<RankedPlan> top;  // sorted, at most k
  for (size_t ci = 0; ci < cores.size(); ++ci) {
    const Core& core = cores[ci];
    if (o.branch_and_bound && top.size() == k && core.bound > top.back().time.step_time) {
      result.cores_bounded = static_cast<int64_t>(cores.size() - ci);
      break;
    }
    // A core's own plan makes the least demanding choices (1F1B, one model chunk, ZeRO 0, no
    // offload): every rule about the others only adds conditions, so when check() refuses it,
    // it refuses every plan under it. Brute force checks each plan and the tests compare.
    if (o.branch_and_bound && refused(core.plan)) {
      ++result.cores_refused;
      continue;
    }
    // Expert parallelism (a mixture of experts): groups of ep dp ranks that split the experts.
    // Its exchanges only add to the compute bound, so the core's bound holds for every ep.
    std::vector<int> eps = {1};
    if (config.moe_experts > 0) {
      for (int64_t d : divisors(core.plan.dp)) {
        if (d > 1 && config.moe_experts % d == 0) eps.push_back(static_cast<int>(d));
      }
    }
    // Memory: the core's plan with the deepest sharding, offload and expert split the rules
    // allow holds the least (1F1B with one chunk keeps the fewest micro-batches in flight);
    // when even that exceeds the device, every plan under the core does.
    if (o.branch_and_bound && o.check_memory) {
      int64_t least = -1;
      for (int zero : o.zero_stages) {
        for (const std::string& offload : o.offloads) {
          for (int ep : eps) {
            ParallelPlan p = core.plan;
            p.zero = zero;
            p.offload = offload;
            p.ep = ep;
            if ((zero > 0 && p.dp == 1) || refused(p)) continue;
            const MemoryPrediction m = predict_memory(config, p);
            const int64_t peak = o.count_model_copy ? m.device_peak() : m.planned_peak();
            least = least < 0 ? peak : std::min(least, peak);
          }
        }
      }
      if (least > cluster.device_memory) {
        ++result.cores_over_memory;
        continue;
      }
    }
    std::vector<std::pair<std::string, int>> schedules;
    if (core.plan.pp == 1) {
      schedules.push_back({"1f1b", 1});
    } else {
      for (const std::string& s : o.schedules) {
        if (s != "interleaved") {
          schedules.push_back({s, 1});
          continue;
        }
        for (int v = 2; v <= o.max_virtual_stages; ++v) {
          if (static_cast<int64_t>(core.plan.pp) * v > config.n_layer) break;
          if (core.plan.grad_accum % core.plan.pp != 0) break;  // Megatron's interleaving rule
          schedules.push_back({s, v});
        }
      }
    }
    for (const auto& [schedule, v] : schedules) {
      for (int zero : o.zero_stages) {
        if (zero > 0 && core.plan.dp == 1) continue;
        for (const std::string& offload : o.offloads) {
          for (int ep : eps) {
            ParallelPlan p = core.plan;
            p.pp_schedule = schedule;
            p.virtual_stages = v;
            p.zero = zero;
            p.offload = offload;
            p.ep = ep;
            ++result.candidates;
            if (refused(p)) {
              ++result.invalid;
              continue;
            }
            std::string note = p.device == "cpu" ? "" : check(p, context);
            if (o.runnable_only && !note.empty()) {
              ++result.invalid;
              continue;
            }
            RankedPlan r;
            if (o.check_memory) {
              r.memory = predict_memory(config, p);
              if (!memory_misfit(r.memory, cluster, o.count_model_copy).empty()) {
                ++result.over_memory;
                continue;
              }
            }
            r.time = model.predict(p);
            ++result.evaluated;
            if (top.size() == k && !better(r, top.back())) continue;
            r.plan = std::move(p);
            r.note = std::move(note);
            top.insert(std::upper_bound(top.begin(), top.end(), r, better), std::move(r));
            if (top.size() > k) top.pop_back();
          }
        }
      }
    }
  }
  result.plans = std::move(top);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.cpu_seconds = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  return result;
}

std::string explain_difference(const RankedPlan& a, const RankedPlan& b, int b_rank) {
  std::ostringstream os;
  os << "vs #" << b_rank;
  std::vector<std::string> fields;
  auto diff = [&](const char* name, const auto& x, const auto& y) {
    if (x == y) return;
    std::ostringstream f;
    f << name << " " << y << " -> " << x;
    fields.push_back(f.str());
  };
  const ParallelPlan &p = a.plan, &q = b.plan;
  diff("dp", p.dp, q.dp);
  diff("pp", p.pp, q.pp);
  diff("tp", p.tp, q.tp);
  diff("sp", p.sp, q.sp);
  diff("ep", p.ep, q.ep);
  diff("sp-mode", p.sp_mode, q.sp_mode);
  diff("schedule", p.pp_schedule, q.pp_schedule);
  diff("virtual-stages", p.virtual_stages, q.virtual_stages);
  diff("micro-batch", p.micro_batch, q.micro_batch);
  diff("zero", p.zero, q.zero);
  diff("offload", p.offload, q.offload);
  diff("recompute", p.recompute_blocks, q.recompute_blocks);
  os << " (";
  for (size_t i = 0; i < fields.size(); ++i) os << (i ? ", " : "") << fields[i];
  os << "): ";
  const double ratio = b.time.step_time > 0 ? a.time.step_time / b.time.step_time : 1.0;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.2f%% %s", 100 * std::abs(1 - ratio),
                ratio <= 1 ? "faster" : "slower");
  os << buf;
  // The parts that changed most, largest first.
  const std::pair<const char*, double TimeBreakdown::*> parts[] = {
      {"compute", &TimeBreakdown::compute},          {"tp communication", &TimeBreakdown::tp_comm},
      {"pipeline sends", &TimeBreakdown::pp_comm},   {"pipeline bubble", &TimeBreakdown::pp_bubble},
      {"dp communication", &TimeBreakdown::dp_comm}, {"offload traffic", &TimeBreakdown::offload},
      {"optimizer", &TimeBreakdown::optimizer}};
  std::vector<std::pair<double, const char*>> deltas;
  for (const auto& [name, member] : parts) {
    const double d = a.time.parts.*member - b.time.parts.*member;
    if (std::abs(d) > 1e-4 * b.time.step_time) deltas.push_back({d, name});
  }
  std::sort(deltas.begin(), deltas.end(), [](const auto& x, const auto& y) {
    if (std::abs(x.first) != std::abs(y.first)) return std::abs(x.first) > std::abs(y.first);
    return std::string(x.second) < y.second;
  });
  for (size_t i = 0; i < deltas.size() && i < 3; ++i)
    os << (i ? ", " : "; ") << deltas[i].second << " " << secs(deltas[i].first);
  if (!a.memory.stages.empty() && !b.memory.stages.empty() &&
      a.memory.device_peak() != b.memory.device_peak()) {
    os << "; device peak " << gib(a.memory.device_peak()) << " vs " << gib(b.memory.device_peak());
  }
  return os.str();
}

std::string format_plans(const SearchResult& result, const Cluster& cluster) {
  std::ostringstream os;
  for (size_t i = 0; i < result.plans.size(); ++i) {
    const RankedPlan& r = result.plans[i];
    os << "#" << i + 1 << " " << plan_summary(r.plan);
    if (r.plan.pp > 1) os << " schedule " << r.plan.pp_schedule << " v" << r.plan.virtual_stages;
    os << "\n  " << r.time.explain() << "\n";
    if (!r.memory.stages.empty()) {
      os << "  memory per rank (" << cluster.name << ": " << gib(cluster.device_memory)
         << " per GPU): device peak " << gib(r.memory.device_peak());
      // The search prunes by the planned peak unless count_model_copy: say which is which.
      if (r.memory.planned_peak() != r.memory.device_peak())
        os << " (" << gib(r.memory.planned_peak()) << " without the runtime's model copy)";
      os << "\n";
      std::istringstream lines(r.memory.explain());
      for (std::string line; std::getline(lines, line);) os << "    " << line << "\n";
    }
    if (i + 1 < result.plans.size())
      os << "  " << explain_difference(r, result.plans[i + 1], static_cast<int>(i + 2)) << "\n";
    if (!r.note.empty()) os << "  not runnable by `mammoth train` yet: " << r.note << "\n";
  }
  char buf[200];
  std::snprintf(
      buf, sizeof buf,
      "search: %lld cores (%lld refused, %lld over memory, %lld bounded out), %lld "
      "plans considered, %lld invalid, %lld over memory, %lld predicted, %.3f s (%.3f s of CPU)\n",
      static_cast<long long>(result.cores), static_cast<long long>(result.cores_refused),
      static_cast<long long>(result.cores_over_memory),
      static_cast<long long>(result.cores_bounded), static_cast<long long>(result.candidates),
      static_cast<long long>(result.invalid), static_cast<long long>(result.over_memory),
      static_cast<long long>(result.evaluated), result.seconds, result.cpu_seconds);
  os << buf;
  return os.str();
}

}  // namespace mammoth::plan
