// libFuzzer target: GPT-2 BPE vocab.json + merges.txt loading, then encoding. Input layout:
// vocab.json bytes, a line "\n--merges--\n", merges.txt bytes, optionally "\n--text--\n" and a
// text to encode. A tokenizer that loads must encode the text (or, without one, the merges
// file) to ids that decode back to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "engine/data/bpe.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(bytes), size);
  std::string_view vocab, rest, merges, text;
  mammoth::fuzz::split_once(all, "\n--merges--\n", &vocab, &rest);
  mammoth::fuzz::split_once(rest, "\n--text--\n", &merges, &text);
  const bool has_text = rest.find("\n--text--\n") != std::string_view::npos;
  const std::string vpath = mammoth::fuzz::write_scratch("vocab.json", vocab.data(), vocab.size());
  const std::string mpath =
      mammoth::fuzz::write_scratch("merges.txt", merges.data(), merges.size());
  try {
    auto tok = mammoth::data::BpeTokenizer::load(vpath, mpath);
    const std::string input(has_text ? text : merges);
    const std::vector<int32_t> ids = tok.encode(input);
    if (tok.decode(ids) != input) mammoth::fuzz::invariant_failed("bpe: decode(encode(t)) != t");
    for (int32_t id : ids) {
      if (id < 0 || id >= tok.vocab_size()) mammoth::fuzz::invariant_failed("bpe: id range");
    }
    std::vector<std::string_view> pieces = mammoth::data::pretokenize(input);
    size_t total = 0;
    for (std::string_view p : pieces) {
      if (p.empty()) mammoth::fuzz::invariant_failed("bpe: empty pre-token");
      total += p.size();
    }
    if (total != input.size()) mammoth::fuzz::invariant_failed("bpe: pre-tokens lose bytes");
  } catch (const mammoth::Error&) {
  }
  return 0;
}
