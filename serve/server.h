// `mammoth serve`'s HTTP front: the OpenAI API over a Scheduler, with Debian's cpp-httplib.
//
//   GET  /health               200 {"status":"ok"}
//   GET  /v1/models            the one model served
//   POST /v1/completions       prompt (string or token ids), max_tokens, temperature, top_p,
//                              top_k, stop, seed, stream (server-sent events), stream_options
//   POST /v1/chat/completions  messages through the model's chat template (when it has one)
//   GET  /metrics              Prometheus text: requests, tokens, tokens/s, time to first
//                              token, queue depth, KV blocks used / total
//
// Every refusal is OpenAI's error object {"error": {"message", "type", "param", "code"}} with a
// 4xx status; the server keeps serving. Each HTTP request runs on its own worker thread, which
// submits to the scheduler and turns the tokens it samples into text; a stop string or a client
// that goes away cancels the sequence, which frees its KV blocks at the next step.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/data/chat_template.h"
#include "engine/data/tokenizer.h"
#include "serve/request.h"
#include "serve/scheduler.h"

namespace httplib {
class Server;
}

namespace mammoth::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;            // 0: any free port (bind() returns it)
  std::string model_name;  // the id clients name in "model"
  int threads = 64;        // HTTP worker threads: open connections, streaming ones included
  ChatRenderer chat;       // empty: /v1/chat/completions is refused, saying why
  std::string chat_missing_reason;
};

class Server {
 public:
  Server(Scheduler* scheduler, const data::Tokenizer* tokenizer, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; returns the port (the one chosen when options.port is 0).
  int bind();
  // Serves until stop(); call after bind().
  void run();
  // From any thread: stops accepting and returns from run().
  void stop();

 private:
  void routes();
  Scheduler* scheduler_;
  const data::Tokenizer* tokenizer_;
  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<int64_t> next_id_{0};
  std::atomic<int64_t> http_requests_{0}, http_errors_{0};
};

}  // namespace mammoth::serve
