// serve/request.h: the OpenAI bodies `mammoth serve` accepts, parsed without the server.
#include "serve/request.h"

#include <catch2/catch.hpp>
#include <string>
#include <variant>

#include "base/error.h"

using mammoth::data::ChatMessage;
using mammoth::serve::ApiError;
using mammoth::serve::ApiRequest;
using mammoth::serve::Endpoint;
using mammoth::serve::parse_request;
using mammoth::serve::RequestContext;

namespace {

RequestContext context() {
  RequestContext c;
  c.model_name = "tiny";
  c.vocab_size = 100;
  c.chat = [](const std::vector<ChatMessage>& m) {
    std::string s;
    for (const ChatMessage& x : m) s += "<" + x.role + ">" + x.content;
    if (!m.empty() && m.back().content == "boom") MAMMOTH_THROW() << "template refused";
    return s + "<assistant>";
  };
  c.chat_missing_reason = "no template";
  return c;
}

ApiRequest ok(const std::string& body, Endpoint e = Endpoint::kCompletions,
              const RequestContext& ctx = context()) {
  auto r = parse_request(body, e, ctx);
  if (const ApiError* err = std::get_if<ApiError>(&r)) FAIL(body << ": " << err->message);
  return std::get<ApiRequest>(r);
}

ApiError refused(const std::string& body, Endpoint e = Endpoint::kCompletions,
                 const RequestContext& ctx = context()) {
  auto r = parse_request(body, e, ctx);
  if (!std::holds_alternative<ApiError>(r)) FAIL(body << ": accepted");
  return std::get<ApiError>(r);
}

}  // namespace

TEST_CASE("completions: prompt text or ids, sampling fields, defaults") {
  ApiRequest r = ok(R"({"model": "tiny", "prompt": "hello", "temperature": 0, "top_k": 3,
                        "top_p": 0.5, "seed": 9, "stop": "\n", "stream": true,
                        "stream_options": {"include_usage": true}})");
  CHECK(r.prompt_is_text);
  CHECK(r.prompt_text == "hello");
  CHECK(r.sampling.max_tokens == 16);  // OpenAI's default
  CHECK(r.sampling.temperature == 0);
  CHECK(r.sampling.top_k == 3);
  CHECK(r.sampling.top_p == 0.5);
  CHECK(r.sampling.seed == 9u);
  CHECK(r.sampling.stop == std::vector<std::string>{"\n"});
  CHECK(r.sampling.stream);
  CHECK(r.sampling.include_usage);

  r = ok(R"({"model": "tiny", "prompt": [[5, 0, 99]], "max_tokens": null, "seed": null})");
  CHECK_FALSE(r.prompt_is_text);
  CHECK(r.prompt_ids == std::vector<int64_t>{5, 0, 99});
  CHECK(r.sampling.max_tokens == 16);
  CHECK_FALSE(r.sampling.seed.has_value());  // the server draws one
}

TEST_CASE("completions: each refusal names its parameter") {
  struct Case {
    const char* body;
    const char* param;
    const char* code;
    int status;
  };
  const Case cases[] = {
      {R"({"model": "tiny", "prompt": )", "", "invalid_json", 400},
      {R"([1, 2])", "", "invalid_json", 400},
      {R"({"prompt": "x"})", "model", "", 400},
      {R"({"model": "gpt-4", "prompt": "x"})", "model", "model_not_found", 404},
      {R"({"model": "tiny", "prompt": "x", "frobnicate": 1})", "frobnicate", "", 400},
      {R"({"model": "tiny"})", "prompt", "", 400},
      {R"({"model": "tiny", "prompt": ["a", "b"]})", "prompt", "", 400},
      {R"({"model": "tiny", "prompt": [1, 100]})", "prompt", "", 400},
      {R"({"model": "tiny", "prompt": [1, 2.5]})", "prompt", "", 400},
      {R"({"model": "tiny", "prompt": "x", "max_tokens": 0})", "max_tokens", "", 400},
      {R"({"model": "tiny", "prompt": "x", "max_tokens": "8"})", "max_tokens", "", 400},
      {R"({"model": "tiny", "prompt": "x", "temperature": 2.5})", "temperature", "", 400},
      {R"({"model": "tiny", "prompt": "x", "top_p": 0})", "top_p", "", 400},
      {R"({"model": "tiny", "prompt": "x", "top_k": -1})", "top_k", "", 400},
      {R"({"model": "tiny", "prompt": "x", "stop": ["a", ""]})", "stop", "", 400},
      {R"({"model": "tiny", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", "stop", "", 400},
      {R"({"model": "tiny", "prompt": "x", "stream_options": {}})", "stream_options", "", 400},
      {R"({"model": "tiny", "prompt": "x", "n": 2})", "n", "", 400},
      {R"({"model": "tiny", "prompt": "x", "logit_bias": {"1": 5}})", "logit_bias", "", 400},
      {R"({"model": "tiny", "prompt": "x", "echo": true})", "echo", "", 400},
      {R"({"model": "tiny", "prompt": "x", "best_of": 2})", "best_of", "", 400},
  };
  for (const Case& c : cases) {
    INFO(c.body);
    const ApiError e = refused(c.body);
    CHECK(e.param == c.param);
    CHECK(e.code == c.code);
    CHECK(e.status == c.status);
    CHECK_FALSE(e.message.empty());
  }
}

TEST_CASE("chat: the transcript through the template; max_completion_tokens") {
  ApiRequest r = ok(R"({"model": "tiny", "messages": [{"role": "system", "content": "s"},
                        {"role": "user", "content": "hi"}], "max_completion_tokens": 4})",
                    Endpoint::kChatCompletions);
  CHECK(r.prompt_text == "<system>s<user>hi<assistant>");
  REQUIRE(r.messages.size() == 2);
  CHECK(r.messages[1].content == "hi");
  CHECK(r.sampling.max_tokens == 4);
  // Without max_tokens the server gives the rest of the context; max_tokens wins over the alias.
  CHECK_FALSE(ok(R"({"model": "tiny", "messages": [{"role": "user", "content": "a"}]})",
                 Endpoint::kChatCompletions)
                  .sampling.max_tokens.has_value());
  CHECK(ok(R"({"model": "tiny", "messages": [{"role": "user", "content": "a"}],
              "max_tokens": 3, "max_completion_tokens": 9})",
           Endpoint::kChatCompletions)
            .sampling.max_tokens == 3);

  CHECK(refused(R"({"model": "tiny", "messages": []})", Endpoint::kChatCompletions).param ==
        "messages");
  CHECK(refused(R"({"model": "tiny", "messages": [{"role": "user", "content": [{}]}]})",
                Endpoint::kChatCompletions)
            .param == "messages");
  const ApiError boom = refused(R"({"model": "tiny", "messages": [{"role": "u", "content":
                                   "boom"}]})",
                                Endpoint::kChatCompletions);
  CHECK(boom.code == "invalid_chat");
  CHECK(boom.message.find("template refused") != std::string::npos);
  RequestContext no_chat = context();
  no_chat.chat = nullptr;
  const ApiError missing = refused(R"({"model": "tiny", "messages": [{"role": "u", "content":
                                      "x"}]})",
                                   Endpoint::kChatCompletions, no_chat);
  CHECK(missing.message == "no template");
}
