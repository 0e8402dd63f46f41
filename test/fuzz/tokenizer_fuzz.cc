// libFuzzer target: Hugging Face tokenizer.json loading (engine/data/tokenizer.h), then encoding
// and decoding. Input layout: tokenizer.json bytes, optionally "\n--text--\n" and a text. A
// tokenizer that loads must encode the text (with and without special tokens) to ids inside its
// vocabulary and decode them without anything but mammoth::Error; the text's Llama 3 / Qwen2
// pre-tokens must cover it without empty pieces, and NFC must be idempotent on it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "engine/data/bpe.h"
#include "engine/data/tokenizer.h"
#include "engine/data/unicode_class.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(bytes), size);
  std::string_view json, text;
  mammoth::fuzz::split_once(all, "\n--text--\n", &json, &text);
  const std::string input(text);
  for (int digits : {1, 3}) {
    size_t pos = 0;
    while (pos < input.size()) {
      const size_t end = mammoth::data::next_pretoken_llama3(input, pos, digits);
      if (end <= pos || end > input.size()) {
        mammoth::fuzz::invariant_failed("tokenizer: Llama 3 pre-token empty or past the end");
      }
      pos = end;
    }
  }
  const std::string once = mammoth::data::nfc(input);
  if (mammoth::data::nfc(once) != once) mammoth::fuzz::invariant_failed("tokenizer: NFC twice");
  const std::string path = mammoth::fuzz::write_scratch("tokenizer.json", json.data(), json.size());
  try {
    const auto tok = mammoth::data::Tokenizer::from_json_file(path);
    for (bool special : {false, true}) {
      const std::vector<int32_t> ids = tok.encode(input, special);
      for (int32_t id : ids) {
        if (id < 0 || id >= tok.vocab_size()) mammoth::fuzz::invariant_failed("tokenizer: id");
      }
      try {
        tok.decode(ids, special);
      } catch (const mammoth::Error&) {
      }
    }
  } catch (const mammoth::Error&) {
  }
  return 0;
}
