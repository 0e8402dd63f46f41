// Tests for engine/data/indexed_dataset: Megatron's MMIDIDX .bin/.idx round trip and errors.
// Byte-level agreement with a numpy writer/reader is in format_interop_test.py.
#include "engine/data/indexed_dataset.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <limits>

#include "base/error.h"
#include "test/testing/test_dir.h"

namespace mammoth::data {
namespace {

using mammoth::testing::TestDir;

TEST_CASE("indexed dataset round trip with multi-sequence documents") {
  for (IndexedDType dtype : {IndexedDType::kU16, IndexedDType::kI32, IndexedDType::kU8,
                             IndexedDType::kI64, IndexedDType::kI16}) {
    TestDir dir;
    const std::string prefix = dir.file("ds");
    const int32_t hi = dtype == IndexedDType::kU8    ? 255
                       : dtype == IndexedDType::kI16 ? 32767
                                                     : 60000;
    std::vector<std::vector<int32_t>> seqs = {{1, 2, 3}, {}, {hi, 0}, {7}, {9, 9, 9, 9}};
    IndexedDatasetWriter w(prefix, dtype);
    w.add_sequence(seqs[0]);
    w.add_sequence(seqs[1]);
    w.end_document();         // doc 0 = seqs 0, 1
    w.add_document(seqs[2]);  // doc 1
    w.add_sequence(seqs[3]);
    w.add_sequence(seqs[4]);  // doc 2, closed by finalize()
    w.finalize();

    const IndexedDataset d = IndexedDataset::open(prefix);
    CHECK(d.dtype() == dtype);
    REQUIRE(d.num_sequences() == 5);
    REQUIRE(d.num_documents() == 3);
    CHECK(d.document_index(0) == 0);
    CHECK(d.document_index(1) == 2);
    CHECK(d.document_index(2) == 3);
    CHECK(d.document_index(3) == 5);
    CHECK(d.total_elements() == 10);
    int64_t ptr = 0;
    for (int64_t i = 0; i < 5; ++i) {
      CHECK(d.sequence_length(i) == static_cast<int64_t>(seqs[i].size()));
      CHECK(d.sequence_pointer(i) == ptr);
      ptr += static_cast<int64_t>(seqs[i].size() * indexed_dtype_size(dtype));
      CHECK(d.get(i) == seqs[i]);
    }
    CHECK(d.get(4, 1, 2) == std::vector<int32_t>{9, 9});
    CHECK_THROWS_AS(d.get(4, 3, 2), Error);
    CHECK_THROWS_AS(d.get(5), Error);
    const std::string idx = testing::read_bytes(prefix + ".idx");
    CHECK(idx.substr(0, 9) == std::string("MMIDIDX\0\0", 9));
    CHECK(idx.size() == kIndexHeaderBytes + 5 * 12 + 4 * 8);
    CHECK(static_cast<uint8_t>(idx[17]) == static_cast<uint8_t>(dtype));
  }
  CHECK(indexed_dtype_for_vocab(50257) == IndexedDType::kU16);
  CHECK(indexed_dtype_for_vocab(128256) == IndexedDType::kI32);
}

TEST_CASE("writer rejects values outside the dtype") {
  TestDir dir;
  IndexedDatasetWriter w(dir.file("x"), IndexedDType::kU16);
  CHECK_THROWS_WITH(w.add_sequence(std::vector<int32_t>{1, 70000}),
                    Catch::Contains("70000") && Catch::Contains("uint16"));
  CHECK_THROWS_AS(IndexedDatasetWriter(dir.file("f"), IndexedDType::kF32), Error);
}

TEST_CASE("bad indexed datasets are errors naming the file") {
  TestDir dir;
  const std::string prefix = dir.file("ok");
  IndexedDatasetWriter w(prefix, IndexedDType::kU16);
  w.add_document({1, 2, 3, 4});
  w.add_document({5, 6});
  w.finalize();
  const std::string idx = testing::read_bytes(prefix + ".idx");
  const std::string bin = testing::read_bytes(prefix + ".bin");
  auto make = [&](const std::string& name, const std::string& i, const std::string& b) {
    dir.write(name + ".idx", i);
    dir.write(name + ".bin", b);
    return dir.file(name);
  };
  CHECK_THROWS_WITH(IndexedDataset::open(dir.file("absent")), Catch::Contains("absent.idx"));
  std::string magic = idx;
  magic[2] = 'X';
  CHECK_THROWS_WITH(IndexedDataset::open(make("magic", magic, bin)),
                    Catch::Contains("magic.idx") && Catch::Contains("MMIDIDX"));
  std::string version = idx;
  version[9] = 2;
  CHECK_THROWS_WITH(IndexedDataset::open(make("version", version, bin)),
                    Catch::Contains("version 2"));
  std::string dtype = idx;
  dtype[17] = 9;
  CHECK_THROWS_WITH(IndexedDataset::open(make("dtype", dtype, bin)),
                    Catch::Contains("dtype code 9"));
  CHECK_THROWS_WITH(IndexedDataset::open(make("tidx", idx.substr(0, idx.size() - 8), bin)),
                    Catch::Contains("tidx.idx") && Catch::Contains("truncated"));
  CHECK_THROWS_WITH(IndexedDataset::open(make("tbin", idx, bin.substr(0, bin.size() - 2))),
                    Catch::Contains("tbin.bin"));
  CHECK_THROWS_AS(IndexedDataset::open(make("tiny", idx.substr(0, 20), bin)), Error);
}

TEST_CASE("a sequence pointer near INT64_MAX is refused, not wrapped into the file") {
  // Found while fuzzing (test/fuzz/indexed_dataset_fuzz.cc): ptr + len * item overflowed, went
  // negative and passed the bounds check, so get() read at bin + 2^63 - 1.
  TestDir dir;
  const std::string prefix = dir.file("wrap");
  IndexedDatasetWriter w(prefix, IndexedDType::kU8);
  w.add_document({1});
  w.finalize();
  std::string idx = testing::read_bytes(prefix + ".idx");
  const int64_t ptr = std::numeric_limits<int64_t>::max();  // 1 element of 1 byte from here
  std::memcpy(&idx[kIndexHeaderBytes + 4], &ptr, 8);
  dir.write("wrap.idx", idx);
  CHECK_THROWS_WITH(IndexedDataset::open(prefix),
                    Catch::Contains("sequence 0") && Catch::Contains("wrap.bin"));
}

}  // namespace
}  // namespace mammoth::data
