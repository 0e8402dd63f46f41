// The OpenAI request bodies `mammoth serve` accepts, parsed without the server: JSON bytes ->
// an ApiRequest (the prompt, or the chat transcript rendered through the model's template, and
// the sampling parameters), or the OpenAI error object the server answers with. Pure: no
// tokenizer, no scheduler, no clock or randomness (an unseeded request says so; the server
// draws its seed), so test/fuzz/request_fuzz.cc drives it directly.
//
//   RequestContext ctx{.model_name = "gpt2", .vocab_size = 50257, .chat = render};
//   auto parsed = parse_request(body, Endpoint::kCompletions, ctx);
//   if (auto* e = std::get_if<ApiError>(&parsed)) ... error_body(*e), e->status ...
//
// Every field we cannot honour is refused by name: unknown keys, batched prompts, n != 1,
// penalties, logit_bias, logprobs, echo, best_of, suffix, content parts.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/json.h"
#include "engine/data/chat_template.h"

namespace mammoth::serve {

// A refusal in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with `status`.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // empty: null
  std::string code;   // empty: null
  std::string type = "invalid_request_error";
};
json::Value error_body(const ApiError& e);

// A chat transcript -> the prompt text (the model's chat template, with the generation prompt).
// May throw mammoth::Error (the template's raise_exception, say): the request is refused.
using ChatRenderer = std::function<std::string(const std::vector<data::ChatMessage>&)>;

enum class Endpoint { kCompletions, kChatCompletions };

// What a parse needs to know about the server.
struct RequestContext {
  std::string model_name;  // the id clients must send in "model"
  int64_t vocab_size = 0;  // token-id prompts lie in [0, vocab_size)
  ChatRenderer chat;       // empty: chat completions are refused with chat_missing_reason
  std::string chat_missing_reason;
};

// The sampling fields shared by both endpoints.
struct SamplingParams {
  // Completions: OpenAI's default 16 when absent. Chat: absent (nullopt) means the rest of the
  // context after the prompt, which only the tokenized prompt tells.
  std::optional<int64_t> max_tokens;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;             // 0: every token
  std::optional<uint64_t> seed;  // absent: the server draws one (unseeded requests differ)
  std::vector<std::string> stop;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

struct ApiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  // Completions: the prompt as text (prompt_is_text: to encode with the tokenizer's special
  // tokens) or as token ids. Chat: prompt_text is the rendered transcript (its special tokens
  // written by the template, so none are added) and `messages` the transcript.
  bool prompt_is_text = false;
  std::string prompt_text;
  std::vector<int64_t> prompt_ids;
  std::vector<data::ChatMessage> messages;
  SamplingParams sampling;
};

// Parses one request body for `endpoint`. Exceptions other than mammoth::Error thrown by
// ctx.chat pass through (the server answers them with a 500).
std::variant<ApiRequest, ApiError> parse_request(std::string_view body, Endpoint endpoint,
                                                 const RequestContext& ctx);

}  // namespace mammoth::serve
