// Tests for engine/data/instruction_data: JSONL parsing and its refusals, the prompt / response
// segments of a rendered conversation, templates that do not render incrementally, examples
// without a chat template, and packing (bins, truncation, dropping, the final padding token).
// Agreement with transformers' rendering and tokenization is instruction_data_interop_test.py's.
#include "engine/data/instruction_data.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "test/testing/test_dir.h"

namespace mammoth::data {
namespace {

// A byte-level tokenizer with <|im_start|>, <|im_end|> and <|endoftext|> (eos) as special tokens:
// no merges, so every byte of ordinary text is one token.
Tokenizer byte_tokenizer(const testing::TestDir& dir) {
  std::string vocab = "{";
  // GPT-2's byte alphabet: printable Latin-1 bytes map to themselves, the rest to U+0100 on.
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const int cp = printable ? b : 256 + extra++;
    std::string utf8;
    if (cp < 0x80) {
      utf8 = std::string(1, static_cast<char>(cp));
    } else {
      utf8 = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
    if (utf8 == "\"" || utf8 == "\\") utf8 = "\\" + utf8;
    vocab += (b ? ", \"" : "\"") + utf8 + "\": " + std::to_string(b);
  }
  vocab += "}";
  const std::string json = R"({"version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [
      {"id": 256, "content": "<|im_start|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
      {"id": 257, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
      {"id": 258, "content": "<|endoftext|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
              "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
              "ignore_merges": false, "vocab": )" +
                           vocab + R"(, "merges": []}})";
  dir.write("tokenizer.json", json);
  dir.write("tokenizer_config.json", R"({"eos_token": "<|endoftext|>"})");
  return Tokenizer::from_directory(dir.path());
}

// ChatML without a default system prompt.
const char* const kChatMl =
    "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

std::string text_of(const Tokenizer& tok, const TokenizedExample& t, TokenPart part) {
  std::vector<int32_t> ids;
  for (size_t k = 0; k < t.tokens.size(); ++k)
    if (t.parts[k] == part) ids.push_back(t.tokens[k]);
  return tok.decode(ids);
}

TEST_CASE("instruction examples are cut into prompt and response segments") {
  testing::TestDir dir;
  const Tokenizer tok = byte_tokenizer(dir);
  const ChatTemplate chat(kChatMl, {});
  const InstructionExample ex{{{"user", "hi"}, {"assistant", "yo"}, {"user", "bye"}}, false};
  const TokenizedExample t = tokenize_example(ex, tok, &chat);
  REQUIRE(t.tokens.size() == t.parts.size());
  // The response is the content and what closes the turn; the trailing user turn is prompt.
  CHECK(text_of(tok, t, TokenPart::kResponse) == "yo<|im_end|>\n");
  CHECK(text_of(tok, t, TokenPart::kPrompt) ==
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|im_start|>user\nbye<|im_end|>\n");
  CHECK(tok.decode(t.tokens) == chat.render(ex.messages, false));
}

TEST_CASE("a template that does not render incrementally is refused") {
  testing::TestDir dir;
  const Tokenizer tok = byte_tokenizer(dir);
  // Like Mistral's: the system prompt goes into the last user turn, so earlier renderings change.
  const ChatTemplate chat(
      "{% for m in messages %}{% if m.role == 'user' %}[INST] {% if loop.last %}SYS {% endif %}"
      "{{ m.content }}[/INST]{% elif m.role == 'assistant' %}{{ m.content }}</s>{% endif %}"
      "{% endfor %}",
      {});
  const InstructionExample ex{{{"user", "a"}, {"assistant", "b"}, {"user", "c"}}, false};
  CHECK_THROWS_WITH(tokenize_example(ex, tok, &chat), Catch::Contains("incrementally"));
}

TEST_CASE("without a chat template, prompt/response pairs end with eos; messages are refused") {
  testing::TestDir dir;
  const Tokenizer tok = byte_tokenizer(dir);
  const TokenizedExample t =
      tokenize_example({{{"user", "Q"}, {"assistant", "A"}}, true}, tok, nullptr);
  CHECK(t.tokens == std::vector<int32_t>{'Q', 'A', 258});
  CHECK(t.parts ==
        std::vector<TokenPart>{TokenPart::kPrompt, TokenPart::kResponse, TokenPart::kResponse});
  CHECK_THROWS_WITH(tokenize_example({{{"user", "Q"}, {"assistant", "A"}}, false}, tok, nullptr),
                    Catch::Contains("need the model directory's chat template"));
}

TEST_CASE("JSONL examples: both forms, and every other key refused naming the line") {
  testing::TestDir dir;
  const std::string ok =
      dir.write("ok.jsonl",
                "{\"prompt\": \"p\", \"response\": \"r\"}\n\n"
                "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", "
                "\"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}\n");
  const std::vector<InstructionExample> exs = read_instruction_jsonl(ok);
  REQUIRE(exs.size() == 2);
  CHECK(exs[0].prompt_response);
  CHECK(exs[1].messages.size() == 3);
  const std::string bad = dir.write("bad.jsonl",
                                    "{\"prompt\": \"p\", \"response\": \"r\"}\n"
                                    "{\"prompt\": \"p\", \"answer\": \"r\"}\n");
  CHECK_THROWS_WITH(read_instruction_jsonl(bad), Catch::Contains("bad.jsonl:2: key 'answer'"));
}

TEST_CASE("packing: whole examples per bin, truncation, dropping, a final padding token") {
  testing::TestDir dir;
  const Tokenizer tok = byte_tokenizer(dir);
  // Without a template: prompt bytes, response bytes, eos.
  dir.write("d.jsonl",
            "{\"prompt\": \"ab\", \"response\": \"c\"}\n"   // 4 tokens
            "{\"prompt\": \"de\", \"response\": \"fg\"}\n"  // 5: does not fit the rest of bin 0
            "{\"prompt\": \"hijklmnop\", \"response\": \"q\"}\n"   // 11 > 8: cut, no response left
            "{\"prompt\": \"rstuvw\", \"response\": \"xyz\"}\n");  // 10 > 8: cut to 8, kept
  InstructionDataOptions o;
  o.jsonl_files = {dir.file("d.jsonl")};
  o.out_dir = dir.file("out");
  o.seq_len = 8;
  o.verbose = false;
  const InstructionDataResult r = build_instruction_data(o, tok, nullptr);
  CHECK(r.examples == 4);
  CHECK(r.dropped == 1);
  CHECK(r.truncated == 2);
  CHECK(r.bins == 3);
  const InstructionData d = open_instruction_data(o.out_dir);
  REQUIRE(d.tokens.size() == 3 * 8 + 1);
  std::vector<int32_t> ids(25), parts(25);
  d.tokens.read(0, 25, ids.data());
  d.loss_mask.read(0, 25, parts.data());
  const int32_t E = 258;
  CHECK(ids == std::vector<int32_t>{'a', 'b', 'c', E,   E,   E,   E,   E,   'd', 'e', 'f', 'g', E,
                                    E,   E,   E,   'r', 's', 't', 'u', 'v', 'w', 'x', 'y', E});
  CHECK(parts == std::vector<int32_t>{1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 2, 2, 2,
                                      0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 0});
  CHECK(d.seq_len == 8);
}

}  // namespace
}  // namespace mammoth::data
