#include "tools/bench/serve_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/error.h"
#include "base/json.h"
#include "base/thread_pool.h"
#include "models/registry.h"
#include "serve/scheduler.h"

namespace mammoth::tools {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string model = "gpt2";
  std::vector<int64_t> concurrency = {1, 8, 32};
  int64_t max_tokens = 32;
  int threads = 0;
  std::string json_path, python, script;
  bool hf = true;
};

int64_t positive(const std::string& flag, const std::string& v) {
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MAMMOTH_CHECK(used == v.size() && n > 0)
      << "[bench serve] " << flag << " needs a positive integer, got '" << v << "'";
  return n;
}

Options parse(const std::vector<std::string>& args) {
  Options o;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "--no-hf") {
      o.hf = false;
      continue;
    }
    if (flag == "--quick") {  // a smoke run: the tiny model, small loads
      o.model = "gpt2-tiny";
      o.concurrency = {1, 4};
      o.max_tokens = 8;
      continue;
    }
    MAMMOTH_CHECK(i + 1 < args.size()) << "[bench serve] " << flag << " needs a value";
    const std::string& value = args[++i];
    if (flag == "--model") {
      o.model = value;
    } else if (flag == "--concurrency") {
      o.concurrency.clear();
      std::stringstream ss(value);
      for (std::string c; std::getline(ss, c, ',');) o.concurrency.push_back(positive(flag, c));
      MAMMOTH_CHECK(!o.concurrency.empty()) << "[bench serve] --concurrency is empty";
    } else if (flag == "--max-tokens") {
      o.max_tokens = positive(flag, value);
    } else if (flag == "--threads") {
      o.threads = static_cast<int>(positive(flag, value));
    } else if (flag == "--json") {
      o.json_path = value;
    } else if (flag == "--python") {
      o.python = value;
    } else if (flag == "--hf-script") {
      o.script = value;
    } else {
      MAMMOTH_THROW() << "[bench serve] unknown option '" << flag
                      << "' (known: --model --concurrency --max-tokens --threads --json --python "
                         "--hf-script --no-hf --quick)";
    }
  }
  return o;
}

// The fixed mix: prompt lengths 32, 64, 96, 128 in turn (at most `longest`), ids from a fixed
// LCG.
std::vector<std::vector<int64_t>> request_mix(int64_t n, int64_t vocab, int64_t longest) {
  std::vector<std::vector<int64_t>> prompts;
  uint64_t state = 12345;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<int64_t> p(static_cast<size_t>(std::min(32 + 32 * (i % 4), longest)));
    for (int64_t& t : p) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      t = static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(vocab));
    }
    prompts.push_back(std::move(p));
  }
  return prompts;
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

struct Result {
  double tokens_per_s = 0, ttft_p50_ms = 0, ttft_p99_ms = 0;
  std::vector<std::vector<int64_t>> outputs;
};

Result bench_ours(std::shared_ptr<models::LanguageModel> model,
                  const std::vector<std::vector<int64_t>>& prompts, int64_t concurrency,
                  int64_t max_tokens) {
  serve::SchedulerOptions so;
  so.block_size = 16;
  so.max_running = concurrency;
  so.max_step_tokens = 256;
  const int64_t longest = 128 + max_tokens;
  so.kv_blocks = concurrency * ((longest + so.block_size - 1) / so.block_size) + 1;
  serve::Scheduler scheduler(model, so);
  const models::GenerateOptions gen{.max_new_tokens = max_tokens, .temperature = 0.0};
  {  // warm-up: first-touch of the pool and the kernels' buffers
    auto r = std::make_shared<serve::Request>(prompts[0], gen);
    scheduler.submit(r);
    std::vector<int64_t> t;
    while (r->wait(&t)) {
    }
  }
  const size_t n = prompts.size();
  Result res;
  res.outputs.resize(n);
  std::vector<double> ttft(n);
  std::atomic<size_t> next{0};
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> clients;
  for (int64_t c = 0; c < concurrency; ++c) {
    clients.emplace_back([&] {
      for (size_t i = next++; i < n; i = next++) {
        const Clock::time_point start = Clock::now();
        auto r = std::make_shared<serve::Request>(prompts[i], gen);
        scheduler.submit(r);
        std::vector<int64_t>& out = res.outputs[i];
        bool more = true;
        while (more && out.empty()) more = r->wait(&out);
        ttft[i] = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
        while (more) more = r->wait(&out);
      }
    });
  }
  for (std::thread& t : clients) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  int64_t tokens = 0;
  for (const auto& out : res.outputs) tokens += static_cast<int64_t>(out.size());
  res.tokens_per_s = static_cast<double>(tokens) / wall;
  res.ttft_p50_ms = quantile(ttft, 0.5);
  res.ttft_p99_ms = quantile(ttft, 0.99);
  return res;
}

// tools/bench/serve_bench.py: --hf-script, else from the working directory (the repo root),
// else from the binary's Bazel runfiles.
std::string hf_script(const Options& o) {
  if (!o.script.empty()) return o.script;
  const std::string rel = "tools/bench/serve_bench.py";
  if (fs::exists(rel)) return rel;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const std::string runfiles = exe.string() + ".runfiles/mammoth/" + rel;
  if (!ec && fs::exists(runfiles)) return runfiles;
  MAMMOTH_THROW() << "[bench serve] cannot find " << rel
                  << "; run from the repo root, pass --hf-script PATH, or --no-hf";
}

Result bench_hf(const Options& o, const std::string& python, const std::string& script,
                const std::string& dir, const std::string& requests, int64_t concurrency) {
  // The anchor writes its result to a file: its stdout and stderr stay the user's to read.
  const std::string result = dir + "/anchor.json";
  std::ostringstream cmd;
  cmd << "'" << python << "' '" << script << "' --model-dir '" << dir << "' --requests '"
      << requests << "' --concurrency " << concurrency << " --max-tokens " << o.max_tokens
      << " --threads " << num_threads() << " --out '" << result << "'";
  const int rc = std::system(cmd.str().c_str());
  MAMMOTH_CHECK(rc == 0) << "[bench serve] the transformers anchor failed (status " << rc
                         << "): " << cmd.str();
  const json::Value v = json::parse_file(result);
  Result r;
  r.tokens_per_s = v.at("tokens_per_s").as_double();
  r.ttft_p50_ms = v.at("ttft_p50_ms").as_double();
  r.ttft_p99_ms = v.at("ttft_p99_ms").as_double();
  for (const json::Value& row : v.at("outputs")) {
    std::vector<int64_t> ids;
    for (const json::Value& t : row) ids.push_back(t.as_int());
    r.outputs.push_back(std::move(ids));
  }
  return r;
}

}  // namespace

int run_serve_bench(const std::vector<std::string>& args) {
  const Options o = parse(args);
  set_num_threads(o.threads);
  std::string python = o.python;
  if (python.empty()) {
    // transformers lives in the project venv (tools/setup.sh), not in Debian's python3.
    const char* env = std::getenv("MAMMOTH_PYTHON");
    const char* home = std::getenv("HOME");
    const std::string venv = std::string(home ? home : "") + "/.cache/mammoth/venv/bin/python";
    python = env && *env ? env : fs::exists(venv) ? venv : "/usr/bin/python3";
  }
  const std::string script = o.hf ? hf_script(o) : "";
  auto model = models::create_language_model(o.model, {.seed = 1});
  const models::ModelConfig& c = model->config();
  MAMMOTH_CHECK(c.max_seq > o.max_tokens)
      << "[bench serve] --max-tokens " << o.max_tokens << " leaves no room for a prompt in "
      << o.model << "'s context of " << c.max_seq;
  const fs::path dir =
      fs::temp_directory_path() / ("mammoth-bench-serve-" + std::to_string(getpid()));
  if (o.hf) models::save_pretrained(*model, dir.string());

  std::printf(
      "serving %s (random init), prompts 32..128 tokens, %lld new tokens each (greedy, eos "
      "ignored), %d threads; anchor: transformers generate, static batches (%s)\n",
      o.model.c_str(), static_cast<long long>(o.max_tokens), num_threads(),
      o.hf ? python.c_str() : "skipped");
  std::printf("%5s %5s %10s %10s %7s %12s %12s %12s %12s %9s\n", "conc", "reqs", "ours tok/s",
              "hf tok/s", "ratio", "ours p50 ms", "ours p99 ms", "hf p50 ms", "hf p99 ms",
              "same ids");
  json::Value rows = json::Value::array();
  for (int64_t conc : o.concurrency) {
    const auto prompts =
        request_mix(std::max<int64_t>(4, 2 * conc), c.vocab_size, c.max_seq - o.max_tokens);
    const Result ours = bench_ours(model, prompts, conc, o.max_tokens);
    Result hf;
    int64_t same = 0;
    if (o.hf) {
      const std::string req_path = (dir / "requests.json").string();
      json::Value req = json::Value::array();
      for (const auto& p : prompts) {
        json::Value ids = json::Value::array();
        for (int64_t t : p) ids.push_back(t);
        req.push_back(ids);
      }
      std::ofstream(req_path) << json::dump(req);
      hf = bench_hf(o, python, script, dir.string(), req_path, conc);
      for (size_t i = 0; i < prompts.size() && i < hf.outputs.size(); ++i) {
        same += ours.outputs[i] == hf.outputs[i];
      }
    }
    const double ratio = o.hf ? ours.tokens_per_s / hf.tokens_per_s : 0.0;
    std::printf("%5lld %5zu %10.1f %10.1f %7.2f %12.1f %12.1f %12.1f %12.1f %5lld/%zu\n",
                static_cast<long long>(conc), prompts.size(), ours.tokens_per_s, hf.tokens_per_s,
                ratio, ours.ttft_p50_ms, ours.ttft_p99_ms, hf.ttft_p50_ms, hf.ttft_p99_ms,
                static_cast<long long>(same), prompts.size());
    std::fflush(stdout);
    json::Value row = json::Value::object()
                          .set("name", "serve_" + o.model + "_c" + std::to_string(conc))
                          .set("concurrency", conc)
                          .set("requests", static_cast<int64_t>(prompts.size()))
                          .set("max_tokens", o.max_tokens)
                          .set("threads", num_threads())
                          .set("ours", ours.tokens_per_s)
                          .set("unit", "tokens/s")
                          .set("ttft_p50_ms", ours.ttft_p50_ms)
                          .set("ttft_p99_ms", ours.ttft_p99_ms);
    if (o.hf) {
      row.set("anchor", hf.tokens_per_s)
          .set("ratio", ratio)
          .set("anchor_ttft_p50_ms", hf.ttft_p50_ms)
          .set("anchor_ttft_p99_ms", hf.ttft_p99_ms)
          .set("same_greedy_ids", same);
    }
    rows.push_back(row);
  }
  if (o.hf) fs::remove_all(dir);
  if (!o.json_path.empty()) std::ofstream(o.json_path) << json::dump(rows, 1) << "\n";
  return 0;
}

}  // namespace mammoth::tools
