// `mammoth serve`: an OpenAI-compatible HTTP server (serve/server.h) over one model, with
// continuous batching and a paged KV cache (serve/scheduler.h).
//   mammoth serve --model DIR [--port 8000] [--host 127.0.0.1] [--kv-blocks 512]
//   mpirun -np N mammoth serve --model DIR --tp N      (tensor-parallel: serve/tp.h)
// --model takes what `mammoth generate` takes (an HF model directory, one of our checkpoints, a
// registered name with --weights); the text goes through the directory's tokenizer (or
// --tokenizer's). --port 0 binds any free port. The line "[serve] listening on
// http://HOST:PORT" goes to stdout once the socket is bound; SIGINT or SIGTERM ends in-flight
// requests and exits 0. Under --tp N rank 0 serves HTTP and leads; the other ranks ignore the
// stop signals (mpirun forwards them to every rank) and exit when rank 0 stops.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "base/error.h"
#include "engine/data/chat_template.h"
#include "engine/data/tokenizer.h"
#include "models/layers.h"
#include "models/policies/policy.h"
#include "models/registry.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/mesh.h"
#include "serve/scheduler.h"
#include "serve/server.h"
#include "serve/tp.h"
#include "tools/command.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, weights);
ABSL_DECLARE_FLAG(std::string, tokenizer);
ABSL_DECLARE_FLAG(int, tp);
ABSL_DECLARE_FLAG(double, comm_timeout);
ABSL_FLAG(std::string, host, "127.0.0.1", "serve: address to listen on");
ABSL_FLAG(int32_t, port, 8000, "serve: TCP port (0: any free port, printed)");
ABSL_FLAG(std::string, served_model_name, "",
          "serve: the model id clients send (default: the --model directory's name)");
ABSL_FLAG(int64_t, kv_blocks, 512, "serve: KV cache blocks in the pool");
ABSL_FLAG(int64_t, kv_block_size, 16, "serve: positions per KV cache block");
ABSL_FLAG(int64_t, max_step_tokens, 256,
          "serve: tokens per batched step (decodes first, then prompt chunks)");
ABSL_FLAG(int64_t, max_running, 64, "serve: sequences in the running batch");
ABSL_FLAG(int32_t, http_threads, 64, "serve: HTTP worker threads (open connections)");

namespace mammoth::tools {

std::shared_ptr<models::LanguageModel> load_language_model(const std::string& name,
                                                           const std::string& weights,
                                                           const char* command);
data::Tokenizer text_tokenizer(int64_t model_vocab, const char* command);

namespace {

// The self-pipe of the stop signals (a signal handler may only write(2)).
int g_stop_pipe[2] = {-1, -1};

void on_stop_signal(int) {
  const char byte = 1;
  [[maybe_unused]] ssize_t n = write(g_stop_pipe[1], &byte, 1);
}

int run_serve(const std::vector<std::string>& args) {
  MAMMOTH_CHECK(args.empty()) << "[serve] unexpected argument '" << args[0] << "'";
  const int tp = absl::GetFlag(FLAGS_tp);
  const int world = parallel::process_info().world_size;
  MAMMOTH_CHECK(tp >= 1 && world == tp)
      << "[serve] --tp " << tp << " needs exactly " << tp << " processes (mpirun -np " << tp
      << " mammoth serve --tp " << tp << "), but the job has " << world
      << "; each rank holds one tensor-parallel shard (no data-parallel replicas)";
  const std::string model_arg = absl::GetFlag(FLAGS_model);
  std::shared_ptr<models::LanguageModel> model =
      load_language_model(model_arg, absl::GetFlag(FLAGS_weights), "serve");
  serve::SchedulerOptions so;
  so.kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  so.block_size = absl::GetFlag(FLAGS_kv_block_size);
  so.max_step_tokens = absl::GetFlag(FLAGS_max_step_tokens);
  so.max_running = absl::GetFlag(FLAGS_max_running);

  // Tensor parallelism: every rank swaps the model for its shard (the family's policy, as
  // `mammoth train --tp` does); rank 0 leads, the others follow its steps.
  std::unique_ptr<parallel::DeviceMesh> mesh;
  std::optional<serve::TpLeader> leader;
  if (tp > 1) {
    parallel::MeshOptions mo;
    mo.comm.timeout_s = absl::GetFlag(FLAGS_comm_timeout);
    mo.device = models::module_device(*model);
    mesh = std::make_unique<parallel::DeviceMesh>(parallel::mpi_world(mo.comm),
                                                  parallel::MeshShape{.tp = tp}, mo);
    std::shared_ptr<models::LanguageModel> sharded = models::apply_policy(*model, *mesh);
    MAMMOTH_CHECK(sharded->supports_paged_kv())
        << "[serve] --tp " << tp << ": model family " << models::family_name(model->config().family)
        << " has no tensor-parallel paged KV cache (GPT-2 and LLaMA have); serve it with --tp 1";
    model = std::move(sharded);
    parallel::Communicator& group = mesh->cpu_group(parallel::Axis::kTp);
    if (group.rank() != 0) {
      signal(SIGINT, SIG_IGN);
      signal(SIGTERM, SIG_IGN);
      MAMMOTH_CHECK(so.kv_blocks > 0 && so.block_size > 0)
          << "[serve] --kv-blocks and --kv-block-size must be positive";
      models::PagedKVCache cache = model->make_paged_cache(so.kv_blocks, so.block_size);
      const serve::FollowStats st = serve::follow_steps(*model, &cache, group);
      std::fprintf(stderr, "[serve] rank %d stopped after %lld steps (%lld tokens)\n", mesh->rank(),
                   static_cast<long long>(st.steps), static_cast<long long>(st.tokens));
      return 0;
    }
    leader.emplace(group);
    so.hook = &*leader;
  }
  // Installed after MPI starts, which has handlers of its own. SIGINT and SIGTERM may arrive on
  // any thread (the kernels' pool predates this command), so
  // the handler only writes a byte to a pipe that one watcher thread reads; a peer that closes
  // mid-write must not kill the process.
  MAMMOTH_CHECK(pipe(g_stop_pipe) == 0) << "[serve] cannot create the shutdown pipe";
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  MAMMOTH_CHECK(sigaction(SIGINT, &sa, nullptr) == 0 && sigaction(SIGTERM, &sa, nullptr) == 0)
      << "[serve] cannot install the SIGINT/SIGTERM handler";
  signal(SIGPIPE, SIG_IGN);

  const data::Tokenizer tok = text_tokenizer(model->config().vocab_size, "serve");

  const models::ModelConfig& c = model->config();
  const double kv_mb = 2.0 * c.n_layer * so.kv_blocks * so.block_size * model->kv_cache_heads() *
                       c.head_dim() * dtype_size(c.dtype) / (1 << 20);
  serve::Scheduler scheduler(model, so);
  std::fprintf(stderr, "[serve] KV pool: %lld blocks of %lld positions (%.1f MiB%s)\n",
               static_cast<long long>(so.kv_blocks), static_cast<long long>(so.block_size), kv_mb,
               tp > 1 ? " per rank" : "");

  serve::ServerOptions o;
  o.host = absl::GetFlag(FLAGS_host);
  o.port = absl::GetFlag(FLAGS_port);
  MAMMOTH_CHECK(o.port >= 0 && o.port < 65536)
      << "[serve] --port must be in [0, 65535], got " << o.port;
  o.threads = absl::GetFlag(FLAGS_http_threads);
  o.model_name = absl::GetFlag(FLAGS_served_model_name);
  if (o.model_name.empty()) {
    std::filesystem::path p(model_arg);
    o.model_name = p.has_filename() ? p.filename().string() : p.parent_path().filename().string();
  }
  // The chat template lives beside the tokenizer (tokenizer_config.json).
  const std::string tok_dir =
      absl::GetFlag(FLAGS_tokenizer).empty() ? model_arg : absl::GetFlag(FLAGS_tokenizer);
  std::optional<data::ChatTemplate> chat;
  try {
    chat.emplace(data::ChatTemplate::from_model_dir(tok_dir));
  } catch (const Error& e) {
    o.chat_missing_reason = "/v1/chat/completions is not available for this model: " + e.message();
    std::fprintf(stderr, "[serve] no chat template: %s\n", e.message().c_str());
  }
  if (chat) {
    o.chat = [&chat](const std::vector<data::ChatMessage>& messages) {
      return chat->render(messages, /*add_generation_prompt=*/true);
    };
  }
  serve::Server server(&scheduler, &tok, o);
  const int port = server.bind();
  std::printf("[serve] listening on http://%s:%d (model '%s', tp %d, pid %d)\n", o.host.c_str(),
              port, o.model_name.c_str(), tp, static_cast<int>(getpid()));
  std::fflush(stdout);

  std::thread watcher([&] {
    char byte = 0;
    while (read(g_stop_pipe[0], &byte, 1) < 0 && errno == EINTR) {
    }
    // Requests end first (their handlers return), then the listener and its workers.
    scheduler.stop();
    server.stop();
  });
  server.run();
  // run() may also return on its own (a socket error): wake the watcher so it can be joined.
  on_stop_signal(0);
  watcher.join();
  std::fprintf(stderr, "[serve] stopped\n");
  return 0;
}

}  // namespace

MAMMOTH_COMMAND(serve, "OpenAI-compatible HTTP server (continuous batching, paged KV cache)",
                run_serve);

}  // namespace mammoth::tools
