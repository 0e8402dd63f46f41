#include "serve/server.h"

#include <dirent.h>
#include <httplib.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>
#include <sstream>

#include "base/error.h"
#include "base/json.h"

namespace mammoth::serve {

namespace {

// The numeric host and port of a socket address, as cpp-httplib fills Request::remote_addr.
bool numeric_address(const sockaddr_storage& a, socklen_t len, std::string* host, int* port) {
  char h[NI_MAXHOST], p[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, p, sizeof p,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  *host = h;
  *port = std::atoi(p);
  return true;
}

// The descriptor of the connection `req` arrived on, or -1. cpp-httplib 0.11 (Debian's) gives
// a handler no socket and no is_connection_closed(), so the connection is found by its two
// endpoints; it stays open, on the same descriptor, until the handler returns.
int connection_socket(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    const int fd = std::atoi(e->d_name);
    sockaddr_storage a{};
    socklen_t len = sizeof a;
    std::string host;
    int port = -1;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
        !numeric_address(a, len, &host, &port) || port != req.local_port) {
      continue;
    }
    len = sizeof a;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 ||
        !numeric_address(a, len, &host, &port) || port != req.remote_port ||
        host != req.remote_addr) {
      continue;
    }
    found = fd;
    break;
  }
  closedir(dir);
  return found;
}

// Whether the client closed its end: a readable socket with nothing to read has seen the
// peer's FIN (or a reset). Bytes waiting (a pipelined request) mean it is still there.
bool peer_closed(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP)) return true;
  char c;
  return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

[[noreturn]] void refuse(std::string message, std::string param = "", std::string code = "",
                         int status = 400) {
  throw ApiError{status, std::move(message), std::move(param), std::move(code)};
}

int64_t unix_time() { return static_cast<int64_t>(std::time(nullptr)); }

// Everything a completion needs besides its prompt.
struct Sampling {
  models::GenerateOptions gen;
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;
};

// The parsed parameters as the scheduler takes them; `default_max` when the body gave no
// max_tokens.
Sampling sampling_of(const SamplingParams& p, int64_t default_max) {
  Sampling s;
  s.gen.max_new_tokens = p.max_tokens.value_or(default_max);
  s.gen.temperature = p.temperature;
  s.gen.top_p = p.top_p;
  s.gen.top_k = p.top_k;
  s.gen.seed = p.seed ? *p.seed : std::random_device{}();  // unseeded requests differ, as OpenAI's
  s.stop = p.stop;
  s.stream = p.stream;
  s.include_usage = p.include_usage;
  return s;
}

// Turns sampled tokens into the completion's text as they arrive, and finds stop sequences.
// The continuation's text is decode(prompt + new) minus decode(prompt): decoders such as
// SentencePiece's drop or join spaces across tokens, so a token's text depends on what precedes
// it. Text is released only once it can no longer change: a trailing U+FFFD may be the start of
// a character whose other bytes come in the next token, and a tail that begins a stop sequence
// may turn out to be one.
class CompletionText {
 public:
  CompletionText(const data::Tokenizer& tok, const std::vector<int64_t>& prompt,
                 std::vector<std::string> stop)
      : tok_(tok), stop_(std::move(stop)) {
    for (int64_t id : prompt) keep(id);
    base_ = tok_.decode(ids_, true);
  }

  // Adds one token; returns the text it releases. After stopped(), adds nothing.
  std::string add(int64_t id) {
    if (stopped_) return "";
    keep(id);
    ++tokens_;
    return release(false);
  }
  // The rest, once generation has ended.
  std::string finish() { return stopped_ ? "" : release(true); }
  bool stopped() const { return stopped_; }
  // Tokens that made the text (up to and including the one that completed a stop sequence).
  int64_t tokens() const { return tokens_; }
  const std::string& text() const { return released_; }

 private:
  void keep(int64_t id) {
    // A model's vocabulary may be padded past the tokenizer's: such ids have no text.
    if (id < tok_.vocab_size()) ids_.push_back(static_cast<int32_t>(id));
  }

  std::string release(bool last) {
    const std::string full = tok_.decode(ids_, true);
    if (full.compare(0, base_.size(), base_) != 0) return "";  // the prompt's text changed
    std::string text = full.substr(base_.size());
    static constexpr std::string_view kFffd = "\xEF\xBF\xBD";
    size_t ready = text.size();
    while (!last && ready >= kFffd.size() &&
           text.compare(ready - kFffd.size(), kFffd.size(), kFffd) == 0) {
      ready -= kFffd.size();
    }
    size_t cut = std::string::npos;
    for (const std::string& s : stop_) cut = std::min(cut, text.find(s));
    if (cut != std::string::npos && cut <= ready) {
      ready = cut;
      stopped_ = true;
    } else if (!last) {
      // Hold back the longest tail that is a proper prefix of a stop sequence.
      size_t hold = 0;
      for (const std::string& s : stop_) {
        for (size_t k = std::min(s.size() - 1, ready); k > hold; --k) {
          if (text.compare(ready - k, k, s, 0, k) == 0) {
            hold = k;
            break;
          }
        }
      }
      ready -= hold;
    }
    if (ready <= released_.size() || text.compare(0, released_.size(), released_) != 0) return "";
    std::string out = text.substr(released_.size(), ready - released_.size());
    released_ = text.substr(0, ready);
    return out;
  }

  const data::Tokenizer& tok_;
  const std::vector<std::string> stop_;
  std::vector<int32_t> ids_;
  std::string base_, released_;
  int64_t tokens_ = 0;
  bool stopped_ = false;
};

// One accepted completion: the request in the scheduler and its text.
struct Job {
  std::shared_ptr<Request> request;
  std::unique_ptr<CompletionText> text;
  int64_t prompt_tokens = 0;
  std::string finish_reason, error;

  // Waits for tokens and hands each piece of text to `emit` (false: the client is gone, so the
  // sequence is cancelled). `alive` is asked while nothing arrives. Returns false when the
  // client went away.
  bool run(const std::function<bool(const std::string&)>& emit,
           const std::function<bool()>& alive) {
    std::vector<int64_t> tokens;
    size_t seen = 0;
    bool more = true;
    while (more) {
      more = request->wait(&tokens);
      if (tokens.size() == seen && more && !alive()) {
        request->cancel();
        return false;
      }
      for (; seen < tokens.size() && !text->stopped(); ++seen) {
        const std::string piece = text->add(tokens[seen]);
        if (!piece.empty() && !emit(piece)) {
          request->cancel();
          return false;
        }
      }
      if (text->stopped()) {
        request->cancel();  // frees the blocks; tokens past the stop are not the client's
        finish_reason = "stop";
        return true;
      }
    }
    finish_reason = request->finish_reason();
    error = request->error();
    const std::string rest = text->finish();
    if (!rest.empty() && !emit(rest)) return false;
    return true;
  }

  json::Value usage() const {
    return json::Value::object()
        .set("prompt_tokens", prompt_tokens)
        .set("completion_tokens", text->tokens())
        .set("total_tokens", prompt_tokens + text->tokens());
  }
};

void send_json(httplib::Response& res, int status, const json::Value& body) {
  res.status = status;
  res.set_content(json::dump(body), "application/json");
}

std::string sse(const json::Value& v) { return "data: " + json::dump(v) + "\n\n"; }

}  // namespace

Server::Server(Scheduler* scheduler, const data::Tokenizer* tokenizer, ServerOptions options)
    : scheduler_(scheduler),
      tokenizer_(tokenizer),
      options_(std::move(options)),
      http_(std::make_unique<httplib::Server>()) {
  MAMMOTH_CHECK(scheduler_ != nullptr && tokenizer_ != nullptr)
      << "[serve] a scheduler and a tokenizer are required";
  MAMMOTH_CHECK(options_.threads > 0) << "[serve] --http-threads must be positive";
  const int threads = options_.threads;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(size_t{64} << 20);
  routes();
}

Server::~Server() { stop(); }

int Server::bind() {
  int port = options_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(options_.host);
    MAMMOTH_CHECK(port > 0) << "[serve] cannot bind to any port on --host " << options_.host;
  } else {
    MAMMOTH_CHECK(http_->bind_to_port(options_.host, port))
        << "[serve] cannot bind " << options_.host << ":" << port << " (in use? try --port 0)";
  }
  return port;
}

void Server::run() { http_->listen_after_bind(); }

void Server::stop() {
  if (http_ && http_->is_running()) http_->stop();
}

void Server::routes() {
  httplib::Server& h = *http_;
  const std::string& name = options_.model_name;

  // Every handler goes through here: API errors become their JSON, anything else a 500 that
  // still keeps the server up.
  auto guarded = [this](auto handler) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) {
      ++http_requests_;
      try {
        handler(req, res);
      } catch (const ApiError& e) {
        ++http_errors_;
        send_json(res, e.status, error_body(e));
      } catch (const Error& e) {
        ++http_errors_;
        send_json(res, 500, error_body({500, e.message(), "", "", "server_error"}));
      } catch (const std::exception& e) {
        ++http_errors_;
        ApiError err{500, e.what(), "", "", "server_error"};
        send_json(res, 500, error_body(err));
      }
    };
  };

  h.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ++http_errors_;
    ApiError err{res.status, "no route " + req.method + " " + req.path, "", "", ""};
    err.type = res.status == 404 ? "not_found_error" : "invalid_request_error";
    send_json(res, res.status, error_body(err));
  });

  h.Get("/health", guarded([](const httplib::Request&, httplib::Response& res) {
          send_json(res, 200, json::Value::object().set("status", "ok"));
        }));

  h.Get("/v1/models", guarded([name](const httplib::Request&, httplib::Response& res) {
          json::Value model = json::Value::object()
                                  .set("id", name)
                                  .set("object", "model")
                                  .set("created", unix_time())
                                  .set("owned_by", "mammoth");
          send_json(res, 200,
                    json::Value::object()
                        .set("object", "list")
                        .set("data", json::Value::array().push_back(model)));
        }));

  h.Get(
      "/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
        const SchedulerStats s = scheduler_->stats();
        std::ostringstream o;
        struct Metric {
          const char *name, *type, *help;
          double value;
        };
        auto count = [](int64_t v) { return static_cast<double>(v); };
        const Metric metrics[] = {
            {"mammoth_http_requests_total", "counter", "HTTP requests received.",
             count(http_requests_.load())},
            {"mammoth_http_errors_total", "counter", "HTTP requests answered with an error.",
             count(http_errors_.load())},
            {"mammoth_requests_total", "counter", "Generation requests queued.", count(s.requests)},
            {"mammoth_requests_finished_total", "counter",
             "Generation requests ended (any reason).", count(s.finished)},
            {"mammoth_requests_cancelled_total", "counter",
             "Generation requests cancelled (client gone, stop sequence).", count(s.cancelled)},
            {"mammoth_prompt_tokens_total", "counter", "Prompt tokens prefilled.",
             count(s.prompt_tokens)},
            {"mammoth_generated_tokens_total", "counter", "Tokens sampled.",
             count(s.generated_tokens)},
            {"mammoth_scheduler_steps_total", "counter", "Batched model steps.", count(s.steps)},
            {"mammoth_tokens_per_second", "gauge", "Tokens sampled per second, last 5 s.",
             s.tokens_per_second},
            {"mammoth_queue_depth", "gauge", "Requests waiting for admission.", count(s.waiting)},
            {"mammoth_running_sequences", "gauge", "Sequences in the running batch.",
             count(s.running)},
            {"mammoth_kv_blocks_used", "gauge", "KV cache blocks holding positions.",
             count(s.kv_blocks_used)},
            {"mammoth_kv_blocks_total", "gauge", "KV cache blocks in the pool.",
             count(s.kv_blocks_total)},
        };
        for (const Metric& m : metrics) {
          o << "# HELP " << m.name << " " << m.help << "\n# TYPE " << m.name << " " << m.type
            << "\n"
            << m.name << " " << m.value << "\n";
        }
        o << "# HELP mammoth_time_to_first_token_seconds From queueing to the first token.\n"
          << "# TYPE mammoth_time_to_first_token_seconds summary\n"
          << "mammoth_time_to_first_token_seconds{quantile=\"0.5\"} " << s.ttft_p50 << "\n"
          << "mammoth_time_to_first_token_seconds{quantile=\"0.99\"} " << s.ttft_p99 << "\n"
          << "mammoth_time_to_first_token_seconds_sum " << s.ttft_sum << "\n"
          << "mammoth_time_to_first_token_seconds_count " << s.ttft_count << "\n";
        res.set_content(o.str(), "text/plain; version=0.0.4");
      }));

  // Shared by both completion routes: the body as an ApiRequest (serve/request.h), or its error.
  RequestContext ctx{.model_name = name,
                     .vocab_size = scheduler_->config().vocab_size,
                     .chat = options_.chat,
                     .chat_missing_reason = options_.chat_missing_reason};
  auto parse = [ctx](const httplib::Request& req, Endpoint endpoint) {
    auto parsed = parse_request(req.body, endpoint, ctx);
    if (ApiError* e = std::get_if<ApiError>(&parsed)) throw *e;
    return std::get<ApiRequest>(std::move(parsed));
  };

  auto start_job = [this](std::vector<int64_t> prompt, Sampling& s) {
    const models::ModelConfig& c = scheduler_->config();
    const int64_t P = static_cast<int64_t>(prompt.size());
    if (P == 0) refuse("the prompt encodes to no tokens", "prompt");
    if (P + s.gen.max_new_tokens > c.max_seq) {
      refuse("This model's maximum context length is " + std::to_string(c.max_seq) +
                 " tokens, however you requested " + std::to_string(P + s.gen.max_new_tokens) +
                 " tokens (" + std::to_string(P) + " in your prompt; " +
                 std::to_string(s.gen.max_new_tokens) +
                 " for the completion). Please reduce your prompt or completion length.",
             "max_tokens", "context_length_exceeded");
    }
    s.gen.eos_token = tokenizer_->eos_id();
    auto job = std::make_shared<Job>();
    job->prompt_tokens = P;
    job->text = std::make_unique<CompletionText>(*tokenizer_, prompt, s.stop);
    job->request = std::make_shared<Request>(std::move(prompt), s.gen);
    try {
      scheduler_->submit(job->request);
    } catch (const Error& e) {
      refuse(e.message(), "", "request_not_servable");
    }
    return job;
  };

  // Answers a job: one JSON object, or server-sent events ending in [DONE]. `choice` builds a
  // choice from a piece of text and a finish reason (null while streaming).
  auto answer = [](std::shared_ptr<Job> job, const Sampling& s, json::Value head,
                   std::function<json::Value(const std::string&, const json::Value&)> choice,
                   std::function<json::Value()> first, const httplib::Request& req,
                   httplib::Response& res) {
    if (!s.stream) {
      // A client that hangs up while waiting frees its sequence, as a stream's does.
      const int fd = connection_socket(req);
      std::string text;
      auto alive = [fd] { return fd < 0 || !peer_closed(fd); };
      const bool ok = job->run(
          [&](const std::string& piece) {
            text += piece;
            return alive();
          },
          alive);
      if (!ok) return;  // nobody to answer
      if (job->finish_reason == "error") {
        throw ApiError{503, job->error, "", "", "server_error"};
      }
      json::Value body = head;
      body.set("choices", json::Value::array().push_back(choice(text, job->finish_reason)));
      body.set("usage", job->usage());
      send_json(res, 200, body);
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    const bool usage = s.include_usage;
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, head, choice, first, usage](size_t, httplib::DataSink& sink) {
          auto chunk = [&](const json::Value& c) {
            json::Value body = head;
            body.set("choices", json::Value::array().push_back(c));
            if (usage) body.set("usage", json::Value());
            const std::string line = sse(body);
            return sink.write(line.data(), line.size());
          };
          if (first && !chunk(first())) {
            job->request->cancel();
            return false;
          }
          const bool ok =
              job->run([&](const std::string& piece) { return chunk(choice(piece, {})); },
                       [&] { return sink.is_writable(); });
          if (!ok) return false;
          if (job->finish_reason == "error") {
            const std::string line = sse(error_body({500, job->error, "", "", "server_error"}));
            sink.write(line.data(), line.size());
          } else if (!chunk(choice("", job->finish_reason))) {
            return false;
          }
          if (usage) {
            json::Value body = head;
            body.set("choices", json::Value::array());
            body.set("usage", job->usage());
            const std::string line = sse(body);
            if (!sink.write(line.data(), line.size())) return false;
          }
          const std::string done = "data: [DONE]\n\n";
          sink.write(done.data(), done.size());
          sink.done();
          return true;
        },
        // Runs however the response ends: a client that went away mid-stream frees its
        // sequence (cancelling a finished request does nothing).
        [job](bool) { job->request->cancel(); });
  };

  h.Post("/v1/completions", guarded([this, parse, start_job, answer, name](
                                        const httplib::Request& req, httplib::Response& res) {
           ApiRequest r = parse(req, Endpoint::kCompletions);
           std::vector<int64_t> ids = std::move(r.prompt_ids);
           if (r.prompt_is_text) {
             for (int32_t id : tokenizer_->encode(r.prompt_text, true)) ids.push_back(id);
           }
           Sampling s = sampling_of(r.sampling, 16);
           auto job = start_job(std::move(ids), s);
           const json::Value head = json::Value::object()
                                        .set("id", "cmpl-" + std::to_string(++next_id_))
                                        .set("object", "text_completion")
                                        .set("created", unix_time())
                                        .set("model", name);
           answer(
               job, s, head,
               [](const std::string& text, const json::Value& reason) {
                 return json::Value::object()
                     .set("text", text)
                     .set("index", 0)
                     .set("logprobs", json::Value())
                     .set("finish_reason", reason);
               },
               nullptr, req, res);
         }));

  h.Post("/v1/chat/completions", guarded([this, parse, start_job, answer, name](
                                             const httplib::Request& req, httplib::Response& res) {
           const ApiRequest r = parse(req, Endpoint::kChatCompletions);
           // The template writes the special tokens itself (bos included), so none are added.
           std::vector<int64_t> ids;
           for (int32_t id : tokenizer_->encode(r.prompt_text, false)) ids.push_back(id);
           const int64_t P = static_cast<int64_t>(ids.size());
           // Without max_tokens a chat reply may use the rest of the context.
           Sampling s =
               sampling_of(r.sampling, std::max<int64_t>(1, scheduler_->config().max_seq - P));
           auto job = start_job(std::move(ids), s);
           const json::Value head =
               json::Value::object()
                   .set("id", "chatcmpl-" + std::to_string(++next_id_))
                   .set("object", s.stream ? "chat.completion.chunk" : "chat.completion")
                   .set("created", unix_time())
                   .set("model", name);
           const bool stream = s.stream;
           answer(
               job, s, head,
               [stream](const std::string& text, const json::Value& reason) {
                 json::Value c = json::Value::object().set("index", 0);
                 if (stream) {
                   json::Value delta = json::Value::object();
                   if (!text.empty()) delta.set("content", text);
                   c.set("delta", delta);
                 } else {
                   c.set("message",
                         json::Value::object().set("role", "assistant").set("content", text));
                 }
                 return c.set("logprobs", json::Value()).set("finish_reason", reason);
               },
               [] {
                 return json::Value::object()
                     .set("index", 0)
                     .set("delta",
                          json::Value::object().set("role", "assistant").set("content", ""))
                     .set("logprobs", json::Value())
                     .set("finish_reason", json::Value());
               },
               req, res);
         }));
}

}  // namespace mammoth::serve
