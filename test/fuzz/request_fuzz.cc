// libFuzzer target: `mammoth serve`'s request parser (serve/request.h), which reads every body
// a client sends. The input's first byte picks the endpoint (even: /v1/completions, odd:
// /v1/chat/completions), the rest is the body; chat transcripts go through a real ChatML
// template. Each body must give an ApiRequest that honours what the parser promises, or an
// OpenAI error with a 4xx status and a message whose JSON body round-trips; nothing may escape.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "base/error.h"
#include "base/json.h"
#include "engine/data/chat_template.h"
#include "serve/request.h"
#include "test/fuzz/fuzz_util.h"

namespace serve = mammoth::serve;
using mammoth::fuzz::invariant_failed;

namespace {

constexpr int64_t kVocab = 400;

const serve::RequestContext& context() {
  static const mammoth::data::ChatTemplate* chat = new mammoth::data::ChatTemplate(
      "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
      {.bos = "", .eos = "<|im_end|>", .unk = "", .pad = ""});
  static const serve::RequestContext* ctx =
      new serve::RequestContext{.model_name = "tiny",
                                .vocab_size = kVocab,
                                .chat =
                                    [](const std::vector<mammoth::data::ChatMessage>& m) {
                                      return chat->render(m, /*add_generation_prompt=*/true);
                                    },
                                .chat_missing_reason = ""};
  return *ctx;
}

void check_request(const serve::ApiRequest& r, serve::Endpoint endpoint) {
  if (r.endpoint != endpoint) invariant_failed("request: wrong endpoint");
  const serve::SamplingParams& s = r.sampling;
  if (endpoint == serve::Endpoint::kCompletions) {
    if (!s.max_tokens) invariant_failed("request: a completion without max_tokens");
    if (!r.prompt_is_text) {
      for (int64_t id : r.prompt_ids) {
        if (id < 0 || id >= kVocab) invariant_failed("request: prompt id outside the vocabulary");
      }
    } else if (!r.prompt_ids.empty()) {
      invariant_failed("request: a text prompt with ids");
    }
  } else {
    if (r.messages.empty()) invariant_failed("request: a chat without messages");
    if (r.prompt_text.find("<|im_start|>assistant\n") == std::string::npos) {
      invariant_failed("request: the chat prompt lacks the generation prompt");
    }
  }
  if (s.max_tokens && *s.max_tokens < 1) invariant_failed("request: max_tokens < 1");
  if (!(s.temperature >= 0 && s.temperature <= 2)) invariant_failed("request: temperature");
  if (!(s.top_p > 0 && s.top_p <= 1)) invariant_failed("request: top_p");
  if (s.top_k < 0) invariant_failed("request: top_k < 0");
  if (s.stop.size() > 4) invariant_failed("request: more than 4 stop sequences");
  for (const std::string& t : s.stop) {
    if (t.empty()) invariant_failed("request: an empty stop sequence");
  }
  if (s.include_usage && !s.stream) invariant_failed("request: include_usage without stream");
}

void check_error(const serve::ApiError& e) {
  if (e.status < 400 || e.status > 499) invariant_failed("error: status outside 4xx");
  if (e.message.empty()) invariant_failed("error: empty message");
  const std::string text = mammoth::json::dump(serve::error_body(e));
  const mammoth::json::Value back = mammoth::json::parse(text, "error body");
  const mammoth::json::Value& err = back.at("error");
  if (err.at("message").as_string() != e.message) invariant_failed("error: message round trip");
  if (!err.at("param").is_null() && err.at("param").as_string() != e.param) {
    invariant_failed("error: param round trip");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const serve::Endpoint endpoint =
      data[0] % 2 == 0 ? serve::Endpoint::kCompletions : serve::Endpoint::kChatCompletions;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto parsed = serve::parse_request(body, endpoint, context());
  if (const auto* e = std::get_if<serve::ApiError>(&parsed)) {
    check_error(*e);
  } else {
    check_request(std::get<serve::ApiRequest>(parsed), endpoint);
  }
  return 0;
}
