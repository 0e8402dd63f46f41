#include "serve/request.h"

#include <algorithm>
#include <sstream>

#include "base/error.h"

namespace mammoth::serve {

json::Value error_body(const ApiError& e) {
  auto or_null = [](const std::string& s) { return s.empty() ? json::Value() : json::Value(s); };
  return json::Value::object().set("error", json::Value::object()
                                                .set("message", e.message)
                                                .set("type", e.type)
                                                .set("param", or_null(e.param))
                                                .set("code", or_null(e.code)));
}

namespace {

[[noreturn]] void refuse(std::string message, std::string param = "", std::string code = "",
                         int status = 400) {
  throw ApiError{status, std::move(message), std::move(param), std::move(code)};
}

// Request fields. A field given as JSON null counts as absent (the openai client sends only what
// the caller set, but other clients write nulls for defaults).
const json::Value* field(const json::Value& body, const char* name) {
  const json::Value* v = body.find(name);
  return v == nullptr || v->is_null() ? nullptr : v;
}

int64_t int_field(const json::Value& body, const char* name, int64_t fallback) {
  const json::Value* v = field(body, name);
  if (v == nullptr) return fallback;
  if (!v->is_int()) refuse(std::string("'") + name + "' must be an integer", name);
  return v->as_int();
}

double number_field(const json::Value& body, const char* name, double fallback) {
  const json::Value* v = field(body, name);
  if (v == nullptr) return fallback;
  if (!v->is_number()) refuse(std::string("'") + name + "' must be a number", name);
  return v->as_double();
}

bool bool_field(const json::Value& body, const char* name, bool fallback) {
  const json::Value* v = field(body, name);
  if (v == nullptr) return fallback;
  if (!v->is_bool()) refuse(std::string("'") + name + "' must be a boolean", name);
  return v->as_bool();
}

std::string number_text(double d) {
  std::ostringstream s;
  s << d;
  return s.str();
}

// The sampling fields shared by /v1/completions and /v1/chat/completions; `default_max` when
// the body gives no max_tokens (nullopt: the server decides).
SamplingParams parse_sampling(const json::Value& body, std::optional<int64_t> default_max) {
  SamplingParams s;
  if (field(body, "max_tokens") != nullptr) {
    s.max_tokens = int_field(body, "max_tokens", 0);
  } else {
    s.max_tokens = default_max;
  }
  if (s.max_tokens && *s.max_tokens <= 0) {
    refuse("'max_tokens' must be at least 1, got " + std::to_string(*s.max_tokens), "max_tokens");
  }
  s.temperature = number_field(body, "temperature", 1.0);
  if (!(s.temperature >= 0 && s.temperature <= 2)) {
    refuse("'temperature' must be in [0, 2], got " + number_text(s.temperature), "temperature");
  }
  s.top_p = number_field(body, "top_p", 1.0);
  if (!(s.top_p > 0 && s.top_p <= 1)) {
    refuse("'top_p' must be in (0, 1], got " + number_text(s.top_p), "top_p");
  }
  s.top_k = int_field(body, "top_k", 0);
  if (s.top_k < 0) {
    refuse("'top_k' must be >= 0 (0: all tokens), got " + std::to_string(s.top_k), "top_k");
  }
  if (const json::Value* seed = field(body, "seed")) {
    if (!seed->is_int()) refuse("'seed' must be an integer", "seed");
    s.seed = static_cast<uint64_t>(seed->as_int());
  }
  if (const json::Value* stop = field(body, "stop")) {
    if (stop->is_string()) {
      s.stop.push_back(stop->as_string());
    } else if (stop->is_array()) {
      for (const json::Value& item : *stop) {
        if (!item.is_string()) refuse("'stop' must be a string or a list of strings", "stop");
        s.stop.push_back(item.as_string());
      }
    } else {
      refuse("'stop' must be a string or a list of strings", "stop");
    }
    if (s.stop.size() > 4) refuse("'stop' takes at most 4 sequences", "stop");
    for (const std::string& t : s.stop) {
      if (t.empty()) refuse("'stop' sequences must not be empty", "stop");
    }
  }
  s.stream = bool_field(body, "stream", false);
  if (const json::Value* so = field(body, "stream_options")) {
    if (!so->is_object()) refuse("'stream_options' must be an object", "stream_options");
    if (!s.stream) refuse("'stream_options' needs 'stream': true", "stream_options");
    s.include_usage = bool_field(*so, "include_usage", false);
  }
  // Parameters we accept only at the value that changes nothing; anything else is refused by
  // name rather than ignored.
  if (int_field(body, "n", 1) != 1) refuse("only 'n': 1 is supported", "n");
  for (const char* penalty : {"presence_penalty", "frequency_penalty"}) {
    if (number_field(body, penalty, 0.0) != 0.0) {
      refuse(std::string("'") + penalty + "' is not supported (only 0)", penalty);
    }
  }
  if (const json::Value* bias = field(body, "logit_bias")) {
    if (!bias->is_object() || !bias->empty()) {
      refuse("'logit_bias' is not supported", "logit_bias");
    }
  }
  return s;
}

void check_keys(const json::Value& body, const std::vector<std::string>& known) {
  for (const json::Value& member : body) {
    if (std::find(known.begin(), known.end(), member.key()) == known.end()) {
      refuse("Unrecognized request argument supplied: " + member.key(), member.key());
    }
  }
}

// The body as a JSON object naming the served model.
json::Value parse_body(std::string_view text, const std::string& name) {
  json::Value body;
  try {
    body = json::parse(std::string(text), "request body");
  } catch (const Error& e) {
    refuse("We could not parse the JSON body of your request: " + e.message(), "", "invalid_json");
  }
  if (!body.is_object()) refuse("the request body must be a JSON object", "", "invalid_json");
  const json::Value* model = field(body, "model");
  if (model == nullptr) refuse("you must provide a model parameter", "model");
  if (!model->is_string()) refuse("'model' must be a string", "model");
  if (model->as_string() != name) {
    refuse(
        "The model '" + model->as_string() + "' does not exist; this server serves '" + name + "'",
        "model", "model_not_found", 404);
  }
  return body;
}

ApiRequest parse_completion(const json::Value& body, const RequestContext& ctx) {
  check_keys(body, {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "stop",
                    "seed", "stream", "stream_options", "n", "user", "presence_penalty",
                    "frequency_penalty", "logit_bias", "echo", "logprobs", "best_of", "suffix"});
  if (bool_field(body, "echo", false)) refuse("'echo' is not supported", "echo");
  if (field(body, "logprobs") != nullptr) refuse("'logprobs' is not supported", "logprobs");
  if (int_field(body, "best_of", 1) != 1) refuse("only 'best_of': 1 is supported", "best_of");
  if (field(body, "suffix") != nullptr) refuse("'suffix' is not supported", "suffix");
  const json::Value* prompt = field(body, "prompt");
  if (prompt == nullptr) refuse("you must provide a prompt", "prompt");
  // A list holding one prompt is the same prompt; a batch is refused (send one request per
  // prompt: they are batched here anyway).
  if (prompt->is_array() && prompt->size() == 1 &&
      ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    prompt = &(*prompt)[0];
  }
  ApiRequest r;
  r.endpoint = Endpoint::kCompletions;
  if (prompt->is_string()) {
    r.prompt_is_text = true;
    r.prompt_text = prompt->as_string();
  } else if (prompt->is_array()) {
    for (const json::Value& t : *prompt) {
      if (t.is_string() || t.is_array()) {
        refuse("batched prompts are not supported: send one request per prompt", "prompt");
      }
      if (!t.is_int() || t.as_int() < 0 || t.as_int() >= ctx.vocab_size) {
        refuse("'prompt' token ids must be integers in [0, " + std::to_string(ctx.vocab_size) + ")",
               "prompt");
      }
      r.prompt_ids.push_back(t.as_int());
    }
  } else {
    refuse("'prompt' must be a string or a list of token ids", "prompt");
  }
  r.sampling = parse_sampling(body, 16);  // OpenAI's default max_tokens
  return r;
}

ApiRequest parse_chat(const json::Value& body, const RequestContext& ctx) {
  if (!ctx.chat) refuse(ctx.chat_missing_reason, "messages", "", 400);
  check_keys(body,
             {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
              "top_k", "stop", "seed", "stream", "stream_options", "n", "user", "presence_penalty",
              "frequency_penalty", "logit_bias", "logprobs", "top_logprobs"});
  if (bool_field(body, "logprobs", false)) refuse("'logprobs' is not supported", "logprobs");
  if (field(body, "top_logprobs") != nullptr) {
    refuse("'top_logprobs' is not supported", "top_logprobs");
  }
  const json::Value* messages = field(body, "messages");
  if (messages == nullptr || !messages->is_array() || messages->empty()) {
    refuse("'messages' must be a non-empty list", "messages");
  }
  ApiRequest r;
  r.endpoint = Endpoint::kChatCompletions;
  for (const json::Value& m : *messages) {
    if (!m.is_object() || field(m, "role") == nullptr || !m.at("role").is_string()) {
      refuse("each message needs a string 'role'", "messages");
    }
    const json::Value* content = field(m, "content");
    if (content == nullptr || !content->is_string()) {
      refuse("each message needs a string 'content' (content parts are not supported)", "messages");
    }
    r.messages.push_back({m.at("role").as_string(), content->as_string()});
  }
  try {
    r.prompt_text = ctx.chat(r.messages);
  } catch (const Error& e) {  // the template's raise_exception, say
    refuse(e.message(), "messages", "invalid_chat");
  }
  // max_completion_tokens is the newer name of max_tokens (which wins when both are given).
  json::Value sampling_body = body;
  if (field(body, "max_completion_tokens") != nullptr && field(body, "max_tokens") == nullptr) {
    sampling_body.set("max_tokens", body.at("max_completion_tokens"));
  }
  r.sampling = parse_sampling(sampling_body, std::nullopt);
  return r;
}

}  // namespace

std::variant<ApiRequest, ApiError> parse_request(std::string_view body, Endpoint endpoint,
                                                 const RequestContext& ctx) {
  try {
    const json::Value v = parse_body(body, ctx.model_name);
    return endpoint == Endpoint::kCompletions ? parse_completion(v, ctx) : parse_chat(v, ctx);
  } catch (const ApiError& e) {
    return e;
  }
}

}  // namespace mammoth::serve
