#include "parallel/pipeline/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <sstream>

#include "base/error.h"

namespace mammoth::parallel::pipeline {

namespace {

constexpr int kNumTypes = 3;

int type_index(ActionType t) { return static_cast<int>(t); }

char type_letter(ActionType t) {
  switch (t) {
    case ActionType::kForward:
      return 'F';
    case ActionType::kBackward:
      return 'B';
    case ActionType::kWeight:
      return 'W';
  }
  return '?';
}

// Completion times of (type, virtual stage, micro-batch); negative: not done.
class DoneTable {
 public:
  DoneTable(int stages, int micro_batches)
      : stages_(stages),
        micro_batches_(micro_batches),
        end_(static_cast<size_t>(kNumTypes) * stages * micro_batches, -1.0) {}
  double& at(ActionType t, int stage, int mb) {
    return end_[(static_cast<size_t>(type_index(t)) * stages_ + stage) * micro_batches_ + mb];
  }

 private:
  int stages_, micro_batches_;
  std::vector<double> end_;
};

// The actions `a` (on virtual stage s) waits for, other than its rank's previous action.
std::vector<std::pair<ActionType, int>> dependencies(const Action& a, int s, int num_stages) {
  std::vector<std::pair<ActionType, int>> deps;  // (type, virtual stage); same micro-batch
  switch (a.type) {
    case ActionType::kForward:
      if (s > 0) deps.push_back({ActionType::kForward, s - 1});
      break;
    case ActionType::kBackward:
      deps.push_back({ActionType::kForward, s});
      if (s + 1 < num_stages) deps.push_back({ActionType::kBackward, s + 1});
      break;
    case ActionType::kWeight:
      deps.push_back({ActionType::kBackward, s});
      break;
  }
  return deps;
}

double action_cost(const Schedule& sch, const CostModel& c, ActionType t) {
  const double scale = 1.0 / sch.virtual_stages;
  switch (t) {
    case ActionType::kForward:
      return c.forward * scale;
    case ActionType::kBackward:
      return (sch.split_backward ? c.backward : c.backward + c.weight) * scale;
    case ActionType::kWeight:
      return c.weight * scale;
  }
  return 0;
}

void check_options(const ScheduleOptions& o, ScheduleKind kind) {
  MAMMOTH_CHECK(o.stages >= 1) << "[make_schedule] stages (--pp) must be >= 1, got " << o.stages;
  MAMMOTH_CHECK(o.micro_batches >= 1)
      << "[make_schedule] micro_batches must be >= 1, got " << o.micro_batches;
  MAMMOTH_CHECK(o.virtual_stages >= 1)
      << "[make_schedule] virtual_stages must be >= 1, got " << o.virtual_stages;
  MAMMOTH_CHECK(kind == ScheduleKind::kInterleaved || o.virtual_stages == 1)
      << "[make_schedule] virtual_stages " << o.virtual_stages << " needs the interleaved "
      << "schedule, not " << schedule_kind_name(kind);
}

Schedule empty_schedule(ScheduleKind kind, const ScheduleOptions& o) {
  Schedule s;
  s.name = schedule_kind_name(kind);
  s.stages = o.stages;
  s.micro_batches = o.micro_batches;
  s.virtual_stages = o.virtual_stages;
  s.ranks.resize(o.stages);
  return s;
}

Schedule make_gpipe(const ScheduleOptions& o) {
  Schedule s = empty_schedule(ScheduleKind::kGPipe, o);
  for (auto& list : s.ranks) {
    for (int m = 0; m < o.micro_batches; ++m) list.push_back({ActionType::kForward, m, 0});
    for (int m = 0; m < o.micro_batches; ++m) list.push_back({ActionType::kBackward, m, 0});
  }
  return s;
}

Schedule make_1f1b(const ScheduleOptions& o) {
  Schedule s = empty_schedule(ScheduleKind::k1F1B, o);
  const int m = o.micro_batches;
  for (int r = 0; r < o.stages; ++r) {
    auto& list = s.ranks[r];
    const int warmup = std::min(o.stages - r - 1, m);
    for (int i = 0; i < warmup; ++i) list.push_back({ActionType::kForward, i, 0});
    for (int i = 0; i < m - warmup; ++i) {
      list.push_back({ActionType::kForward, warmup + i, 0});
      list.push_back({ActionType::kBackward, i, 0});
    }
    for (int i = m - warmup; i < m; ++i) list.push_back({ActionType::kBackward, i, 0});
  }
  return s;
}

// Megatron's interleaved order: micro-batches in groups of p; a group passes chunk 0 on every
// rank, then chunk 1, ... (backward: the last chunk first). A last, smaller group (m not a
// multiple of p) is taken the same way.
Schedule make_interleaved(const ScheduleOptions& o) {
  Schedule s = empty_schedule(ScheduleKind::kInterleaved, o);
  const int p = o.stages, m = o.micro_batches, v = o.virtual_stages;
  std::vector<Action> fwd, bwd;
  for (int g0 = 0; g0 < m; g0 += p) {
    const int gs = std::min(p, m - g0);
    for (int c = 0; c < v; ++c) {
      for (int i = 0; i < gs; ++i) {
        fwd.push_back({ActionType::kForward, g0 + i, c});
        bwd.push_back({ActionType::kBackward, g0 + i, v - 1 - c});
      }
    }
  }
  const int total = m * v;
  for (int r = 0; r < p; ++r) {
    auto& list = s.ranks[r];
    // With m == p every forward runs first (Megatron does the same); with a partial last group
    // the 1F1B steady state would wait on a chunk that has not been started, so it warms up fully.
    int warmup = (p - r - 1) * 2 + (v - 1) * p;
    if (m == p) warmup = total;
    warmup = std::min(warmup, total);
    for (int i = 0; i < warmup; ++i) list.push_back(fwd[i]);
    for (int i = 0; i < total - warmup; ++i) {
      list.push_back(fwd[warmup + i]);
      list.push_back(bwd[i]);
    }
    for (int i = total - warmup; i < total; ++i) list.push_back(bwd[i]);
  }
  return s;
}

// List scheduling with unit costs (see make_schedule's comment in the header).
Schedule make_zero_bubble(const ScheduleOptions& o) {
  Schedule s = empty_schedule(ScheduleKind::kZeroBubble, o);
  s.split_backward = true;
  const int p = o.stages, m = o.micro_batches;
  const CostModel c;
  DoneTable done(p, m);
  std::vector<double> clock(p, 0.0);
  std::vector<int> next_f(p, 0), next_b(p, 0);
  std::vector<std::deque<int>> pending_w(p);
  std::vector<double> ends;  // every scheduled end, to find the next event
  auto finished = [&](int r) { return next_b[r] == m && pending_w[r].empty(); };
  // Time advances in events: every rank free at the earliest time t tries to start an action
  // (what starts at t ends after t, so it cannot make another action ready at t); when none
  // can, those ranks wait for the next completion.
  while (true) {
    double t = std::numeric_limits<double>::infinity();
    for (int q = 0; q < p; ++q) {
      if (!finished(q)) t = std::min(t, clock[q]);
    }
    if (!std::isfinite(t)) break;
    auto ready = [&](ActionType type, int stage, int mb) {
      const double e = done.at(type, stage, mb);
      return e >= 0 && e <= t;
    };
    bool any = false;
    for (int r = 0; r < p; ++r) {
      if (finished(r) || clock[r] != t) continue;
      Action a;
      bool found = false;
      if (next_b[r] < next_f[r] && (r == p - 1 || ready(ActionType::kBackward, r + 1, next_b[r]))) {
        a = {ActionType::kBackward, next_b[r]++, 0};
        pending_w[r].push_back(a.micro_batch);
        found = true;
      } else if (next_f[r] < m && next_f[r] - next_b[r] < p - r &&
                 (r == 0 || ready(ActionType::kForward, r - 1, next_f[r]))) {
        a = {ActionType::kForward, next_f[r]++, 0};
        found = true;
      } else if (!pending_w[r].empty()) {
        a = {ActionType::kWeight, pending_w[r].front(), 0};
        pending_w[r].pop_front();
        found = true;
      }
      if (!found) continue;
      const double e = t + action_cost(s, c, a.type);
      done.at(a.type, r, a.micro_batch) = e;
      ends.push_back(e);
      clock[r] = e;
      s.ranks[r].push_back(a);
      any = true;
    }
    if (any) continue;
    double next = std::numeric_limits<double>::infinity();
    for (double e : ends) {
      if (e > t) next = std::min(next, e);
    }
    MAMMOTH_CHECK(std::isfinite(next))
        << "[make_schedule] zero-bubble list scheduling stalled at time " << t;
    for (int r = 0; r < p; ++r) {
      if (!finished(r) && clock[r] == t) clock[r] = next;
    }
  }
  return s;
}

}  // namespace

const char* schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kGPipe:
      return "gpipe";
    case ScheduleKind::k1F1B:
      return "1f1b";
    case ScheduleKind::kInterleaved:
      return "interleaved";
    case ScheduleKind::kZeroBubble:
      return "zb";
  }
  return "?";
}

ScheduleKind schedule_kind_from_name(const std::string& name) {
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::k1F1B, ScheduleKind::kInterleaved,
                         ScheduleKind::kZeroBubble}) {
    if (name == schedule_kind_name(k)) return k;
  }
  MAMMOTH_THROW() << "[pp-schedule] unknown pipeline schedule '" << name
                  << "'; choose gpipe, 1f1b, interleaved or zb";
}

std::string action_str(const Action& a, bool with_chunk) {
  std::string s = type_letter(a.type) + std::to_string(a.micro_batch);
  if (with_chunk) s += "." + std::to_string(a.chunk);
  return s;
}

Schedule make_schedule(ScheduleKind kind, const ScheduleOptions& options) {
  check_options(options, kind);
  switch (kind) {
    case ScheduleKind::kGPipe:
      return make_gpipe(options);
    case ScheduleKind::k1F1B:
      return make_1f1b(options);
    case ScheduleKind::kInterleaved:
      return make_interleaved(options);
    case ScheduleKind::kZeroBubble:
      return make_zero_bubble(options);
  }
  MAMMOTH_THROW() << "[make_schedule] unknown schedule kind";
}

CheckResult check_schedule(const Schedule& sch, const CostModel& costs) {
  CheckResult res;
  const int p = sch.stages, m = sch.micro_batches, v = sch.virtual_stages;
  const int S = sch.num_virtual_stages();
  if (p < 1 || m < 1 || v < 1 || static_cast<int>(sch.ranks.size()) != p) {
    res.error = "malformed: stages " + std::to_string(p) + ", micro-batches " + std::to_string(m) +
                ", virtual stages " + std::to_string(v) + ", rank lists " +
                std::to_string(sch.ranks.size());
    return res;
  }
  // Every rank must hold each of its actions exactly once.
  for (int r = 0; r < p; ++r) {
    std::vector<int> count(static_cast<size_t>(kNumTypes) * v * m, 0);
    for (const Action& a : sch.ranks[r]) {
      if (a.micro_batch < 0 || a.micro_batch >= m || a.chunk < 0 || a.chunk >= v ||
          (a.type == ActionType::kWeight && !sch.split_backward)) {
        res.error = "malformed: rank " + std::to_string(r) + " has action " + action_str(a, true) +
                    " outside the schedule (m " + std::to_string(m) + ", v " + std::to_string(v) +
                    (sch.split_backward ? ")" : ", no split backward)");
        return res;
      }
      ++count[(static_cast<size_t>(type_index(a.type)) * v + a.chunk) * m + a.micro_batch];
    }
    for (int t = 0; t < kNumTypes; ++t) {
      const int want = (t == type_index(ActionType::kWeight) && !sch.split_backward) ? 0 : 1;
      for (int c = 0; c < v; ++c) {
        for (int mb = 0; mb < m; ++mb) {
          const int got = count[(static_cast<size_t>(t) * v + c) * m + mb];
          if (got != want) {
            res.error = "malformed: rank " + std::to_string(r) + " runs " +
                        action_str({static_cast<ActionType>(t), mb, c}, true) + " " +
                        std::to_string(got) + " times, expected " + std::to_string(want);
            return res;
          }
        }
      }
    }
  }

  // Simulation: a rank starts its next action when the rank is free and the action's inputs
  // are complete. The result does not depend on the order ranks are visited in.
  DoneTable done(S, m);
  std::vector<size_t> pos(p, 0);
  std::vector<double> clock(p, 0.0);
  res.timeline.assign(p, {});
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (pos[r] < sch.ranks[r].size()) {
        const Action& a = sch.ranks[r][pos[r]];
        const int s = sch.virtual_stage(r, a.chunk);
        double start = clock[r];
        bool ready = true;
        for (auto [type, stage] : dependencies(a, s, S)) {
          const double e = done.at(type, stage, a.micro_batch);
          if (e < 0) {
            ready = false;
            break;
          }
          start = std::max(start, e);
        }
        if (!ready) break;
        const double end = start + action_cost(sch, costs, a.type);
        done.at(a.type, s, a.micro_batch) = end;
        res.timeline[r].push_back({a, start, end});
        res.busy += end - start;
        clock[r] = end;
        ++pos[r];
        progress = true;
      }
    }
  }
  std::ostringstream blocked;
  for (int r = 0; r < p; ++r) {
    if (pos[r] < sch.ranks[r].size()) {
      const Action& a = sch.ranks[r][pos[r]];
      blocked << " rank " << r << " waits at " << action_str(a, v > 1) << " (action " << pos[r]
              << ");";
    }
  }
  if (!blocked.str().empty()) {
    res.deadlock = true;
    res.error = "deadlock:" + blocked.str();
    return res;
  }
  for (int r = 0; r < p; ++r) res.makespan = std::max(res.makespan, clock[r]);
  res.bubble = res.makespan > 0 ? 1.0 - res.busy / (p * res.makespan) : 0.0;
  res.peak_in_flight.assign(p, 0);
  for (int r = 0; r < p; ++r) {
    int live = 0;
    for (const Action& a : sch.ranks[r]) {
      if (a.type == ActionType::kForward)
        res.peak_in_flight[r] = std::max(res.peak_in_flight[r], ++live);
      if (a.type == ActionType::kBackward) --live;
    }
  }
  res.ok = true;
  return res;
}

double analytic_bubble_1f1b(int stages, int micro_batches) {
  return static_cast<double>(stages - 1) / (micro_batches + stages - 1);
}

double analytic_bubble_interleaved(int stages, int micro_batches, int virtual_stages) {
  return static_cast<double>(stages - 1) / (virtual_stages * micro_batches + stages - 1);
}

std::string timeline_text(const Schedule& sch, const CheckResult& res) {
  std::ostringstream os;
  os << "schedule " << sch.name << ": pp " << sch.stages << ", micro-batches " << sch.micro_batches
     << ", virtual stages " << sch.virtual_stages
     << (sch.split_backward ? ", backward split into B (input grad) and W (weight grad)" : "")
     << "\n";
  if (!res.ok) {
    os << "INVALID: " << res.error << "\n";
    return os.str();
  }
  const bool chunks = sch.virtual_stages > 1;
  double slot = std::numeric_limits<double>::infinity();
  size_t width = 1;
  for (const auto& row : res.timeline) {
    for (const TimedAction& t : row) {
      slot = std::min(slot, t.end - t.start);
      width = std::max(width, action_str(t.action, chunks).size());
    }
  }
  const int slots = static_cast<int>(std::ceil(res.makespan / slot - 1e-9));
  for (size_t r = 0; r < res.timeline.size(); ++r) {
    std::vector<std::string> cells(slots, ".");
    for (const TimedAction& t : res.timeline[r]) {
      const int a = static_cast<int>(std::lround(t.start / slot));
      const int b = static_cast<int>(std::lround(t.end / slot));
      for (int i = a; i < b && i < slots; ++i) cells[i] = action_str(t.action, chunks);
    }
    char label[32];
    std::snprintf(label, sizeof(label), "rank %-3zu|", r);
    os << label;
    for (const std::string& c : cells) os << ' ' << c << std::string(width - c.size(), ' ');
    os << "\n";
  }
  char summary[160];
  std::snprintf(summary, sizeof(summary),
                "makespan %.4g units, bubble %.4f (%.1f%% of rank-time idle)\n", res.makespan,
                res.bubble, 100.0 * res.bubble);
  os << summary;
  os << "peak in-flight micro-batches per rank:";
  for (int n : res.peak_in_flight) os << ' ' << n;
  os << "\n";
  return os.str();
}

std::string chrome_trace_json(const Schedule& sch, const CheckResult& res, double unit_us) {
  std::ostringstream os;
  os << "{\"traceEvents\":[\n";
  bool first = true;
  auto sep = [&] {
    if (!first) os << ",\n";
    first = false;
  };
  for (size_t r = 0; r < res.timeline.size(); ++r) {
    sep();
    os << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << r
       << ",\"args\":{\"name\":\"rank " << r << "\"}}";
    for (const TimedAction& t : res.timeline[r]) {
      sep();
      const char* cat = t.action.type == ActionType::kForward    ? "forward"
                        : t.action.type == ActionType::kBackward ? "backward"
                                                                 : "weight";
      os << "{\"name\":\"" << action_str(t.action, sch.virtual_stages > 1) << "\",\"cat\":\"" << cat
         << "\",\"ph\":\"X\",\"pid\":0,\"tid\":" << r << ",\"ts\":" << t.start * unit_us
         << ",\"dur\":" << (t.end - t.start) * unit_us
         << ",\"args\":{\"micro_batch\":" << t.action.micro_batch << ",\"chunk\":" << t.action.chunk
         << ",\"virtual_stage\":" << sch.virtual_stage(static_cast<int>(r), t.action.chunk) << "}}";
    }
  }
  os << "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"schedule\":\"" << sch.name
     << "\",\"pp\":" << sch.stages << ",\"micro_batches\":" << sch.micro_batches
     << ",\"virtual_stages\":" << sch.virtual_stages << ",\"makespan\":" << res.makespan
     << ",\"bubble\":" << res.bubble << "}}\n";
  return os.str();
}

}  // namespace mammoth::parallel::pipeline
