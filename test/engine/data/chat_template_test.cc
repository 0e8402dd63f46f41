// Tests for engine/data/chat_template: the Jinja subset on small templates, templates read
// from a model directory, and malformed or unsupported templates refused with a message
// (including a fuzz-ish pass over truncated and mutated real templates: every one either
// renders or throws mammoth::Error, never crashes or throws anything else). Byte-for-byte
// agreement with transformers is chat_template_interop_test.py's job.
#include "engine/data/chat_template.h"

#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "test/testing/test_dir.h"

namespace mammoth::data {
namespace {

const ChatTemplate::SpecialTokens kTokens{"<s>", "</s>", "<unk>", ""};

const std::vector<ChatMessage> kChat = {
    {"system", "Be brief."}, {"user", " Hi "}, {"assistant", "Hello."}, {"user", "Bye"}};

std::string render(const std::string& source, const std::vector<ChatMessage>& chat = kChat,
                   bool add_generation_prompt = false) {
  return ChatTemplate(source, kTokens).render(chat, add_generation_prompt);
}

// Llama 3's template (as its tokenizer_config.json ships it).
const char* const kLlama3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% "
    "endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

TEST_CASE("chat_template renders Llama 3's template") {
  const std::vector<ChatMessage> chat = {{"user", " Hi "}};
  CHECK(render(kLlama3, chat, false) ==
        "<s><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
  CHECK(render(kLlama3, chat, true) ==
        "<s><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST_CASE("chat_template whitespace control follows trim_blocks and lstrip_blocks") {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indent before one.
  CHECK(render("{% if true %}\nA\n  {% endif %}\nB") == "A\nB");
  CHECK(render("x  {%- if true -%}  y  {%- endif -%}  z") == "xyz");
  CHECK(render("{{ 'a' }}\n{{ 'b' }}\n") == "a\nb");  // one trailing newline is dropped
  CHECK(render("  {%+ if true %}k{% endif %}") == "  k");
  CHECK(render("a{# note #}\nb") == "ab");
}

TEST_CASE("chat_template expressions follow Jinja's precedence and Python's values") {
  CHECK(render("{{ 'a' + ' b ' | trim }}") == "ab");
  CHECK(render("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 / 2 }}|{{ 7 // 2 }}|{{ -7 % 3 }}") ==
        "7|9|3.5|3|2");
  CHECK(render("{{ 1 ~ 2 * 3 }}") == "16");  // * binds tighter than ~, and ~ tighter than +
  CHECK(render("{{ not 1 == 2 and 'x' in 'xy' }}") == "True");
  CHECK(
      render(
          "{{ messages[1:] | length }}|{{ messages[-1].content }}|{{ messages[9] is defined }}") ==
      "3|Bye|False");
  CHECK(render("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
               "{% endfor %}{{ ns.n }}") == "4");
  // A plain set inside a loop does not leak out of it.
  CHECK(render("{% set n = 0 %}{% for m in messages %}{% set n = 5 %}{% endfor %}{{ n }}") == "0");
  CHECK(render("{% for m in messages if m.role == 'user' %}{{ loop.index }}{{ m.content }}"
               "{% if not loop.last %},{% endif %}{% endfor %}") == "1 Hi ,2Bye");
  CHECK(render("{% for x in [] %}a{% else %}empty{% endfor %}") == "empty");
  CHECK(render("{{ {'a': 1, 'b': [true, none, 'é']} | tojson }}") ==
        "{\"a\": 1, \"b\": [true, null, \"é\"]}");
  CHECK(render("{{ unknown }}|{{ unk_token }}|{{ pad_token is defined }}") == "|<unk>|False");
}

TEST_CASE("chat_template raise_exception throws with the template's message") {
  try {
    render(
        "{% if messages[0].role == 'system' %}{{ raise_exception('no system role') }}{% endif %}");
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("template raised: no system role"));
  }
}

TEST_CASE("chat_template bounds what a template may build, and refuses integer overflow") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{{ range(10 ** 12) | length }}", "range() of more than 2^20 elements"},
      {"{{ 'ab' * 10 ** 12 }}", "a string would exceed 16 MiB"},
      {"{% set s = 'x' * 16777216 %}{{ s + s }}", "a string would exceed 16 MiB"},
      {"{% set s = 'x' * 1048576 %}{% for i in range(17) %}{{ s }}{% endfor %}",
       "the rendered text exceeds 16 MiB"},
      // Each loop is within the limits; together they would run 2^40 iterations.
      {"{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
       "rendering takes more than 524288 steps"},
      // Indexing a string splits it: a loop over a long string's characters is quadratic.
      {"{% set s = 'x' * 100000 %}{% for i in range(100000) %}{% set c = s[i] %}{% endfor %}",
       "rendering takes more than 524288 steps"},
      // Each lookup of a long string copies it.
      {"{% set s = 'x' * 16000000 %}{% for i in range(1000) %}{% if s %}{% endif %}{% endfor %}",
       "rendering takes more than 524288 steps"},
      // A namespace inside itself (directly or through a list) would never be freed.
      {"{% set ns = namespace(n=0) %}{% set ns.n = ns %}", "store the namespace inside itself"},
      {"{% set ns = namespace(n=0) %}{% set ns.n = [1, ns] %}",
       "store the namespace inside itself"},
      {"{{ 9223372036854775807 + 1 }}", "integer overflow in '+'"},
      {"{{ 3037000500 * 3037000500 }}", "integer overflow in '*'"},
      {"{{ 2 ** 63 }}", "integer overflow in '**'"},
      {"{{ -(-9223372036854775807 - 1) }}", "integer overflow in unary '-'"},
  };
  for (const auto& [source, message] : cases) {
    CAPTURE(source);
    CHECK_THROWS_WITH(render(source), Catch::Contains(message));
  }
  // Nesting deep enough to overflow the stack of a recursive parser (the fuzzer found 1200
  // brackets under AddressSanitizer) is refused; 100 levels still render.
  for (const char* open : {"[", "(", "-", "not "}) {
    std::string deep = "{{ ";
    for (int i = 0; i < 2000; ++i) deep += open;
    deep += "1 }}";
    CAPTURE(open);
    CHECK_THROWS_WITH(render(deep), Catch::Contains("nested deeper than 100 levels"));
  }
  std::string ok = "{{ ";
  for (int i = 0; i < 90; ++i) ok += "[";
  ok += "1";
  for (int i = 0; i < 90; ++i) ok += "]";
  CHECK(render(ok + "[0] | length }}") == "1");
  // The same for statements: thousands of if / for blocks inside each other are refused by the
  // body parser, 90 still render.
  for (const auto& [open, close] : {std::pair{"{% if true %}", "{% endif %}"},
                                    std::pair{"{% for x in [1] %}", "{% endfor %}"}}) {
    CAPTURE(open);
    std::string deep_body, body_ok;
    for (int i = 0; i < 5000; ++i) deep_body += open;
    CHECK_THROWS_WITH(render(deep_body + "x"),
                      Catch::Contains("statements nested deeper than 100"));
    for (int i = 0; i < 90; ++i) body_ok += open;
    body_ok += "x";
    for (int i = 0; i < 90; ++i) body_ok += close;
    CHECK(render(body_ok) == "x");
  }
  CHECK(render("[{{ '' * 10 ** 12 }}]") == "[]");
  CHECK(render("{{ 2 ** 62 }}|{{ -7 % 3 }}|{{ 7 % -3 }}|{{ -7 // 2 }}") ==
        "4611686018427387904|2|-2|-4");  // Python's values
}

TEST_CASE("chat_template's work budget leaves room for long chats") {
  // 4000 turns of 1 KiB through Llama 3's template render whole: the budget that stops runaway
  // loops does not stop a real conversation.
  std::vector<ChatMessage> chat;
  for (int k = 0; k < 4000; ++k)
    chat.push_back(
        {k % 2 ? "assistant" : "user", std::string(1024, static_cast<char>('a' + k % 26))});
  const std::string out = render(kLlama3, chat, true);
  size_t turns = 0;
  for (size_t at = 0; (at = out.find("<|eot_id|>", at)) != std::string::npos; at += 10) ++turns;
  CHECK(turns == 4000);
  CHECK(out.size() > 4000 * 1024);
  CHECK(out.rfind("<|start_header_id|>assistant<|end_header_id|>\n\n") ==
        out.size() - std::string("<|start_header_id|>assistant<|end_header_id|>\n\n").size());
}

TEST_CASE("chat_template's limits are the caller's to lower") {
  const ChatTemplate t("{% for i in range(1000) %}ab{% endfor %}", kTokens);
  // 1000 iterations are ~17000 units of work and 2000 bytes of text.
  CHECK(t.render(kChat, false).size() == 2000);
  CHECK(t.render(kChat, false, {.work = 20000, .text = 2000}).size() == 2000);
  CHECK_THROWS_WITH(t.render(kChat, false, {.work = 10000}),
                    Catch::Contains("rendering takes more than 10000 steps"));
  CHECK_THROWS_WITH(t.render(kChat, false, {.text = 1999}),
                    Catch::Contains("the rendered text exceeds 1999 bytes"));
  const ChatTemplate big("{{ 'ab' * 600000 }}", kTokens);
  CHECK(big.render(kChat, false).size() == 1200000);
  CHECK_THROWS_WITH(big.render(kChat, false, {.text = size_t{1} << 20}),
                    Catch::Contains("a string would exceed 1 MiB"));
}

TEST_CASE("chat_template refuses what it cannot honour, by name") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{{ x", "unclosed '{{'"},
      {"{% if true %}a", "missing '{% endif %}'"},
      {"{% for m in messages %}a", "missing '{% endfor %}'"},
      {"a{% endif %}", "'{% endif %}' is not supported"},
      {"{% macro m() %}{% endmacro %}", "'{% macro %}' is not supported"},
      {"{% raw %}x{% endraw %}", "'{% raw %}' is not supported"},
      {"{% generation %}x{% endgeneration %}", "'{% generation %}' is not supported"},
      {"{% for m in messages %}{% break %}{% endfor %}", "'{% break %}' is not supported here"},
      {"{% if true %}{% else %}{% elif false %}{% endif %}", "'{% elif %}' is not supported here"},
      {"{{ messages | map(attribute='role') }}", "filter 'map' is not supported"},
      {"{{ 1 is prime }}", "test 'prime' is not supported"},
      {"{{ 'a'.format(1) }}", "method string.format() is not supported"},
      {"{{ cycler(1) }}", "function 'cycler' is not supported"},
      {"{{ 'abc }}", "unclosed '{{'"},
      {"{{ 1 + 2 ~ 3 }}", "unsupported operands for '+': int and string"},
      {"{{ 1 + }}", "unexpected end of expression"},
      {"{{ (1, 2) }}", "tuples are not supported"},
      {"{{ 1e5 }}", "exponents are not supported"},
      {"{{ 99999999999999999999 }}", "out of range"},
      {"{% set %}", "expected a name"},
      {"{% set x %}y{% endset %}", "block '{% set x %}"},
      {"{% set a, b = 1 %}", "tuple unpacking"},
      {"{{ x @ y }}", "unexpected character '@'"},
      {"{{ messages }}", "printing a list as text"},
      {"{{ foo.bar }}", "'foo' is undefined"},
      {"{{ 'x' + 1 }}", "unsupported operands for '+': string and int"},
      {"{{ 1 // 0 }}", "division by zero"},
      {"{{ 'É' | lower }}", "non-ASCII"},
      {"{{ 1 < 'a' }}", "cannot order int and string"},
      {"{% set x.y = 1 %}", "needs a namespace()"},
      {"{% for a, b in messages %}{% endfor %}", "cannot unpack a dict into 2"},
      {"{{ 'x' is defined if true }}", "unexpected"},
  };
  for (const auto& [source, expected] : cases) {
    INFO("template: " << source);
    try {
      render(source);
      FAIL("rendered without an error");
    } catch (const Error& e) {
      CHECK_THAT(e.what(),
                 Catch::Contains("[chat_template] line 1: ") && Catch::Contains(expected));
    }
  }
}

TEST_CASE("chat_template errors name the template line") {
  try {
    render("a\nb\n{{ x | nope }}");
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("line 3: filter 'nope'"));
  }
}

// Every truncation and many random mutations of a real template either render or throw
// mammoth::Error: no crash, no std:: exception escaping, no hang.
TEST_CASE("chat_template survives malformed templates (fuzz)") {
  const std::string base = kLlama3;
  std::mt19937 rng(26);
  const std::string alphabet = "{}%#-+|()[]'\".,:~=<>!*/ ifnotendsetloop0";
  std::vector<std::string> sources;
  for (size_t n = 0; n <= base.size(); n += 3) sources.push_back(base.substr(0, n));
  for (int k = 0; k < 600; ++k) {
    std::string s = base;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % s.size();
      if (rng() % 2) {
        s.erase(at, 1 + rng() % 3);
      } else {
        s.insert(at, 1, alphabet[rng() % alphabet.size()]);
      }
    }
    sources.push_back(s);
  }
  int rendered = 0, refused = 0;
  for (const std::string& s : sources) {
    INFO("template: " << s);
    try {
      render(s, kChat, true);
      ++rendered;
    } catch (const Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("[chat_template]"));
      ++refused;
    }
  }
  CHECK(rendered > 0);
  CHECK(refused > 0);
}

TEST_CASE("chat_template reads the template of a model directory") {
  testing::TestDir dir;
  SECTION("a string, with AddedToken objects for the special tokens") {
    dir.write("tokenizer_config.json",
              R"({"chat_template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
                  "bos_token": {"content": "<B>", "lstrip": false}, "eos_token": "<E>"})");
    const ChatTemplate t = ChatTemplate::from_model_dir(dir.path());
    CHECK(t.render({{"user", "x"}}, false) == "<B>x<E>");
  }
  SECTION("a named list: 'default' is taken") {
    dir.write("tokenizer_config.json",
              R"({"chat_template": [{"name": "tool_use", "template": "T"},
                                    {"name": "default", "template": "D"}]})");
    CHECK(ChatTemplate::from_model_dir(dir.path()).render({}, false) == "D");
  }
  SECTION("a named list without 'default' is refused") {
    dir.write("tokenizer_config.json", R"({"chat_template": [{"name": "rag", "template": "R"}]})");
    CHECK_THROWS_WITH(ChatTemplate::from_model_dir(dir.path()),
                      Catch::Contains("without a template named 'default'"));
  }
  SECTION("chat_template.jinja beside tokenizer_config.json") {
    dir.write("tokenizer_config.json", R"({"eos_token": "<E>"})");
    dir.write("chat_template.jinja", "{{ messages | length }}{{ eos_token }}\n");
    CHECK(ChatTemplate::from_model_dir(dir.path()).render(kChat, false) == "4<E>");
  }
  SECTION("no template at all is refused, naming the directory") {
    dir.write("tokenizer_config.json", R"({"eos_token": "<E>"})");
    CHECK_THROWS_WITH(ChatTemplate::from_model_dir(dir.path()),
                      Catch::Contains("has no chat template"));
  }
}

}  // namespace
}  // namespace mammoth::data
