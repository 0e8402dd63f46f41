// libFuzzer target: BERT WordPiece vocab.txt (+ tokenizer_config.json) loading, then encoding
// arbitrary bytes. Input layout: vocab.txt bytes, optionally "\n--config--\n" and
// tokenizer_config.json bytes, optionally "\n--text--\n" and a text. A vocabulary that loads
// must encode the text (or, without one, the vocabulary file itself) to ids inside the
// vocabulary, or refuse it as invalid UTF-8; nothing else may escape.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "engine/data/wordpiece.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(bytes), size);
  std::string_view vocab, rest, config, text;
  mammoth::fuzz::split_once(all, "\n--text--\n", &rest, &text);
  mammoth::fuzz::split_once(rest, "\n--config--\n", &vocab, &config);
  const bool has_text = all.find("\n--text--\n") != std::string_view::npos;
  const bool has_config = rest.find("\n--config--\n") != std::string_view::npos;
  const std::string vpath = mammoth::fuzz::write_scratch("vocab.txt", vocab.data(), vocab.size());
  const std::string dir = std::filesystem::path(vpath).parent_path().string();
  if (has_config) {
    mammoth::fuzz::write_scratch("tokenizer_config.json", config.data(), config.size());
  } else {
    std::error_code ec;
    std::filesystem::remove(dir + "/tokenizer_config.json", ec);
  }
  try {
    const auto wp = mammoth::data::WordPiece::from_directory(dir);
    const std::string input(has_text ? text : vocab);
    for (int32_t id : wp.encode(input, "fuzz")) {
      if (id < 0 || id >= wp.vocab_size()) mammoth::fuzz::invariant_failed("wordpiece: id range");
    }
  } catch (const mammoth::Error&) {
  }
  return 0;
}
