// libFuzzer target: llm.c token shard files (256-int32 header + uint16 or uint32 tokens). The
// input is the whole file; a shard that opens must read back every token through TokenDataset
// (or refuse a uint32 id above INT32_MAX).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/data/token_shard.h"
#include "test/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = mammoth::fuzz::write_scratch("shard.bin", data, size);
  try {
    auto ds = mammoth::data::TokenDataset::open(std::vector<std::string>{path, path});
    const int64_t n = ds.shard(0).size();
    const int width = ds.shard(0).token_bytes();
    if (ds.size() != 2 * n || (width != 2 && width != 4) ||
        static_cast<size_t>(n) * width + mammoth::data::kShardHeaderBytes != size) {
      mammoth::fuzz::invariant_failed("token_shard: size disagrees with the file");
    }
    std::vector<int32_t> all(static_cast<size_t>(ds.size()));
    ds.read(0, ds.size(), all.data());
    for (int64_t i = 0; i < n; ++i) {
      uint32_t expect = 0;
      std::memcpy(&expect, data + mammoth::data::kShardHeaderBytes + width * i, width);
      if (static_cast<uint32_t>(all[i]) != expect || static_cast<uint32_t>(all[n + i]) != expect ||
          ds.at(n + i) != expect) {
        mammoth::fuzz::invariant_failed("token_shard: tokens differ from the file");
      }
    }
    try {
      ds.read(ds.size() - 1, 2, all.data());  // one past the end: must be refused
      mammoth::fuzz::invariant_failed("token_shard: read past the end accepted");
    } catch (const mammoth::Error&) {
    }
  } catch (const mammoth::Error&) {
  }
  return 0;
}
