// libFuzzer target: the chat-template interpreter (engine/data/chat_template.h), which runs
// Jinja from downloaded tokenizer_config.json files. The input is the template; it renders a few
// fixed conversations both ways. A template may be refused (Error) or render; nothing else may
// escape, and rendering stays bounded (the interpreter's own limits, or libFuzzer's timeout and
// memory limit find it). The limits are lowered to 2^14 units of work and 1 MiB of text: at the
// defaults (2^19, 16 MiB) a few percent of inputs ran to the limit, each for ~0.3 s a render
// under the sanitizers, and took most of the fuzzer's time; the same code paths, the limit checks
// included, are reached at the lower limits (docs/FUZZING.md).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/data/chat_template.h"
#include "test/fuzz/fuzz_util.h"

using mammoth::data::ChatMessage;
using mammoth::data::ChatTemplate;
using mammoth::data::ChatTemplateLimits;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  std::vector<std::vector<ChatMessage>> chats = {
      {},
      {{"user", "Hi"}},
      {{"system", "Be brief."}, {"user", "2+2?"}, {"assistant", "4"}, {"user", "{{ x }}"}},
  };
  const ChatTemplateLimits limits{.work = int64_t{1} << 14, .text = size_t{1} << 20};
  try {
    const ChatTemplate t(source, {.bos = "<s>", .eos = "</s>", .unk = "", .pad = ""});
    for (const auto& chat : chats) {
      for (const bool prompt : {false, true}) {
        try {
          (void)t.render(chat, prompt, limits);
        } catch (const mammoth::Error&) {
        }
      }
    }
  } catch (const mammoth::Error&) {
  }
  return 0;
}
