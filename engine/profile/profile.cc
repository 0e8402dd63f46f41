#include "engine/profile/profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "base/error.h"
#include "base/json.h"

namespace mammoth::profile {

std::atomic<bool> g_on{false};
thread_local MemTag t_mem_tag = MemTag::kTemporaries;
thread_local bool t_backward = false;

namespace {

struct ThreadBuffer {
  std::vector<Event> events;  // sized once; `used` of them hold events
  size_t used = 0;
  int64_t dropped = 0;
  uint64_t session = 0;  // the session `used` counts for
};

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;
  size_t capacity = 0;
  std::atomic<uint64_t> session{0};
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: threads may record during exit
  return *r;
}

// This thread's buffer for the current session (made on its first event while on).
ThreadBuffer* buffer() {
  thread_local ThreadBuffer* mine = nullptr;
  Registry& r = registry();
  const uint64_t session = r.session.load(std::memory_order_acquire);
  if (mine == nullptr) {
    std::lock_guard<std::mutex> lock(r.mu);
    r.buffers.push_back(std::make_unique<ThreadBuffer>());
    mine = r.buffers.back().get();
    mine->events.resize(r.capacity);
    mine->session = session;
  }
  if (mine->session != session) {
    // start() cleared the counts under its lock; a thread that slept through it catches up.
    std::lock_guard<std::mutex> lock(r.mu);
    mine->events.resize(r.capacity);
    mine->used = 0;
    mine->dropped = 0;
    mine->session = session;
  }
  return mine;
}

Event* next_slot() {
  ThreadBuffer* b = buffer();
  if (b->used == b->events.size()) {
    ++b->dropped;
    return nullptr;
  }
  return &b->events[b->used++];
}

void copy_text(char* dst, size_t cap, const char* src) {
  const size_t n = src ? std::min(std::strlen(src), cap - 1) : 0;
  if (n) std::memcpy(dst, src, n);
  dst[n] = '\0';
}

// Copies an args body, cutting at the last whole member (a top-level comma) when it is long.
void copy_args(char* dst, size_t cap, const char* src) {
  const size_t len = src ? std::strlen(src) : 0;
  if (len < cap) {
    copy_text(dst, cap, src);
    return;
  }
  size_t cut = 0;
  bool in_string = false;
  int depth = 0;
  for (size_t i = 0; i < cap - 1; ++i) {
    const char c = src[i];
    if (c == '"' && (i == 0 || src[i - 1] != '\\')) in_string = !in_string;
    if (in_string) continue;
    if (c == '[' || c == '{') ++depth;
    if (c == ']' || c == '}') --depth;
    if (c == ',' && depth == 0) cut = i;
  }
  std::memcpy(dst, src, cut);
  dst[cut] = '\0';
}

// Total length of the union of [begin, end) intervals.
int64_t union_ns(std::vector<std::pair<int64_t, int64_t>> v) {
  std::sort(v.begin(), v.end());
  int64_t total = 0, cur_b = 0, cur_e = -1;
  bool open = false;
  for (const auto& [b, e] : v) {
    if (!open || b > cur_e) {
      if (open) total += cur_e - cur_b;
      cur_b = b;
      cur_e = e;
      open = true;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  if (open) total += cur_e - cur_b;
  return total;
}

struct MemoryTracer {
  std::mutex mu;
  std::unordered_map<const void*, std::pair<MemTag, int64_t>> blocks;  // made in the session
  int64_t live[static_cast<int>(MemTag::kCount)] = {};
  int64_t baseline_live = 0;
  int64_t total = 0;
  MemoryPeak peak;

  void note_peak() {
    if (total <= peak.peak) return;
    peak.peak = total;
    peak.baseline_at_peak = baseline_live;
    std::copy(std::begin(live), std::end(live), std::begin(peak.by_tag));
  }
};

MemoryTracer& tracer() {
  static MemoryTracer* t = new MemoryTracer;  // never destroyed: frees may come during exit
  return *t;
}

}  // namespace

std::unordered_map<const void*, std::string>& param_modules() {
  static auto* m = new std::unordered_map<const void*, std::string>;
  return *m;
}

void set_param_names(const std::vector<std::pair<const void*, std::string>>& params) {
  MAMMOTH_CHECK(!on()) << "[profile] parameter names are set before a session starts";
  param_modules().clear();
  for (const auto& [data, name] : params) {
    if (data == nullptr) continue;
    const size_t dot = name.rfind('.');
    param_modules()[data] = dot == std::string::npos ? name : name.substr(0, dot);
  }
}

const char* param_module(const void* data) {
  const auto& m = param_modules();
  const auto it = m.find(data);
  return it == m.end() ? nullptr : it->second.c_str();
}

const char* mem_tag_name(MemTag tag) {
  switch (tag) {
    case MemTag::kActivations:
      return "activations";
    case MemTag::kGradients:
      return "gradients";
    case MemTag::kOptimizer:
      return "optimizer_states";
    case MemTag::kTemporaries:
      return "temporaries";
    case MemTag::kCount:
      break;
  }
  return "?";
}

void note_alloc(const void* p, int64_t bytes) {
  MemoryTracer& t = tracer();
  std::lock_guard<std::mutex> lock(t.mu);
  t.blocks[p] = {t_mem_tag, bytes};
  t.live[static_cast<int>(t_mem_tag)] += bytes;
  t.total += bytes;
  t.note_peak();
}

void note_free(const void* p, int64_t bytes) {
  MemoryTracer& t = tracer();
  std::lock_guard<std::mutex> lock(t.mu);
  const auto it = t.blocks.find(p);
  if (it == t.blocks.end()) {
    t.baseline_live -= bytes;
  } else {
    t.live[static_cast<int>(it->second.first)] -= it->second.second;
    t.blocks.erase(it);
  }
  t.total -= bytes;
}

void retag(const void* p, MemTag tag) {
  MemoryTracer& t = tracer();
  std::lock_guard<std::mutex> lock(t.mu);
  const auto it = t.blocks.find(p);
  if (it == t.blocks.end() || it->second.first == tag) return;
  t.live[static_cast<int>(it->second.first)] -= it->second.second;
  t.live[static_cast<int>(tag)] += it->second.second;
  it->second.first = tag;
}

void memory_begin(int64_t live_bytes) {
  MemoryTracer& t = tracer();
  std::lock_guard<std::mutex> lock(t.mu);
  t.blocks.clear();
  std::fill(std::begin(t.live), std::end(t.live), 0);
  t.baseline_live = t.total = live_bytes;
  t.peak = MemoryPeak{};
  t.peak.baseline = t.peak.peak = t.peak.baseline_at_peak = live_bytes;
}

MemoryPeak memory_peak() {
  MemoryTracer& t = tracer();
  std::lock_guard<std::mutex> lock(t.mu);
  return t.peak;
}

const char* lane_name(Lane lane) {
  switch (lane) {
    case Lane::kCompute:
      return "compute";
    case Lane::kComm:
      return "communication";
    case Lane::kPipeline:
      return "pipeline";
    case Lane::kIo:
      return "io";
  }
  return "?";
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void complete(Lane lane, const char* name, int64_t begin_ns, int64_t end_ns, const char* args) {
  if (!on()) return;
  Event* e = next_slot();
  if (e == nullptr) return;
  e->ts_ns = begin_ns;
  e->dur_ns = std::max<int64_t>(0, end_ns - begin_ns);
  e->value = 0;
  e->lane = lane;
  e->ph = 'X';
  copy_text(e->name, sizeof(e->name), name);
  copy_args(e->args, sizeof(e->args), args);
}

void counter(const char* name, int64_t value) {
  if (!on()) return;
  Event* e = next_slot();
  if (e == nullptr) return;
  e->ts_ns = now_ns();
  e->dur_ns = 0;
  e->value = value;
  e->lane = Lane::kCompute;
  e->ph = 'C';
  copy_text(e->name, sizeof(e->name), name);
  e->args[0] = '\0';
}

void start(size_t events_per_thread) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.capacity = std::max<size_t>(events_per_thread, 1);
  r.session.fetch_add(1, std::memory_order_acq_rel);
  g_on.store(true, std::memory_order_release);
}

void stop() { g_on.store(false, std::memory_order_release); }

std::vector<Event> events(int64_t* dropped) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const uint64_t session = r.session.load();
  std::vector<Event> out;
  int64_t lost = 0;
  for (const auto& b : r.buffers) {
    if (b->session != session) continue;
    out.insert(out.end(), b->events.begin(), b->events.begin() + static_cast<ptrdiff_t>(b->used));
    lost += b->dropped;
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Event& a, const Event& b) { return a.ts_ns < b.ts_ns; });
  if (dropped) *dropped = lost;
  return out;
}

std::string chrome_trace(const std::vector<Event>& evs, int pid, int64_t origin_ns,
                         int64_t dropped) {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  char line[512];
  // Lane names, so a viewer shows "rank R" / "compute" rather than bare numbers.
  std::snprintf(line, sizeof(line),
                "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,"
                "\"args\":{\"name\":\"rank %d\"}},\n"
                "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,"
                "\"args\":{\"sort_index\":%d}}",
                pid, pid, pid, pid);
  out += line;
  for (Lane lane : {Lane::kCompute, Lane::kComm, Lane::kPipeline, Lane::kIo}) {
    std::snprintf(line, sizeof(line),
                  ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,"
                  "\"args\":{\"name\":\"%s\"}}",
                  pid, static_cast<int>(lane), lane_name(lane));
    out += line;
  }
  for (const Event& e : evs) {
    const double ts = static_cast<double>(e.ts_ns - origin_ns) / 1e3;
    if (e.ph == 'C') {
      std::snprintf(line, sizeof(line),
                    ",\n{\"ph\":\"C\",\"name\":\"%s\",\"cat\":\"memory\",\"pid\":%d,\"tid\":0,"
                    "\"ts\":%.3f,\"args\":{\"bytes\":%lld}}",
                    e.name, pid, ts, static_cast<long long>(e.value));
    } else {
      std::snprintf(line, sizeof(line),
                    ",\n{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,"
                    "\"ts\":%.3f,\"dur\":%.3f,\"args\":{%s}}",
                    e.name, lane_name(e.lane), pid, static_cast<int>(e.lane), ts,
                    static_cast<double>(e.dur_ns) / 1e3, e.args);
    }
    out += line;
  }
  std::snprintf(line, sizeof(line), "\n],\"otherData\":{\"rank\":%d,\"dropped_events\":%lld}}\n",
                pid, static_cast<long long>(dropped));
  out += line;
  return out;
}

namespace {

// Splits every collective that all its group's members recorded (see CollectiveSplit).
void split_collectives(json::Value& all, size_t ranks, CollectiveSplit* out) {
  CollectiveSplit split;
  split.wait_ns.assign(ranks, 0);
  split.transfer_ns.assign(ranks, 0);
  // (op, group, group's first world rank, seq) -> its group's size and the events' indices in
  // `all`.
  struct Op {
    int64_t group_size = 0;
    std::vector<size_t> events;
  };
  std::map<std::tuple<std::string, std::string, int64_t, int64_t>, Op> ops;
  for (size_t i = 0; i < all.size(); ++i) {
    const json::Value& e = all[i];
    const json::Value* cat = e.find("cat");
    const json::Value* args = e.find("args");
    if (e.at("ph").as_string() != "X" || !cat || cat->as_string() != "communication" || !args)
      continue;
    const json::Value* peer = args->find("peer");
    const json::Value* size = args->find("group_size");
    if (!peer || peer->as_int() != -1 || !size || size->as_int() < 1) continue;  // p2p
    const auto key = std::make_tuple(e.at("name").as_string(), args->at("group").as_string(),
                                     args->at("group_first").as_int(), args->at("seq").as_int());
    Op& op = ops[key];
    op.group_size = size->as_int();
    op.events.push_back(i);
  }
  for (const auto& [key, op] : ops) {
    const std::vector<size_t>& idx = op.events;
    if (static_cast<int64_t>(idx.size()) != op.group_size) {
      ++split.unmatched;
      continue;
    }
    ++split.matched;
    double last_post = 0;  // us, on the common clock
    for (size_t i : idx) last_post = std::max(last_post, all[i].at("ts").as_double());
    for (size_t i : idx) {
      json::Value& e = all[i];
      const double ts = e.at("ts").as_double(), end = ts + e.at("dur").as_double();
      const double wait = std::max(0.0, std::min(last_post, end) - ts);
      const double transfer = std::max(0.0, end - std::max(ts, last_post));
      e.at("args").set("wait_us", wait).set("transfer_us", transfer);
      const int64_t pid = e.at("pid").as_int();
      if (pid >= 0 && static_cast<size_t>(pid) < ranks) {
        split.wait_ns[static_cast<size_t>(pid)] += static_cast<int64_t>(wait * 1e3);
        split.transfer_ns[static_cast<size_t>(pid)] += static_cast<int64_t>(transfer * 1e3);
      }
    }
  }
  if (out) *out = std::move(split);
}

}  // namespace

std::string merge_traces(const std::vector<std::string>& traces, CollectiveSplit* split) {
  json::Value all = json::Value::array();
  int64_t dropped = 0;
  for (size_t i = 0; i < traces.size(); ++i) {
    const json::Value t = json::parse(traces[i], "trace of rank " + std::to_string(i));
    for (const json::Value& e : t.at("traceEvents")) all.push_back(e);
    if (const json::Value* other = t.find("otherData"))
      if (const json::Value* d = other->find("dropped_events")) dropped += d->as_int();
  }
  split_collectives(all, traces.size(), split);
  json::Value merged = json::Value::object();
  merged.set("displayTimeUnit", "ms");
  merged.set("traceEvents", std::move(all));
  merged.set("otherData", json::Value::object()
                              .set("ranks", static_cast<int64_t>(traces.size()))
                              .set("dropped_events", dropped));
  return json::dump(merged) + "\n";
}

namespace {

bool starts_with(const char* s, const char* prefix) {
  return std::strncmp(s, prefix, std::strlen(prefix)) == 0;
}

// The number after "key": in an event's args (0 when absent).
double arg_number(const char* args, const char* key) {
  char pattern[40];
  std::snprintf(pattern, sizeof pattern, "\"%s\":", key);
  const char* at = std::strstr(args, pattern);
  return at == nullptr ? 0.0 : std::strtod(at + std::strlen(pattern), nullptr);
}

}  // namespace

const char* op_class(const char* name, bool backward) {
  if (std::strcmp(name, "matmul") == 0 || starts_with(name, "grouped_matmul"))
    return backward ? "gemm backward" : "gemm forward";
  if (starts_with(name, "attention")) return "attention";
  if (starts_with(name, "layer_norm") || starts_with(name, "rms_norm")) return "norms";
  for (const char* act : {"gelu", "silu", "relu", "tanh"})
    if (starts_with(name, act)) return "activations";
  if (starts_with(name, "softmax") || starts_with(name, "log_softmax") ||
      starts_with(name, "cross_entropy"))
    return "softmax / cross-entropy";
  if (std::strcmp(name, "optimizer") == 0 || std::strcmp(name, "adamw") == 0 ||
      std::strcmp(name, "sgd") == 0)
    return "optimizer";
  if (std::strcmp(name, "sum_last") == 0 || std::strcmp(name, "max_last") == 0 ||
      std::strcmp(name, "sum_sq_last") == 0)
    return "reductions";
  if (starts_with(name, "index_") || std::strcmp(name, "gather") == 0 ||
      std::strcmp(name, "scatter_add") == 0 || starts_with(name, "moe_combine"))
    return "embedding / indexing";
  return "elementwise / copies";
}

double Summary::Class::bound_s(double flops_per_s, double bytes_per_s) const {
  const double compute = flops_per_s > 0 ? flops / flops_per_s : 0.0;
  const double memory = bytes_per_s > 0 ? bytes / bytes_per_s : 0.0;
  return std::max(compute, memory);
}

Summary summarize(const std::vector<Event>& evs, size_t top) {
  Summary s;
  std::map<std::string, Summary::Op> ops;
  std::map<std::string, Summary::Class> classes;
  std::vector<std::pair<int64_t, int64_t>> compute, comm, steps, any;
  for (const Event& e : evs) {
    if (e.ph != 'X') continue;
    const std::pair<int64_t, int64_t> span{e.ts_ns, e.ts_ns + e.dur_ns};
    if (std::strcmp(e.name, "step") == 0) {
      ++s.steps;
      s.step_ns += e.dur_ns;
      steps.push_back(span);
      continue;
    }
    any.push_back(span);
    if (e.lane == Lane::kComm) comm.push_back(span);
    if (e.lane != Lane::kCompute) continue;
    compute.push_back(span);
    Summary::Op& op = ops[e.name];
    op.name = e.name;
    ++op.count;
    op.total_ns += e.dur_ns;
    Summary::Class& c =
        classes[op_class(e.name, std::strstr(e.args, "\"backward\":true") != nullptr)];
    ++c.count;
    c.total_ns += e.dur_ns;
    c.flops += arg_number(e.args, "flops");
    c.bytes += arg_number(e.args, "bytes");
  }
  for (auto& [name, op] : ops) s.top_ops.push_back(op);
  std::sort(s.top_ops.begin(), s.top_ops.end(),
            [](const Summary::Op& a, const Summary::Op& b) { return a.total_ns > b.total_ns; });
  if (s.top_ops.size() > top) s.top_ops.resize(top);
  for (auto& [name, c] : classes) {
    c.name = name;
    s.classes.push_back(c);
  }
  std::sort(
      s.classes.begin(), s.classes.end(),
      [](const Summary::Class& a, const Summary::Class& b) { return a.total_ns > b.total_ns; });
  // Outside ops: the steps' time no other event (on any lane) covers, |S| - |S and A| =
  // |S or A| - |A|.
  std::vector<std::pair<int64_t, int64_t>> steps_or_any = steps;
  steps_or_any.insert(steps_or_any.end(), any.begin(), any.end());
  s.outside_ops_ns = union_ns(steps_or_any) - union_ns(any);
  s.compute_ns = union_ns(compute);
  s.comm_ns = union_ns(comm);
  // Exposed: the communication time no compute event covers, |C| - |C and K| =
  // |C or K| - |K|.
  std::vector<std::pair<int64_t, int64_t>> both = compute;
  both.insert(both.end(), comm.begin(), comm.end());
  s.exposed_comm_ns = union_ns(both) - s.compute_ns;
  return s;
}

}  // namespace mammoth::profile
