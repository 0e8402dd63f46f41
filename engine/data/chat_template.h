// Chat templates: the Jinja2 strings that Hugging Face model directories keep in
// tokenizer_config.json ("chat_template") to turn a conversation into the text a model was
// trained on, rendered here the way transformers' apply_chat_template(..., tokenize=False) does.
//
// transformers (4.44) renders with Jinja2 (trim_blocks and lstrip_blocks on; no loopcontrols, so
// {% break %} is an error there as here) and passes messages, add_generation_prompt, bos_token /
// eos_token / unk_token / pad_token, tools = none, documents = none and a raise_exception(message)
// function. This file holds a small interpreter for the part of Jinja that real chat templates use:
//
//   {{ expr }}  {% if / elif / else / endif %}  {% for x in xs [if cond] %}...{% else %}
//   {% endfor %}  {% set name = expr %}  {% set ns.attr = expr %}
//   {# comments #}  whitespace control ({%- -%} {{- -}}, {%+)
//   literals (strings, numbers, true/false/none, lists, dicts), names, .attr, [index],
//   [start:stop:step], calls; a if c else b; or, and, not; == != < <= > >= in, not in;
//   + - * / // % ** ~; unary -; loop.index / index0 / revindex / revindex0 / first / last /
//   length / previtem / nextitem; namespace(...), range(...), raise_exception(msg)
//   filters: trim length count tojson upper lower capitalize title default d first last join
//            string int float list replace reverse items safe
//   tests:   defined undefined none string number integer float boolean true false mapping
//            sequence iterable even odd divisibleby eq equalto ne
//   methods: str.strip / lstrip / rstrip / split / startswith / endswith / upper / lower /
//            title / capitalize / replace, dict.items / keys / values / get
//
// Anything else (break / continue, macros, call / filter / raw blocks, {% generation %}, unknown
// filters, tests or methods, rendering a list as text) is refused with an Error naming it and the
// template line, never rendered differently from Jinja.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mammoth::data {

struct ChatMessage {
  std::string role, content;
};

// What one render may cost before it is refused: a template comes from a downloaded
// tokenizer_config.json, so a hostile or broken one (range(10**12), 'a' * 10**12, nested loops)
// must fail instead of exhausting memory or time. A unit of work is about the cost of one list
// element (chat_template.cc says what each construct charges). The defaults fit any real
// template with thousands of turns; the fuzzer lowers them so that it spends its time on many
// inputs, not on a few that run to the limit.
struct ChatTemplateLimits {
  int64_t work = int64_t{1} << 19;
  size_t text = size_t{16} << 20;  // bytes of any string, the output included
};

class ChatTemplate {
 public:
  // DIR/tokenizer_config.json's "chat_template" (a string, or a list of {name, template} from
  // which "default" is taken), else DIR/chat_template.jinja (newer transformers' file); the
  // special tokens from the same tokenizer_config.json. Throws naming the directory when there
  // is no template.
  static ChatTemplate from_model_dir(const std::string& dir);
  // Whether DIR has a chat template for from_model_dir to read (it may still fail to parse).
  static bool in_model_dir(const std::string& dir);

  // The special tokens a template may reference ("" renders as the empty string, as an absent
  // token does in transformers).
  struct SpecialTokens {
    std::string bos, eos, unk, pad;
  };
  // Parses `source` (throws Error "[chat_template] line N: ..." for what it cannot honour).
  ChatTemplate(const std::string& source, SpecialTokens tokens);

  // The conversation as text; add_generation_prompt appends the header of an assistant turn.
  // A template's raise_exception("...") throws Error "[chat_template] template raised: ...".
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     ChatTemplateLimits limits = {}) const;

  const std::string& source() const { return source_; }
  const SpecialTokens& special_tokens() const { return tokens_; }

  struct Program;  // the parsed template (chat_template.cc)

 private:
  std::string source_;
  SpecialTokens tokens_;
  std::shared_ptr<const Program> program_;
};

}  // namespace mammoth::data
