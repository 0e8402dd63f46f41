// `mammoth bench io`: memory/io's engine vs fio (see io_bench.h).
#include "tools/bench/io_bench.h"

#include <stdio.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <thread>

#include "base/cpu_time.h"
#include "base/crc32c.h"
#include "base/error.h"
#include "base/json.h"
#include "memory/io/aligned_buffer.h"
#include "memory/io/async_io.h"
#include "memory/io/block_checksum.h"
#include "memory/io/swap_dir.h"
#include "memory/io/uring_engine.h"

namespace mammoth::tools {
namespace {

namespace io = memory::io;
using Clock = std::chrono::steady_clock;

constexpr size_t kSeqBlock = size_t{1} << 20;
constexpr size_t kRandBlock = 4096;

struct Options {
  std::string dir;
  int64_t size = int64_t{1} << 30;
  double seconds = 5;
  int queue_depth = 32;
  int rounds = 1;
  // How the rounds of each side become one number: "median" (robust to one round that a
  // neighbour's load or the host's cache made slow or fast) or "best".
  std::string stat = "median";
  io::EngineKind engine = io::EngineKind::kAuto;
  bool checksums = true;
  bool eager_resubmit = true;
  // Reads' bytes are evicted from the caches once verified: the bench never reads them, and
  // the next read into the same buffer is then not slowed by lines cached here (see
  // AsyncIOOptions::evict_verified_lines). --keep-verified-lines: the engine's default.
  bool evict_verified_lines = true;
  std::string fio = "fio";
  std::string json_path;
  std::string only;      // comma-separated row prefixes ("rand_read"); empty: all rows
  bool verbose = false;  // a line per run: value, CPU, mean latency
};

struct Row {
  std::string name, shape, unit;
  double ours = 0;
  std::optional<double> anchor;
  // CPU time over wall time, summed over the rounds (percent of one core): what each side spent
  // for its number. Ours counts every thread of this process.
  double ours_cpu = 0, ours_wall = 0, anchor_cpu = 0, anchor_wall = 0;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

// "1G", "512M", "64K", "4096", "1GiB": bytes.
int64_t parse_size(const std::string& name, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  std::string unit(end);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() == 3 && unit.substr(1) == "IB") unit = unit.substr(0, 1);
  int64_t mul = 0;
  if (unit.empty() || unit == "B") mul = 1;
  if (unit == "K") mul = int64_t{1} << 10;
  if (unit == "M") mul = int64_t{1} << 20;
  if (unit == "G") mul = int64_t{1} << 30;
  if (unit == "T") mul = int64_t{1} << 40;
  MAMMOTH_CHECK(!v.empty() && end != v.c_str() && mul > 0 && x > 0)
      << "[bench io] --" << name << " expects a size such as 1G, 256M or 4096, got '" << v << "'";
  return static_cast<int64_t>(x * static_cast<double>(mul));
}

double parse_positive(const std::string& name, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  MAMMOTH_CHECK(!v.empty() && *end == '\0' && x > 0)
      << "[bench io] --" << name << " expects a positive number, got '" << v << "'";
  return x;
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  if (const char* t = std::getenv("TMPDIR"); t != nullptr && *t != '\0') {
    o.dir = t;
  } else {
    o.dir = "/var/tmp";
  }
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    MAMMOTH_CHECK(name.rfind("--", 0) == 0)
        << "[bench io] unexpected argument '" << name << "' (options start with --)";
    name = name.substr(2);
    if (name == "no-checksums") {
      o.checksums = false;
      continue;
    }
    if (name == "batch-resubmit") {
      o.eager_resubmit = false;
      continue;
    }
    if (name == "keep-verified-lines") {
      o.evict_verified_lines = false;
      continue;
    }
    if (name == "verbose") {
      o.verbose = true;
      continue;
    }
    if (name == "help") {
      std::printf(
          "mammoth bench io [--dir DIR] [--size 1G] [--seconds 5] [--queue-depth 32] "
          "[--rounds 1] [--stat median|best] [--engine auto|io_uring|threads] [--no-checksums] "
          "[--fio PATH|none] "
          "[--json FILE] [--only seq_write,seq_read,rand_read] [--batch-resubmit] "
          "[--keep-verified-lines] [--verbose]\n");
      std::exit(0);
    }
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      MAMMOTH_CHECK(i + 1 < args.size()) << "[bench io] --" << name << " needs a value";
      value = args[++i];
    }
    if (name == "dir") {
      o.dir = value;
    } else if (name == "size") {
      o.size = parse_size(name, value);
    } else if (name == "seconds") {
      o.seconds = parse_positive(name, value);
    } else if (name == "queue-depth") {
      o.queue_depth = static_cast<int>(parse_positive(name, value));
    } else if (name == "stat") {
      MAMMOTH_CHECK(value == "median" || value == "best")
          << "[bench io] --stat must be median or best, got '" << value << "'";
      o.stat = value;
    } else if (name == "rounds") {
      o.rounds = static_cast<int>(parse_positive(name, value));
    } else if (name == "engine") {
      o.engine = io::parse_engine_kind(value, "--engine");
    } else if (name == "fio") {
      o.fio = value;
    } else if (name == "json") {
      o.json_path = value;
    } else if (name == "only") {
      o.only = value;
    } else {
      MAMMOTH_THROW()
          << "[bench io] unknown option --" << name
          << " (known: --dir --size --seconds --queue-depth --rounds --stat --engine "
             "--no-checksums --fio --json --only --batch-resubmit --keep-verified-lines "
             "--verbose)";
    }
  }
  MAMMOTH_CHECK(o.size >= static_cast<int64_t>(kSeqBlock) && o.size % kSeqBlock == 0)
      << "[bench io] --size must be a positive multiple of 1 MiB, got " << o.size;
  return o;
}

// ---- ours ----

// Sequential transfer of the whole file in 1 MiB blocks with queue_depth in flight; each block
// reuses the buffer slot of the request queue_depth before it. Returns GB/s.
double ours_sequential(io::AsyncIO& engine, io::FileId f, io::Op op, int64_t size, int depth,
                       io::AlignedBuffer& pool) {
  const int64_t blocks = size / static_cast<int64_t>(kSeqBlock);
  std::vector<io::Ticket> slot(static_cast<size_t>(depth));
  const auto t0 = Clock::now();
  for (int64_t b = 0; b < blocks; ++b) {
    io::Ticket& t = slot[static_cast<size_t>(b % depth)];
    if (t.valid()) t.wait();
    char* buf = pool.data() + static_cast<size_t>(b % depth) * kSeqBlock;
    const int64_t off = b * static_cast<int64_t>(kSeqBlock);
    t = op == io::Op::kWrite ? engine.write(f, off, buf, kSeqBlock)
                             : engine.read(f, off, buf, kSeqBlock);
  }
  engine.synchronize();
  return static_cast<double>(size) / seconds_since(t0) / 1e9;
}

// Random 4 KiB reads for `seconds` with `depth` in flight. Each completion's callback submits
// the next read into its buffer slot, on the engine's completion thread: the pipeline a
// high-IOPS caller uses, with no thread hand-off per request. Returns IOPS.
class RandomReader {
 public:
  RandomReader(io::AsyncIO& engine, io::FileId f, int64_t size, io::AlignedBuffer& pool)
      : engine_(engine), f_(f), blocks_(static_cast<uint64_t>(size) / kRandBlock), pool_(pool) {}

  double run(int depth, double seconds) {
    started_.resize(static_cast<size_t>(depth));
    const auto t0 = Clock::now();
    std::vector<io::Request> first;
    for (int s = 0; s < depth; ++s) first.push_back(request(s));
    engine_.submit(std::move(first));
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    stop_.store(true);
    engine_.synchronize();
    const double elapsed = seconds_since(t0);
    if (failed_.load() > 0)
      MAMMOTH_THROW() << "[bench io] " << failed_.load() << " random reads failed";
    return static_cast<double>(completed_.load()) / elapsed;
  }
  // Mean time from a read's submission to its callback, microseconds.
  double mean_latency_us() const {
    return static_cast<double>(latency_ns_.load()) / 1e3 /
           static_cast<double>(std::max<int64_t>(1, completed_.load()));
  }

 private:
  io::Request request(int slot) {
    // splitmix64 of a shared counter: thread-safe, uniform, reproducible in distribution.
    uint64_t z = next_.fetch_add(1, std::memory_order_relaxed) * 0x9e3779b97f4a7c15ull + 12345;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const int64_t off = static_cast<int64_t>((z % blocks_) * kRandBlock);
    started_[static_cast<size_t>(slot)] = Clock::now();
    return {io::Op::kRead, f_,
            off,           pool_.data() + static_cast<size_t>(slot) * kRandBlock,
            kRandBlock,    [this, slot](const std::string& error) { done(slot, error); }};
  }
  void done(int slot, const std::string& error) {
    if (!error.empty()) failed_.fetch_add(1);
    latency_ns_.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(
                              Clock::now() - started_[static_cast<size_t>(slot)])
                              .count(),
                          std::memory_order_relaxed);
    completed_.fetch_add(1, std::memory_order_relaxed);
    if (stop_.load(std::memory_order_relaxed)) return;
    // post(): no ticket and no batch vector, so the steady state allocates nothing.
    engine_.post(request(slot));
  }

  io::AsyncIO& engine_;
  io::FileId f_;
  uint64_t blocks_;
  io::AlignedBuffer& pool_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> next_{0};
  std::atomic<int64_t> completed_{0}, failed_{0}, latency_ns_{0};
  std::vector<Clock::time_point> started_;  // per slot: when its read was submitted
};

// ---- fio ----

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs one fio job and returns its JSON "jobs"[0]; nullopt (with a note on stderr) if fio is
// missing or fails.
std::optional<json::Value> run_fio(const Options& o, const std::string& args) {
  const std::string cmd = shell_quote(o.fio) +
                          " --output-format=json --ioengine=io_uring --direct=1 --iodepth=" +
                          std::to_string(o.queue_depth) + " " + args + " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    std::fprintf(stderr, "[bench io] cannot run fio: %s\n", std::strerror(errno));
    return std::nullopt;
  }
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  if (status != 0 || out.empty()) {
    std::fprintf(stderr, "[bench io] fio failed (exit status %d): %s\n", status, cmd.c_str());
    return std::nullopt;
  }
  // fio may print notes before the JSON document.
  const size_t brace = out.find('{');
  if (brace == std::string::npos) return std::nullopt;
  json::Value doc = json::parse(std::string_view(out).substr(brace), "fio output");
  const json::Value& job = doc.at("jobs")[0];
  MAMMOTH_CHECK(job.at("error").as_int() == 0)
      << "[bench io] fio job " << job.at("jobname").as_string() << " reported error "
      << job.at("error").as_int();
  return job;
}

void print_row(const Row& r) {
  char anchor[32] = "-", ratio[32] = "-";
  if (r.anchor) {
    std::snprintf(anchor, sizeof(anchor), "%.3f", *r.anchor);
    std::snprintf(ratio, sizeof(ratio), "%.2f", r.ours / *r.anchor);
  }
  if (r.unit == "IOPS") {
    if (r.anchor) std::snprintf(anchor, sizeof(anchor), "%.0f", *r.anchor);
    std::printf("%-22s %-14s %12.0f %12s %6s %7s\n", r.name.c_str(), r.shape.c_str(), r.ours,
                anchor, r.unit.c_str(), ratio);
  } else {
    std::printf("%-22s %-14s %12.3f %12s %6s %7s\n", r.name.c_str(), r.shape.c_str(), r.ours,
                anchor, r.unit.c_str(), ratio);
  }
  std::fflush(stdout);
}

}  // namespace

int run_io_bench(const std::vector<std::string>& args) {
  const Options o = parse(args);
  const bool with_fio = o.fio != "none";
  // Our file and fio's, plus room to spare.
  io::SwapDir swap(o.dir, (with_fio ? 2 : 1) * o.size + (int64_t{64} << 20));
  auto engine = io::make_async_io({.engine = o.engine,
                                   .queue_depth = o.queue_depth,
                                   .checksums = o.checksums,
                                   .eager_resubmit = o.eager_resubmit,
                                   .evict_verified_lines = o.evict_verified_lines},
                                  swap.path());

  std::string features;
  if (auto* u = dynamic_cast<io::UringEngine*>(engine.get())) {
    features = std::string(io::task_run_name(u->task_run())) + ", " +
               std::to_string(u->registered_file_slots()) + " fixed-file slots";
  } else {
    features = "fallback: " + (engine->fallback_reason().empty() ? std::string("forced")
                                                                 : engine->fallback_reason());
  }
  std::printf("io bench: %s (private subdirectory %s), file %s, queue depth %d\n", o.dir.c_str(),
              swap.path().c_str(), io::format_bytes(o.size).c_str(), o.queue_depth);
  std::printf(
      "ours: %s engine (%s), checksums %s; anchor: %s\n", engine->name(), features.c_str(),
      o.checksums ? (crc32c_hardware()
                         ? (o.evict_verified_lines ? "crc32c/4KiB (sse4.2), verified lines evicted"
                                                   : "crc32c/4KiB (sse4.2), verified lines kept")
                         : "crc32c/4KiB (table)")
                  : "off",
      with_fio ? (o.fio + " ioengine=io_uring direct=1 iodepth=" + std::to_string(o.queue_depth) +
                  ", one job, its defaults otherwise (no fixedbufs, registerfiles, hipri "
                  "or sqthread_poll)")
                     .c_str()
               : "none");
  std::printf("each row: %s of %d alternating round%s per side%s\n", o.stat.c_str(), o.rounds,
              o.rounds == 1 ? "" : "s", o.eager_resubmit ? "" : "; ours: --batch-resubmit");

  const std::string ours_path = swap.create_file("ours.dat", o.size);
  const std::string fio_path = swap.path() + "/fio.dat";
  const io::FileId f = engine->open(ours_path);
  io::AlignedBuffer seq_pool(static_cast<size_t>(o.queue_depth) * kSeqBlock);
  io::AlignedBuffer rand_pool(static_cast<size_t>(o.queue_depth) * kRandBlock);
  for (size_t i = 0; i < seq_pool.size(); i += 8) std::memcpy(seq_pool.data() + i, &i, 8);
  const bool fixed = engine->register_buffer(seq_pool.data(), seq_pool.size()) &&
                     engine->register_buffer(rand_pool.data(), rand_pool.size());
  if (engine->kind() == io::EngineKind::kUring && !fixed) {
    std::printf("note: buffer registration refused (memlock limit?); plain reads and writes\n");
  }

  const std::string shape_seq = std::to_string(o.size) + " B";
  std::vector<Row> rows = {
      {"seq_write_1MiB_qd" + std::to_string(o.queue_depth), shape_seq, "GB/s"},
      {"seq_read_1MiB_qd" + std::to_string(o.queue_depth), shape_seq, "GB/s"},
      {"rand_read_4KiB_qd" + std::to_string(o.queue_depth), seconds_text(o.seconds), "IOPS"}};
  std::printf("\n%-22s %-14s %12s %12s %6s %7s\n", "name", "shape", "ours", "fio", "unit", "ratio");
  // Each side's value per round; the row gets their median or best (--stat) at the end.
  std::vector<double> ours_runs, fio_runs;
  auto summary = [&](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    if (o.stat == "best") return v.back();
    const size_t m = v.size() / 2;
    return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
  };
  // Reads (sequential and random) by both sides go to our file, so both see the same data with
  // the same cache state below the VM; the order alternates by round so neither side always runs
  // right after the write that warmed whatever cache the virtual disk has.
  const std::string fio_read =
      "--filename=" + shell_quote(ours_path) + " --readonly --size=" + std::to_string(o.size);
  const std::string fio_write =
      "--filename=" + shell_quote(fio_path) + " --size=" + std::to_string(o.size);
  const std::string runtime = std::to_string(std::max(1, static_cast<int>(o.seconds + 0.5)));
  auto selected = [&](int shape) {
    if (o.only.empty()) return true;
    const std::string& name = rows[static_cast<size_t>(shape)].name;
    size_t start = 0;
    for (;;) {
      const size_t comma = o.only.find(',', start);
      const std::string want = o.only.substr(start, comma - start);
      if (!want.empty() && name.rfind(want, 0) == 0) return true;
      if (comma == std::string::npos) return false;
      start = comma + 1;
    }
  };
  MAMMOTH_CHECK(selected(0) || selected(1) || selected(2))
      << "[bench io] --only " << o.only << " selects no row (seq_write, seq_read, rand_read)";
  if (!selected(0)) {
    // The read rows need data with checksums: write the file once, untimed.
    ours_sequential(*engine, f, io::Op::kWrite, o.size, o.queue_depth, seq_pool);
  }
  for (int shape = 0; shape < 3; ++shape) {
    if (!selected(shape)) continue;
    Row& row = rows[static_cast<size_t>(shape)];
    for (int round = 0; round < o.rounds; ++round) {
      for (int side = 0; side < 2; ++side) {
        const bool ours_turn = (side == 0) == (round % 2 == 0);
        if (ours_turn) {
          const double cpu0 = process_cpu_seconds();
          const auto t0 = Clock::now();
          double v;
          if (shape == 0) {
            v = ours_sequential(*engine, f, io::Op::kWrite, o.size, o.queue_depth, seq_pool);
          } else if (shape == 1) {
            v = ours_sequential(*engine, f, io::Op::kRead, o.size, o.queue_depth, seq_pool);
          } else {
            RandomReader reader(*engine, f, o.size, rand_pool);
            v = reader.run(o.queue_depth, o.seconds);
            if (o.verbose) {
              std::printf("  ours %.0f IOPS, mean latency %.1f us\n", v, reader.mean_latency_us());
            }
          }
          if (o.verbose && shape < 2) std::printf("  ours %.3f GB/s\n", v);
          ours_runs.push_back(v);
          row.ours_wall += seconds_since(t0);
          row.ours_cpu += process_cpu_seconds() - cpu0;
          continue;
        }
        if (!with_fio) continue;
        std::optional<json::Value> job;
        if (shape == 0) {
          job = run_fio(o, "--name=seq_write --rw=write --bs=1M " + fio_write);
          if (job) fio_runs.push_back(job->at("write").at("bw_bytes").as_double() / 1e9);
          if (job && o.verbose) std::printf("  fio  %.3f GB/s\n", fio_runs.back());
        } else if (shape == 1) {
          job = run_fio(o, "--name=seq_read --rw=read --bs=1M " + fio_read);
          if (job) fio_runs.push_back(job->at("read").at("bw_bytes").as_double() / 1e9);
          if (job && o.verbose) std::printf("  fio  %.3f GB/s\n", fio_runs.back());
        } else {
          job = run_fio(o,
                        "--name=rand_read --rw=randread --bs=4k --norandommap --randrepeat=0 "
                        "--time_based --runtime=" +
                            runtime + " " + fio_read);
          if (job) {
            const double iops = job->at("read").at("iops").as_double();
            fio_runs.push_back(iops);
            if (o.verbose) {
              const double lat = job->at("read").at("lat_ns").at("mean").as_double() / 1e3;
              std::printf("  fio  %.0f IOPS, mean latency %.1f us\n", iops, lat);
            }
          }
        }
        if (job) {
          // fio reports usr_cpu and sys_cpu in percent of its job's run time (ms).
          const double ms = job->at(shape == 0 ? "write" : "read").at("runtime").as_double();
          row.anchor_wall += ms / 1e3;
          row.anchor_cpu +=
              (job->at("usr_cpu").as_double() + job->at("sys_cpu").as_double()) / 100 * ms / 1e3;
        }
      }
    }
    if (!ours_runs.empty()) row.ours = summary(ours_runs);
    if (!fio_runs.empty()) row.anchor = summary(fio_runs);
    ours_runs.clear();
    fio_runs.clear();
    print_row(row);
  }
  std::printf("\ncpu (percent of one core while running):");
  for (const Row& r : rows) {
    if (r.ours_wall <= 0) continue;
    std::printf(" %s ours %.0f%%", r.name.c_str(), 100 * r.ours_cpu / r.ours_wall);
    if (r.anchor_wall > 0) std::printf(" fio %.0f%%", 100 * r.anchor_cpu / r.anchor_wall);
    std::printf(";");
  }
  std::printf("\n");
  engine->synchronize();
  const io::IOStats s = engine->stats();
  std::printf(
      "\nours: %lld requests, %lld short transfers resubmitted, %lld retries, max %lld in "
      "flight, %lld fixed-buffer transfers, %lld blocks verified, %lld failed, %lld io_uring_enter "
      "calls (%lld waiting)\n",
      static_cast<long long>(s.requests), static_cast<long long>(s.short_transfers),
      static_cast<long long>(s.retries), static_cast<long long>(s.max_in_flight),
      static_cast<long long>(s.fixed_buffer_ios), static_cast<long long>(s.blocks_verified),
      static_cast<long long>(s.failed), static_cast<long long>(s.kernel_calls),
      static_cast<long long>(s.kernel_waits));

  if (!o.json_path.empty()) {
    json::Value out = json::Value::array();
    for (const Row& r : rows) {
      if (r.ours_wall <= 0) continue;
      json::Value v = json::Value::object();
      v.set("name", r.name).set("shape", r.shape).set("threads", 1).set("ours", r.ours);
      v.set("anchor", r.anchor ? json::Value(*r.anchor) : json::Value(nullptr));
      v.set("unit", r.unit);
      v.set("ratio", r.anchor ? json::Value(r.ours / *r.anchor) : json::Value(nullptr));
      out.push_back(std::move(v));
    }
    std::ofstream file(o.json_path);
    file << json::dump(out, 2) << "\n";
    MAMMOTH_CHECK(file.good()) << "[bench io] cannot write --json " << o.json_path;
  }
  engine->close(f);
  return 0;
}

}  // namespace mammoth::tools
