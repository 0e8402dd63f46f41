// Megatron-LM's indexed dataset: token sequences in PREFIX.bin, their index in PREFIX.idx.
//
// PREFIX.idx (little-endian, "MMIDIDX" format version 1):
//   9 bytes  magic "MMIDIDX\0\0"
//   u64      version = 1
//   u8       dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
//            8 uint16
//   u64      S = number of sequences
//   u64      D = number of entries in document_indices (documents + 1)
//   int32[S] sequence lengths, in elements
//   int64[S] sequence pointers, byte offsets into PREFIX.bin
//   int64[D] document indices: sequence index boundaries, starting with 0 and ending with S
// PREFIX.bin is the sequences' elements back to back. Files written by Megatron's
// preprocess_data.py (and by this writer) read as one another.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/mapped_file.h"

namespace mammoth::data {

enum class IndexedDType : uint8_t {
  kU8 = 1,
  kI8 = 2,
  kI16 = 3,
  kI32 = 4,
  kI64 = 5,
  kF64 = 6,
  kF32 = 7,
  kU16 = 8,
};

inline constexpr char kIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr size_t kIndexHeaderBytes = 9 + 8 + 1 + 8 + 8;

// Bytes per element; throws on an unknown code.
size_t indexed_dtype_size(IndexedDType t);
const char* indexed_dtype_name(IndexedDType t);
// The smallest integer dtype Megatron would pick for a vocabulary: uint16 below 65500, else int32.
IndexedDType indexed_dtype_for_vocab(int64_t vocab_size);

class IndexedDataset {
 public:
  IndexedDataset() = default;
  // Opens PREFIX.idx and PREFIX.bin. Throws mammoth::Error naming the file on a missing file,
  // bad magic, version or dtype, an index of the wrong size, or sequences that run past the end
  // of PREFIX.bin.
  static IndexedDataset open(const std::string& prefix);

  IndexedDType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_doc_indices_ - 1; }
  int64_t sequence_length(int64_t i) const;
  int64_t sequence_pointer(int64_t i) const;
  // Entry j of the document index, j in [0, num_documents()].
  int64_t document_index(int64_t j) const;
  // Sum of all sequence lengths.
  int64_t total_elements() const { return total_elements_; }

  // Copies elements [offset, offset + count) of sequence i, converted to int32 (integer dtypes
  // only; values outside int32 throw). count < 0 means to the end of the sequence.
  std::vector<int32_t> get(int64_t i, int64_t offset = 0, int64_t count = -1) const;
  void read(int64_t i, int64_t offset, int64_t count, int32_t* out) const;

 private:
  MappedFile idx_;
  MappedFile bin_;
  IndexedDType dtype_ = IndexedDType::kU16;
  int64_t num_sequences_ = 0;
  int64_t num_doc_indices_ = 0;
  int64_t total_elements_ = 0;
  // Arrays inside idx_; they start at byte 34, so they are read with memcpy (unaligned).
  const uint8_t* lengths_ = nullptr;
  const uint8_t* pointers_ = nullptr;
  const uint8_t* doc_indices_ = nullptr;
};

// Writes PREFIX.bin and PREFIX.idx (each to a temporary name, renamed by finalize()).
class IndexedDatasetWriter {
 public:
  // Integer dtypes only.
  IndexedDatasetWriter(const std::string& prefix, IndexedDType dtype);

  // Appends one sequence; values must fit the dtype.
  void add_sequence(const int32_t* tokens, int64_t count);
  void add_sequence(const std::vector<int32_t>& tokens) {
    add_sequence(tokens.data(), static_cast<int64_t>(tokens.size()));
  }
  // Closes the current document: the sequences added since the last call form one document.
  void end_document();
  // A one-sequence document.
  void add_document(const std::vector<int32_t>& tokens) {
    add_sequence(tokens);
    end_document();
  }
  // Writes the index and renames both files into place. Sequences added after the last
  // end_document() form a final document.
  void finalize();

 private:
  std::string prefix_;
  IndexedDType dtype_;
  AtomicFileWriter bin_;
  std::vector<int32_t> lengths_;
  std::vector<int64_t> pointers_;
  std::vector<int64_t> doc_indices_{0};
  std::vector<uint8_t> buffer_;
  bool finalized_ = false;
};

}  // namespace mammoth::data
