#include "tools/bench/offload_bench.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "base/error.h"
#include "base/json.h"
#include "base/thread_pool.h"
#include "engine/data/token_shard.h"
#include "engine/offload/offload.h"
#include "engine/train/trainer.h"
#include "models/registry.h"
#include "tools/bench/io_bench.h"
#include "tools/default_corpus.h"

namespace mammoth::tools {
namespace {

struct Options {
  std::string model = "gpt2-tiny";
  int64_t steps = 8;
  int64_t micro_batch = 8;
  int64_t grad_accum = 1;  // micro-batches per step
  int64_t seq_len = 64;
  // none | host | nvme: the AdamW states' home; all_nvme: parameters, gradients and states on
  // NVMe. "MODE@F" gives that mode its own device budget fraction (0: no budget).
  std::vector<std::string> modes = {"none", "host", "nvme"};
  double budget_fraction = 0.25;
  // With an NVMe mode: `bench io`'s fio sequential rows on the same directory, this size.
  std::string io_size = "256M";
  double chunk_mb = 0.5;
  std::string nvme_dir;
  int64_t host_mem = 0;    // --host-mem: the offloaded rows' host budget (0: unlimited)
  bool no_anchor = false;  // --no-anchor: skip the in-memory run, as a model beyond RAM does
  int threads = 0;
  // Rounds: each runs the in-memory anchor and every offloaded mode once, in an order that
  // rotates by round; every configuration keeps its fastest round (the same rule for all), so
  // a drifting or bursty machine cannot favour one side.
  int rounds = 3;
  std::string json_path;
};

struct RunResult {
  std::vector<double> losses;
  double step_s = 0;  // median over steps after the first
  int64_t state_bytes = 0;
  std::string report;
  // NVMe bytes read and written per timed step (steps after the first, from the metrics' chunk
  // accounting at each step's end: neither the initial placement nor the traced step counts),
  // and the mean of those steps' times.
  double nvme_read_per_step = 0;
  double nvme_write_per_step = 0;
  double mean_step_s = 0;
  double nvme_stall_s = 0;  // time the steps waited for NVMe-homed chunks
  double run_s = 0;         // wall time of the whole run, every step (the stall's span)
};

// "all_nvme@0.125" -> {"all_nvme", 0.125}; no '@': the default fraction.
std::pair<std::string, double> mode_spec(const std::string& text, double fraction) {
  const size_t at = text.find('@');
  if (at == std::string::npos) return {text, fraction};
  double f = -1;
  try {
    f = std::stod(text.substr(at + 1));
  } catch (const std::exception&) {
  }
  MAMMOTH_CHECK(f >= 0 && f <= 1) << "[bench offload] --modes " << text
                                  << ": the budget fraction after '@' must be in [0, 1]";
  return {text.substr(0, at), f};
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i], value;
    MAMMOTH_CHECK(name.rfind("--", 0) == 0)
        << "[bench offload] unexpected argument '" << name << "'";
    name = name.substr(2);
    if (name == "no-anchor") {
      o.no_anchor = true;
      continue;
    }
    if (name == "help") {
      std::printf(
          "mammoth bench offload [--model gpt2-tiny] [--steps 8] [--micro-batch 8] [--grad-accum "
          "1]\n"
          "    [--seq-len 64]\n"
          "    [--modes none,host,nvme,all_nvme[@FRACTION]] [--budget-fraction 0.25]\n"
          "    [--chunk-mb 0.5] [--nvme-dir DIR] [--host-mem 0] [--io-size 256M] [--threads 0]\n"
          "    [--rounds 3] [--no-anchor] [--json FILE]\n");
      std::exit(0);
    }
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      MAMMOTH_CHECK(i + 1 < args.size()) << "[bench offload] --" << name << " needs a value";
      value = args[++i];
    }
    auto number = [&](double lo) {
      double v = 0;
      try {
        v = std::stod(value);
      } catch (const std::exception&) {
        v = lo - 1;
      }
      MAMMOTH_CHECK(v >= lo) << "[bench offload] --" << name << " must be a number >= " << lo
                             << ", got '" << value << "'";
      return v;
    };
    if (name == "model") {
      o.model = value;
    } else if (name == "steps") {
      o.steps = static_cast<int64_t>(number(3));
    } else if (name == "micro-batch") {
      o.micro_batch = static_cast<int64_t>(number(1));
    } else if (name == "grad-accum") {
      o.grad_accum = static_cast<int64_t>(number(1));
    } else if (name == "seq-len") {
      o.seq_len = static_cast<int64_t>(number(1));
    } else if (name == "modes") {
      o.modes = split(value);
      for (const std::string& m : o.modes) {
        const std::string name = mode_spec(m, 0).first;
        if (name != "all_nvme") engine::offload::parse_mode(name);
      }
    } else if (name == "budget-fraction") {
      o.budget_fraction = number(0);
      MAMMOTH_CHECK(o.budget_fraction > 0 && o.budget_fraction <= 1)
          << "[bench offload] --budget-fraction must be in (0, 1], got " << value;
    } else if (name == "chunk-mb") {
      o.chunk_mb = number(0);
    } else if (name == "nvme-dir") {
      o.nvme_dir = value;
    } else if (name == "threads") {
      o.threads = static_cast<int>(number(0));
    } else if (name == "rounds") {
      o.rounds = static_cast<int>(number(1));
    } else if (name == "json") {
      o.json_path = value;
    } else if (name == "io-size") {
      o.io_size = value;
    } else if (name == "host-mem") {
      o.host_mem = memory::chunks::parse_bytes(value, "--host-mem");
    } else {
      MAMMOTH_THROW()
          << "[bench offload] unknown option --" << name
          << " (known: --model --steps --micro-batch --grad-accum --seq-len --modes "
             "--budget-fraction --chunk-mb --nvme-dir --host-mem --io-size --threads --rounds "
             "--no-anchor --json)";
    }
  }
  return o;
}

std::shared_ptr<models::LanguageModel> make_model(const Options& o) {
  models::ModelOptions mo;
  mo.max_seq = o.seq_len;
  mo.seed = 1;
  mo.fresh_init = true;  // a speed bench: a model directory's config is enough, weights unread
  return models::create_language_model(o.model, mo);
}

// offload null: the plain loop.
RunResult run(const Options& o, const std::string& data_path, const std::string& dir,
              const engine::offload::OffloadOptions* offload) {
  auto model = make_model(o);
  const auto data = data::TokenDataset::open(data_path);
  engine::train::TrainOptions t;
  t.steps = o.steps;
  t.micro_batch = o.micro_batch;
  t.grad_accum = o.grad_accum;
  t.seq_len = o.seq_len;
  t.warmup = 2;
  t.eval_every = 0;
  t.quiet = true;
  t.seed = 7;
  t.metrics_path = dir + "/metrics.jsonl";
  std::unique_ptr<engine::offload::Offload> off;
  RunResult r;
  if (offload) {
    off = std::make_unique<engine::offload::Offload>(model->named_parameters(), *offload);
    t.offload = off.get();
    r.state_bytes = off->model_state_bytes();
  }
  const auto t0 = std::chrono::steady_clock::now();
  r.losses =
      engine::train::train(
          *model,
          [&](const engine::Tensor& in, const engine::Tensor& tg) { return model->loss(in, tg); },
          data, data::TokenDataset(), t, json::Value::object())
          .losses;
  r.run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::ifstream in(t.metrics_path);
  std::vector<double> times;
  const double tokens = static_cast<double>(o.micro_batch * o.grad_accum * o.seq_len);
  // The NVMe tier's cumulative bytes read (out of NVMe) and written (into it) at a step's end.
  auto nvme_bytes = [](const json::Value& m) {
    const json::Value* off = m.find("offload");
    if (off == nullptr) return std::pair<double, double>{0, 0};
    const json::Value& n = off->at("nvme");
    return std::pair<double, double>{static_cast<double>(n.at("bytes_out").as_int()),
                                     static_cast<double>(n.at("bytes_in").as_int())};
  };
  std::pair<double, double> after_first{0, 0}, after_last{0, 0};
  for (std::string line; std::getline(in, line);) {
    const json::Value m = json::parse(line, "metrics line");
    if (m.at("step").as_int() <= 1) {  // the first step records the trace
      after_first = nvme_bytes(m);
      continue;
    }
    times.push_back(tokens / m.at("tokens_per_s").as_double());
    after_last = nvme_bytes(m);
  }
  MAMMOTH_CHECK(!times.empty()) << "[bench offload] no timed steps";
  const double timed = static_cast<double>(times.size());
  r.nvme_read_per_step = (after_last.first - after_first.first) / timed;
  r.nvme_write_per_step = (after_last.second - after_first.second) / timed;
  for (double t : times) r.mean_step_s += t / timed;
  std::sort(times.begin(), times.end());
  r.step_s = times[times.size() / 2];
  if (off) {
    r.report = off->report();
    for (const memory::chunks::Tier t :
         {memory::chunks::Tier::kDevice, memory::chunks::Tier::kHost})
      r.nvme_stall_s += off->manager().stats(t).stall_s;
    off.reset();
  }
  return r;
}

}  // namespace

int run_offload_bench(const std::vector<std::string>& args) {
  const Options o = parse(args);
  if (o.threads > 0) set_num_threads(o.threads);
  std::string tmpl = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : "/tmp") +
                     "/mammoth_offload_bench_XXXXXX";
  MAMMOTH_CHECK(::mkdtemp(tmpl.data()) != nullptr)
      << "[bench offload] cannot create a temporary directory " << tmpl;
  const std::string dir = tmpl;
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  } cleanup{dir};
  // The embedded corpus: the step time does not depend on what is learned, but a run without
  // the in-memory anchor shows it learns by its falling loss, which random tokens would not.
  const data::BuildShardsResult corpus = default_corpus();
  const std::string data_path = corpus.train_shards.front();
  int64_t state_bytes = 0;
  {
    auto m = make_model(o);
    MAMMOTH_CHECK(m->config().vocab_size >= corpus.vocab_size)
        << "[bench offload] --model " << o.model << " has " << m->config().vocab_size
        << " token ids, fewer than the " << corpus.vocab_size << " of the embedded corpus";
    state_bytes = engine::offload::model_state_bytes(m->named_parameters());
  }
  // A model state the machine cannot hold (90% of its RAM, leaving room for activations and
  // the system) has no in-memory run to compare with: the rows then check the loss falls.
  const int64_t ram = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGESIZE);
  const bool fits = static_cast<double>(state_bytes) < 0.9 * static_cast<double>(ram);
  const bool anchor = fits && !o.no_anchor;
  if (!fits) {
    std::printf(
        "bench offload: %s's model state (parameters + gradients + AdamW states) is %s, more "
        "than 90%% of this machine's %s of RAM: no in-memory run; each row must show its loss "
        "falling instead\n",
        o.model.c_str(), memory::chunks::short_bytes(state_bytes).c_str(),
        memory::chunks::short_bytes(ram).c_str());
    std::fflush(stdout);
  }

  // Configuration 0 is the in-memory anchor, then one per offload mode.
  std::vector<engine::offload::OffloadOptions> configs(o.modes.size());
  bool any_nvme = false;
  for (size_t i = 0; i < o.modes.size(); ++i) {
    engine::offload::OffloadOptions& oo = configs[i];
    const auto [mode, fraction] = mode_spec(o.modes[i], o.budget_fraction);
    oo.mode = engine::offload::parse_mode(mode == "all_nvme" ? "nvme" : mode);
    if (mode == "all_nvme") oo.params = engine::offload::Mode::kNvme;
    any_nvme = any_nvme || oo.mode == engine::offload::Mode::kNvme;
    oo.chunk_bytes = static_cast<int64_t>(o.chunk_mb * 1048576.0);
    oo.nvme_dir = o.nvme_dir.empty() ? dir : o.nvme_dir;
    oo.host_mem = o.host_mem;
    oo.device_mem = static_cast<int64_t>(static_cast<double>(state_bytes) * fraction);
  }
  // fio's sequential figures on the same directory, in this run (what paging is held to).
  double fio_read = 0, fio_write = 0;
  if (any_nvme) {
    const std::string io_json = dir + "/io.json";
    run_io_bench({"--dir", o.nvme_dir.empty() ? dir : o.nvme_dir, "--size", o.io_size, "--only",
                  "seq_write,seq_read", "--json", io_json});
    for (const json::Value& row : json::parse_file(io_json)) {
      const std::string name = row.at("name").as_string();
      const json::Value* fio = row.find("anchor");
      if (fio == nullptr || !fio->is_number()) continue;  // fio missing: no figure
      if (name.rfind("seq_read", 0) == 0) fio_read = fio->as_double();
      if (name.rfind("seq_write", 0) == 0) fio_write = fio->as_double();
    }
  }
  const size_t n = configs.size() + 1;
  std::vector<RunResult> best(n);
  std::vector<std::vector<double>> per_round(n);
  std::vector<bool> identical(n, true);
  std::vector<double> reference;  // the losses of the first in-memory run
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t k = 0; k < n; ++k) {
      const size_t c = (k + static_cast<size_t>(round)) % n;
      if (c == 0 && !anchor) continue;
      RunResult r = run(o, data_path, dir, c == 0 ? nullptr : &configs[c - 1]);
      per_round[c].push_back(r.step_s);
      if (c == 0 && reference.empty()) reference = r.losses;
      // Offloaded runs are compared once the reference exists (round 0 runs the anchor first).
      if (!reference.empty()) identical[c] = identical[c] && r.losses == reference;
      if (per_round[c].size() == 1 || r.step_s < best[c].step_s) best[c] = std::move(r);
    }
  }
  MAMMOTH_CHECK(identical[0]) << "[bench offload] the in-memory run is not deterministic; "
                                 "identical-loss checks are void";
  // Without the anchor, `identical` holds whether each row's loss fell (its fastest run's).
  for (size_t c = 1; c < n && !anchor; ++c) {
    identical[c] = best[c].losses.back() < best[c].losses.front();
  }
  const RunResult& base = best[0];
  std::printf(
      "bench offload: %s, %lld x %lld x %lld (micro-batch x accumulation x sequence) "
      "tokens/step, %lld steps, %d threads, best of %d rounds per configuration (median step "
      "of each run)\n",
      o.model.c_str(), static_cast<long long>(o.micro_batch), static_cast<long long>(o.grad_accum),
      static_cast<long long>(o.seq_len), static_cast<long long>(o.steps), num_threads(), o.rounds);
  std::printf("%-24s %12s %12s %12s %12s %7s %18s %16s %8s %7s %8s\n", "name", "model state",
              "device-mem", "offloaded s", "in-memory s", "ratio",
              anchor ? "identical" : "loss falls", "NVMe MB/step r+w", "GB/s", "x fio", "stall %");
  auto rounds_text = [&](size_t c) {
    std::string t;
    for (double v : per_round[c]) t += (t.empty() ? "" : " ") + std::to_string(v).substr(0, 6);
    return t;
  };
  json::Value rows = json::Value::array();
  bool all_identical = true;
  for (size_t i = 0; i < configs.size(); ++i) {
    const RunResult& r = best[i + 1];
    const engine::offload::OffloadOptions& oo = configs[i];
    all_identical = all_identical && identical[i + 1];
    const double ratio = anchor ? base.step_s / r.step_s : 0;
    // NVMe traffic per timed step and its rate over those steps. "x fio": the time fio's
    // sequential rates need for that step's reads and writes, over the step's time (1: the step
    // pages as fast as fio streams; the target is 0.8). The stall is the part of the whole
    // run spent waiting for chunks (the first step's demand loads included, so it is measured
    // over the same span).
    const double per_step = r.nvme_read_per_step + r.nvme_write_per_step;
    const double mean_s = std::max(r.mean_step_s, 1e-9);
    const double rate = per_step / mean_s / 1e9;
    const double of_fio =
        fio_read > 0 && fio_write > 0
            ? (r.nvme_read_per_step / 1e9 / fio_read + r.nvme_write_per_step / 1e9 / fio_write) /
                  mean_s
            : -1;
    char fio_text[16] = "-";
    if (per_step > 0 && of_fio >= 0) std::snprintf(fio_text, sizeof(fio_text), "%.2f", of_fio);
    const double stall = 100.0 * r.nvme_stall_s / std::max(r.run_s, 1e-9);
    char base_text[32] = "-", ratio_text[32] = "-", check_text[48];
    if (anchor) {
      std::snprintf(base_text, sizeof(base_text), "%.4f", base.step_s);
      std::snprintf(ratio_text, sizeof(ratio_text), "%.2f", ratio);
      std::snprintf(check_text, sizeof(check_text), "%s", identical[i + 1] ? "yes" : "NO");
    } else {
      std::snprintf(check_text, sizeof(check_text), "%s %.3f->%.3f",
                    identical[i + 1] ? "yes" : "NO", r.losses.front(), r.losses.back());
    }
    std::printf("%-24s %12s %12s %12.4f %12s %7s %18s %16.1f %8.3f %7s %8.1f\n",
                ("offload_" + o.modes[i]).c_str(),
                memory::chunks::short_bytes(r.state_bytes).c_str(),
                memory::chunks::short_bytes(oo.device_mem).c_str(), r.step_s, base_text, ratio_text,
                check_text, per_step / 1e6, rate, fio_text, stall);
    std::fprintf(stderr, "%s", r.report.c_str());
    json::Value v = json::Value::object();
    v.set("name", json::Value("offload_" + o.modes[i]));
    v.set("shape", json::Value(o.model + " " + std::to_string(o.micro_batch) + "x" +
                               (o.grad_accum > 1 ? std::to_string(o.grad_accum) + "x" : "") +
                               std::to_string(o.seq_len)));
    v.set("threads", json::Value(static_cast<int64_t>(num_threads())));
    v.set("ours", json::Value(r.step_s));
    v.set("anchor", anchor ? json::Value(base.step_s) : json::Value());
    v.set("unit", json::Value("s/step"));
    v.set("ratio", anchor ? json::Value(ratio) : json::Value());
    v.set("device_mem", json::Value(oo.device_mem));
    v.set("host_mem", json::Value(oo.host_mem));
    v.set("model_state", json::Value(r.state_bytes));
    v.set(anchor ? "identical" : "loss_falls", json::Value(static_cast<bool>(identical[i + 1])));
    v.set("loss_first", json::Value(r.losses.front()));
    v.set("loss_last", json::Value(r.losses.back()));
    v.set("nvme_bytes_per_step", json::Value(per_step));
    v.set("nvme_read_bytes_per_step", json::Value(r.nvme_read_per_step));
    v.set("nvme_write_bytes_per_step", json::Value(r.nvme_write_per_step));
    v.set("nvme_gb_per_s", json::Value(rate));
    v.set("nvme_of_fio", of_fio >= 0 && per_step > 0 ? json::Value(of_fio) : json::Value());
    v.set("stall_percent", json::Value(stall));
    rows.push_back(v);
  }
  std::printf("s/step per round: in-memory %s", anchor ? rounds_text(0).c_str() : "-");
  for (size_t i = 0; i < configs.size(); ++i) {
    std::printf("; %s %s", o.modes[i].c_str(), rounds_text(i + 1).c_str());
  }
  std::printf("\n");
  if (any_nvme) {
    std::printf(
        "fio on the same directory, this run: sequential read %.3f GB/s, write %.3f GB/s "
        "(NVMe figures above: bytes read + written per step after the first, over those "
        "steps' mean time)\n",
        fio_read, fio_write);
  }
  if (!o.json_path.empty()) {
    std::ofstream file(o.json_path);
    file << json::dump(rows, 2) << "\n";
    MAMMOTH_CHECK(file.good()) << "[bench offload] cannot write --json " << o.json_path;
  }
  return all_identical ? 0 : 1;
}

}  // namespace mammoth::tools
