// libFuzzer target: Megatron indexed datasets (PREFIX.idx + PREFIX.bin). Input layout: a
// little-endian u16 B, then the .idx bytes, then the last min(B, rest) bytes are the .bin.
// A dataset that opens must read every sequence (integer dtypes) without leaving the .bin.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/data/indexed_dataset.h"
#include "test/fuzz/fuzz_util.h"

namespace data = mammoth::data;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  if (size < 2) return 0;
  const size_t want_bin = bytes[0] | (size_t{bytes[1]} << 8);
  const uint8_t* rest = bytes + 2;
  const size_t rest_size = size - 2;
  const size_t bin_size = std::min(want_bin, rest_size);
  const size_t idx_size = rest_size - bin_size;
  mammoth::fuzz::write_scratch("ds.idx", rest, idx_size);
  const std::string bin = mammoth::fuzz::write_scratch("ds.bin", rest + idx_size, bin_size);
  const std::string prefix = bin.substr(0, bin.size() - 4);
  try {
    auto d = data::IndexedDataset::open(prefix);
    int64_t total = 0;
    for (int64_t i = 0; i < d.num_sequences(); ++i) total += d.sequence_length(i);
    if (total != d.total_elements()) {
      mammoth::fuzz::invariant_failed("indexed_dataset: total_elements");
    }
    for (int64_t j = 0; j <= d.num_documents(); ++j) (void)d.document_index(j);
    const bool integer =
        d.dtype() != data::IndexedDType::kF32 && d.dtype() != data::IndexedDType::kF64;
    // Bounded work per input: sequences may repeat one region of the .bin many times.
    int64_t budget = 1 << 16;
    for (int64_t i = 0; i < d.num_sequences() && budget > 0; ++i) {
      const int64_t len = std::min<int64_t>(d.sequence_length(i), budget);
      budget -= len + 1;
      try {
        std::vector<int32_t> v = d.get(i, 0, len);
        if (!integer) mammoth::fuzz::invariant_failed("indexed_dataset: float read as ids");
      } catch (const mammoth::Error&) {
        // float dtypes and int64 values outside int32 are refused
      }
    }
  } catch (const mammoth::Error&) {
  }
  return 0;
}
