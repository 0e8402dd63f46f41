#include "engine/profile/session.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/json.h"

namespace mammoth::profile {
namespace {

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  MAMMOTH_CHECK(f.good()) << "[profile] cannot write " << path;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MAMMOTH_CHECK(f.good()) << "[profile] cannot read " << path
                          << " (--profile DIR must be shared by every rank)";
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// This boot of this machine ("" where the kernel does not say): processes that share it share
// CLOCK_MONOTONIC, which steady_clock reads.
std::string boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(f, id);
  return id;
}

std::string rank_path(const std::string& dir, int rank) {
  return dir + "/rank_" + std::to_string(rank) + ".trace.json";
}

// Prints rank 0's time by op class, each against its roofline bound where the peaks are given,
// and returns the same as JSON.
json::Value class_table(const Summary& s, double flops_per_s, double bytes_per_s) {
  const bool bounds = flops_per_s > 0 || bytes_per_s > 0;
  const double step_ms = static_cast<double>(s.step_ns) * 1e-6;
  std::fprintf(stderr, "[profile] time by op class on rank 0");
  if (bounds) {
    std::fprintf(stderr, ", against the roofline of %.1f GFLOP/s and %.1f GB/s", flops_per_s * 1e-9,
                 bytes_per_s * 1e-9);
  }
  std::fprintf(stderr, ":\n  %-24s %8s %12s %7s", "class", "calls", "time", "share");
  if (bounds) std::fprintf(stderr, " %12s %9s", "bound", "of bound");
  std::fprintf(stderr, "\n");
  json::Value out = json::Value::array();
  auto row = [&](const std::string& name, int64_t count, int64_t ns, double bound_s) {
    const double ms = static_cast<double>(ns) * 1e-6;
    const std::string calls = count < 0 ? "" : std::to_string(count);
    std::fprintf(stderr, "  %-24s %8s %9.3f ms %6.1f%%", name.c_str(), calls.c_str(), ms,
                 step_ms > 0 ? 100.0 * ms / step_ms : 0.0);
    json::Value j = json::Value::object().set("name", name).set("total_ms", ms);
    if (count >= 0) j.set("count", count);
    if (bounds && bound_s > 0) {
      std::fprintf(stderr, " %9.3f ms %8.2fx", bound_s * 1e3, ms * 1e-3 / bound_s);
      j.set("bound_ms", bound_s * 1e3);
    }
    std::fprintf(stderr, "\n");
    return j;
  };
  for (const Summary::Class& c : s.classes) {
    out.push_back(row(c.name, c.count, c.total_ns, c.bound_s(flops_per_s, bytes_per_s))
                      .set("flops", c.flops)
                      .set("bytes", c.bytes));
  }
  // Communication no compute hides, then the steps' time outside every event: the framework,
  // allocation, the data loader.
  out.push_back(row("exposed communication", -1, s.exposed_comm_ns, 0));
  out.push_back(row("outside ops", -1, s.outside_ops_ns, 0));
  if (!bounds) {
    std::fprintf(stderr,
                 "[profile] --peak-gflops and --peak-gbps give each class's roofline bound "
                 "(mammoth bench gemm and bench kernels measure this machine's)\n");
  }
  return out;
}

}  // namespace

std::pair<int64_t, int64_t> parse_steps(const std::string& text) {
  const size_t colon = text.find(':');
  char* end = nullptr;
  const long long a = colon == std::string::npos ? -1 : std::strtoll(text.c_str(), &end, 10);
  const bool a_ok = colon != std::string::npos && end == text.c_str() + colon;
  const long long b = a_ok ? std::strtoll(text.c_str() + colon + 1, &end, 10) : -1;
  MAMMOTH_CHECK(a_ok && *end == '\0' && colon + 1 < text.size() && a >= 0 && b > a)
      << "[train] --profile-steps must be A:B with 0 <= A < B (steps A..B-1, 0-based), got '"
      << text << "'";
  return {a, b};
}

Session::Session(SessionOptions o) : o_(std::move(o)) {
  std::error_code ec;
  std::filesystem::create_directories(o_.dir, ec);
  MAMMOTH_CHECK(!ec) << "[train] --profile: cannot create " << o_.dir << ": " << ec.message();
}

void Session::on_step(int64_t step, bool begin) {
  if (done_) return;
  // From the first step at or past A (a resumed run may start later), to B.
  if (begin && step >= o_.first && step < o_.last && !running_) {
    // The common clock. Rank 0 publishes its steady_clock reading and boot id, then every rank
    // leaves one barrier: a rank on the same boot of the same machine shares rank 0's
    // CLOCK_MONOTONIC and takes its reading as time 0 (exact); any other takes the moment it
    // left the barrier (off by the barrier's exit skew).
    const std::string clock_path = o_.dir + "/clock.json";
    if (o_.rank == 0)
      write_file(
          clock_path,
          json::dump(json::Value::object().set("boot_id", boot_id()).set("origin_ns", now_ns())));
    if (o_.barrier) o_.barrier();
    origin_ns_ = now_ns();
    const json::Value clock = json::parse(read_file(clock_path), clock_path);
    if (!boot_id().empty() && clock.at("boot_id").as_string() == boot_id())
      origin_ns_ = clock.at("origin_ns").as_int();
    start();
    memory_begin(o_.allocator_live ? o_.allocator_live() : 0);
    running_ = true;
    return;
  }
  if (!begin && running_) {
    if (o_.allocator_peak) measured_peak_ = std::max(measured_peak_, o_.allocator_peak());
    if (step + 1 == o_.last) finish();
  }
}

void Session::finish() {
  stop();
  running_ = false;
  done_ = true;
  int64_t dropped = 0;
  const std::vector<Event> evs = events(&dropped);
  write_file(rank_path(o_.dir, o_.rank), chrome_trace(evs, o_.rank, origin_ns_, dropped));

  const Summary s = summarize(evs);
  // The memory tracer's peak, split: the baseline still live by what the runtime holds, then
  // what the profiled steps made by tag. The parts sum to the peak by construction.
  const MemoryPeak mp = memory_peak();
  const int64_t traced_peak = mp.peak;
  json::Value parts = json::Value::object();
  int64_t left = mp.baseline_at_peak;
  for (const auto& [name, bytes] :
       {std::pair{"parameters", o_.param_bytes}, std::pair{"gradients_persistent", o_.grad_bytes},
        std::pair{"optimizer_states_persistent", o_.optimizer_bytes}}) {
    const int64_t take = std::clamp<int64_t>(bytes, 0, left);
    parts.set(name, take);
    left -= take;
  }
  parts.set("other_persistent", left);
  for (int t = 0; t < static_cast<int>(MemTag::kCount); ++t)
    parts.set(mem_tag_name(static_cast<MemTag>(t)), mp.by_tag[t]);
  std::string split;
  for (const json::Value& m : parts) {
    if (m.as_int() == 0) continue;
    char buf[96];
    std::snprintf(buf, sizeof(buf), "%s%s %.2f MiB", split.empty() ? "" : ", ", m.key().c_str(),
                  static_cast<double>(m.as_int()) / 1048576.0);
    split += buf;
  }
  const double step_s = static_cast<double>(s.step_ns) * 1e-9;
  const double flops = o_.flops_per_step * static_cast<double>(s.steps);
  const double achieved = step_s > 0 ? flops / step_s : 0;
  std::fprintf(stderr,
               "[profile] rank %d: %lld steps in %.3f s; compute %.3f s, communication %.3f s "
               "(exposed %.3f s); memory peak %lld bytes traced, %lld measured\n",
               o_.rank, static_cast<long long>(s.steps), step_s,
               static_cast<double>(s.compute_ns) * 1e-9, static_cast<double>(s.comm_ns) * 1e-9,
               static_cast<double>(s.exposed_comm_ns) * 1e-9, static_cast<long long>(traced_peak),
               static_cast<long long>(measured_peak_));
  std::fprintf(stderr, "[profile] rank %d memory peak %.2f MiB: %s\n", o_.rank,
               static_cast<double>(traced_peak) / 1048576.0, split.c_str());
  json::Value mine =
      json::Value::object()
          .set("rank", o_.rank)
          .set("steps", s.steps)
          .set("step_s", step_s)
          .set("compute_s", static_cast<double>(s.compute_ns) * 1e-9)
          .set("communication_s", static_cast<double>(s.comm_ns) * 1e-9)
          .set("exposed_communication_s", static_cast<double>(s.exposed_comm_ns) * 1e-9)
          .set("traced_peak_bytes", traced_peak)
          .set("measured_peak_bytes", measured_peak_)
          .set("peak_attribution", std::move(parts))
          .set("dropped_events", dropped);
  write_file(o_.dir + "/rank_" + std::to_string(o_.rank) + ".summary.json", json::dump(mine));
  if (o_.barrier) o_.barrier();  // every rank's files are written
  if (o_.rank != 0) return;

  std::vector<std::string> traces;
  json::Value ranks = json::Value::array();
  for (int r = 0; r < o_.world; ++r) {
    traces.push_back(read_file(rank_path(o_.dir, r)));
    ranks.push_back(json::parse(read_file(o_.dir + "/rank_" + std::to_string(r) + ".summary.json"),
                                "rank summary"));
  }
  CollectiveSplit coll;
  write_file(o_.dir + "/merged.trace.json", merge_traces(traces, &coll));
  for (int r = 0; r < o_.world && o_.world > 1; ++r) {
    const double wait = static_cast<double>(coll.wait_ns[static_cast<size_t>(r)]) * 1e-9;
    const double transfer = static_cast<double>(coll.transfer_ns[static_cast<size_t>(r)]) * 1e-9;
    std::fprintf(stderr,
                 "[profile] rank %d collectives: %.3f s waiting for the last member, %.3f s "
                 "transfer\n",
                 r, wait, transfer);
    ranks[static_cast<size_t>(r)]
        .set("collective_wait_s", wait)
        .set("collective_transfer_s", transfer);
  }
  if (coll.unmatched > 0)
    std::fprintf(stderr,
                 "[profile] %lld collectives not recorded by every member (outside a rank's "
                 "profiled steps) are not split\n",
                 static_cast<long long>(coll.unmatched));
  std::fprintf(stderr, "[profile] top ops on rank 0 by time:\n");
  json::Value top = json::Value::array();
  for (const Summary::Op& op : s.top_ops) {
    std::fprintf(stderr, "  %-24s %8lld calls %10.3f ms\n", op.name.c_str(),
                 static_cast<long long>(op.count), static_cast<double>(op.total_ns) * 1e-6);
    top.push_back(json::Value::object()
                      .set("name", op.name)
                      .set("count", op.count)
                      .set("total_ms", static_cast<double>(op.total_ns) * 1e-6));
  }
  json::Value classes = class_table(s, o_.peak_flops, o_.peak_bytes_per_s);
  const double mfu = o_.peak_flops > 0 ? achieved / o_.peak_flops : 0;
  std::fprintf(stderr, "[profile] model FLOPs %.4g over %lld steps: %.4g FLOP/s achieved", flops,
               static_cast<long long>(s.steps), achieved);
  if (o_.peak_flops > 0) std::fprintf(stderr, ", MFU %.2f%%", 100.0 * mfu);
  std::fprintf(stderr, "\n[profile] traces in %s (open merged.trace.json in ui.perfetto.dev)\n",
               o_.dir.c_str());
  json::Value summary =
      json::Value::object()
          .set("steps", s.steps)
          .set("flops_per_step", o_.flops_per_step)
          .set("flops", flops)
          .set("achieved_flops_per_s", achieved)
          .set("top_ops_rank0", std::move(top))
          .set("classes_rank0", std::move(classes))
          .set("outside_ops_s_rank0", static_cast<double>(s.outside_ops_ns) * 1e-9)
          .set("model_config",
               o_.model_config.empty() ? json::Value() : json::parse(o_.model_config))
          .set("ranks", std::move(ranks));
  if (o_.peak_flops > 0) summary.set("mfu", mfu);
  write_file(o_.dir + "/summary.json", json::dump(summary, 1) + "\n");
}

}  // namespace mammoth::profile
