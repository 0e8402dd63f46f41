#include "engine/data/indexed_dataset.h"

#include <bit>
#include <cstring>
#include <limits>

#include "base/error.h"

namespace mammoth::data {

static_assert(std::endian::native == std::endian::little,
              "indexed datasets are little-endian and read in place");

namespace {

bool valid_code(uint8_t code) { return code >= 1 && code <= 8; }

bool is_integer(IndexedDType t) { return t != IndexedDType::kF32 && t != IndexedDType::kF64; }

template <typename T>
T load(const uint8_t* p, int64_t i) {
  T v;
  std::memcpy(&v, p + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
}

// Element i of a .bin sequence as int64 (integer dtypes).
int64_t element(IndexedDType t, const uint8_t* p, int64_t i) {
  switch (t) {
    case IndexedDType::kU8:
      return load<uint8_t>(p, i);
    case IndexedDType::kI8:
      return load<int8_t>(p, i);
    case IndexedDType::kI16:
      return load<int16_t>(p, i);
    case IndexedDType::kI32:
      return load<int32_t>(p, i);
    case IndexedDType::kI64:
      return load<int64_t>(p, i);
    case IndexedDType::kU16:
      return load<uint16_t>(p, i);
    case IndexedDType::kF32:
    case IndexedDType::kF64:
      break;
  }
  MAMMOTH_THROW() << "[indexed_dataset] element of floating dtype " << indexed_dtype_name(t)
                  << " read as a token id";
}

}  // namespace

size_t indexed_dtype_size(IndexedDType t) {
  switch (t) {
    case IndexedDType::kU8:
    case IndexedDType::kI8:
      return 1;
    case IndexedDType::kI16:
    case IndexedDType::kU16:
      return 2;
    case IndexedDType::kI32:
    case IndexedDType::kF32:
      return 4;
    case IndexedDType::kI64:
    case IndexedDType::kF64:
      return 8;
  }
  MAMMOTH_THROW() << "[indexed_dataset] unknown dtype code " << static_cast<int>(t);
}

const char* indexed_dtype_name(IndexedDType t) {
  switch (t) {
    case IndexedDType::kU8:
      return "uint8";
    case IndexedDType::kI8:
      return "int8";
    case IndexedDType::kI16:
      return "int16";
    case IndexedDType::kI32:
      return "int32";
    case IndexedDType::kI64:
      return "int64";
    case IndexedDType::kF64:
      return "float64";
    case IndexedDType::kF32:
      return "float32";
    case IndexedDType::kU16:
      return "uint16";
  }
  return "unknown";
}

IndexedDType indexed_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexedDType::kU16 : IndexedDType::kI32;
}

IndexedDataset IndexedDataset::open(const std::string& prefix) {
  IndexedDataset d;
  const std::string idx_path = prefix + ".idx";
  const std::string bin_path = prefix + ".bin";
  d.idx_ = MappedFile::open(idx_path, "indexed_dataset");
  d.bin_ = MappedFile::open(bin_path, "indexed_dataset");
  const uint8_t* p = d.idx_.data();
  const size_t n = d.idx_.size();
  MAMMOTH_CHECK(n >= kIndexHeaderBytes)
      << "[indexed_dataset] '" << idx_path << "' is truncated: " << n << " bytes, less than the "
      << kIndexHeaderBytes << "-byte header";
  MAMMOTH_CHECK(std::memcmp(p, kIndexMagic, sizeof(kIndexMagic)) == 0)
      << "[indexed_dataset] '" << idx_path
      << "' is not a Megatron index: it does not start with \"MMIDIDX\\0\\0\"";
  const uint64_t version = load<uint64_t>(p + 9, 0);
  MAMMOTH_CHECK(version == kIndexVersion) << "[indexed_dataset] '" << idx_path << "' has version "
                                          << version << ", expected " << kIndexVersion;
  const uint8_t code = p[17];
  MAMMOTH_CHECK(valid_code(code)) << "[indexed_dataset] '" << idx_path << "' has dtype code "
                                  << static_cast<int>(code) << ", expected 1..8";
  d.dtype_ = static_cast<IndexedDType>(code);
  const uint64_t seqs = load<uint64_t>(p + 18, 0);
  const uint64_t docs = load<uint64_t>(p + 26, 0);
  // Bound the counts before multiplying so a corrupt header cannot overflow the size check.
  MAMMOTH_CHECK(seqs <= n && docs <= n && docs >= 1)
      << "[indexed_dataset] '" << idx_path << "' has implausible counts: " << seqs << " sequences, "
      << docs << " document indices, in a " << n << "-byte file";
  const uint64_t expected = kIndexHeaderBytes + seqs * (4 + 8) + docs * 8;
  MAMMOTH_CHECK(n == expected) << "[indexed_dataset] '" << idx_path << "': the header promises "
                               << seqs << " sequences and " << docs << " document indices ("
                               << expected << " bytes) but the file has " << n << " bytes"
                               << (n < expected ? " (truncated)" : " (trailing bytes)");
  d.num_sequences_ = static_cast<int64_t>(seqs);
  d.num_doc_indices_ = static_cast<int64_t>(docs);
  d.lengths_ = p + kIndexHeaderBytes;
  d.pointers_ = d.lengths_ + seqs * 4;
  d.doc_indices_ = d.pointers_ + seqs * 8;

  const int64_t item = static_cast<int64_t>(indexed_dtype_size(d.dtype_));
  const int64_t bin_bytes = static_cast<int64_t>(d.bin_.size());
  for (int64_t i = 0; i < d.num_sequences_; ++i) {
    const int64_t len = load<int32_t>(d.lengths_, i);
    const int64_t ptr = load<int64_t>(d.pointers_, i);
    // ptr + len * item would overflow for a pointer near INT64_MAX and wrap inside the file.
    const bool past_end = ptr > bin_bytes || (ptr >= 0 && len * item > bin_bytes - ptr);
    MAMMOTH_CHECK(len >= 0 && ptr >= 0 && ptr % item == 0 && !past_end)
        << "[indexed_dataset] sequence " << i << " (" << len << " elements at byte " << ptr
        << ") lies outside '" << bin_path << "' (" << bin_bytes << " bytes"
        << (past_end ? ", truncated?" : "") << ")";
    d.total_elements_ += len;
  }
  int64_t prev = 0;
  for (int64_t j = 0; j < d.num_doc_indices_; ++j) {
    const int64_t v = load<int64_t>(d.doc_indices_, j);
    MAMMOTH_CHECK(v >= prev && v <= d.num_sequences_ && (j > 0 || v == 0))
        << "[indexed_dataset] '" << idx_path << "': document index " << j << " is " << v
        << "; expected non-decreasing values from 0 up to " << d.num_sequences_;
    prev = v;
  }
  return d;
}

int64_t IndexedDataset::sequence_length(int64_t i) const {
  MAMMOTH_CHECK(i >= 0 && i < num_sequences_)
      << "[indexed_dataset] sequence " << i << " is outside [0, " << num_sequences_ << ")";
  return load<int32_t>(lengths_, i);
}

int64_t IndexedDataset::sequence_pointer(int64_t i) const {
  MAMMOTH_CHECK(i >= 0 && i < num_sequences_)
      << "[indexed_dataset] sequence " << i << " is outside [0, " << num_sequences_ << ")";
  return load<int64_t>(pointers_, i);
}

int64_t IndexedDataset::document_index(int64_t j) const {
  MAMMOTH_CHECK(j >= 0 && j < num_doc_indices_)
      << "[indexed_dataset] document index " << j << " is outside [0, " << num_doc_indices_ << ")";
  return load<int64_t>(doc_indices_, j);
}

void IndexedDataset::read(int64_t i, int64_t offset, int64_t count, int32_t* out) const {
  const int64_t len = sequence_length(i);
  MAMMOTH_CHECK(offset >= 0 && count >= 0 && offset + count <= len)
      << "[indexed_dataset] elements [" << offset << ", " << offset + count << ") of sequence " << i
      << " are outside its length " << len;
  MAMMOTH_CHECK(is_integer(dtype_))
      << "[indexed_dataset] dtype " << indexed_dtype_name(dtype_) << " holds no token ids";
  const uint8_t* base = bin_.data() + sequence_pointer(i);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t v = element(dtype_, base, offset + k);
    MAMMOTH_CHECK(v >= std::numeric_limits<int32_t>::min() &&
                  v <= std::numeric_limits<int32_t>::max())
        << "[indexed_dataset] element " << offset + k << " of sequence " << i << " is " << v
        << ", outside int32";
    out[k] = static_cast<int32_t>(v);
  }
}

std::vector<int32_t> IndexedDataset::get(int64_t i, int64_t offset, int64_t count) const {
  if (count < 0) count = sequence_length(i) - offset;
  std::vector<int32_t> out(static_cast<size_t>(std::max<int64_t>(count, 0)));
  read(i, offset, count, out.data());
  return out;
}

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, IndexedDType dtype)
    : prefix_(prefix), dtype_(dtype), bin_(prefix + ".bin", "indexed_dataset") {
  MAMMOTH_CHECK(valid_code(static_cast<uint8_t>(dtype)) && is_integer(dtype))
      << "[indexed_dataset] writer dtype code " << static_cast<int>(dtype)
      << " is not an integer dtype";
}

void IndexedDatasetWriter::add_sequence(const int32_t* tokens, int64_t count) {
  MAMMOTH_CHECK(!finalized_) << "[indexed_dataset] '" << prefix_ << "': add after finalize()";
  MAMMOTH_CHECK(count >= 0 && count <= std::numeric_limits<int32_t>::max())
      << "[indexed_dataset] sequence of " << count << " elements does not fit the int32 length";
  const size_t item = indexed_dtype_size(dtype_);
  buffer_.resize(static_cast<size_t>(count) * item);
  int64_t lo = 0, hi = 0;
  switch (dtype_) {
    case IndexedDType::kU8:
      lo = 0, hi = 255;
      break;
    case IndexedDType::kI8:
      lo = -128, hi = 127;
      break;
    case IndexedDType::kI16:
      lo = -32768, hi = 32767;
      break;
    case IndexedDType::kU16:
      lo = 0, hi = 65535;
      break;
    default:
      lo = std::numeric_limits<int32_t>::min(), hi = std::numeric_limits<int32_t>::max();
  }
  for (int64_t k = 0; k < count; ++k) {
    const int64_t v = tokens[k];
    MAMMOTH_CHECK(v >= lo && v <= hi) << "[indexed_dataset] value " << v << " at position " << k
                                      << " does not fit dtype " << indexed_dtype_name(dtype_);
    uint8_t* dst = buffer_.data() + k * item;
    switch (dtype_) {
      case IndexedDType::kU8:
      case IndexedDType::kI8:
        *dst = static_cast<uint8_t>(v);
        break;
      case IndexedDType::kI16:
      case IndexedDType::kU16: {
        const uint16_t x = static_cast<uint16_t>(v);
        std::memcpy(dst, &x, 2);
        break;
      }
      case IndexedDType::kI32: {
        const int32_t x = static_cast<int32_t>(v);
        std::memcpy(dst, &x, 4);
        break;
      }
      default:
        std::memcpy(dst, &v, 8);
        break;
    }
  }
  pointers_.push_back(static_cast<int64_t>(bin_.bytes_written()));
  lengths_.push_back(static_cast<int32_t>(count));
  bin_.write(buffer_.data(), buffer_.size());
}

void IndexedDatasetWriter::end_document() {
  doc_indices_.push_back(static_cast<int64_t>(lengths_.size()));
}

void IndexedDatasetWriter::finalize() {
  MAMMOTH_CHECK(!finalized_) << "[indexed_dataset] '" << prefix_ << "' finalized twice";
  if (doc_indices_.back() != static_cast<int64_t>(lengths_.size())) end_document();
  AtomicFileWriter idx(prefix_ + ".idx", "indexed_dataset");
  idx.write(kIndexMagic, sizeof(kIndexMagic));
  const uint64_t version = kIndexVersion;
  idx.write(&version, 8);
  const uint8_t code = static_cast<uint8_t>(dtype_);
  idx.write(&code, 1);
  const uint64_t seqs = lengths_.size(), docs = doc_indices_.size();
  idx.write(&seqs, 8);
  idx.write(&docs, 8);
  idx.write(lengths_.data(), lengths_.size() * sizeof(int32_t));
  idx.write(pointers_.data(), pointers_.size() * sizeof(int64_t));
  idx.write(doc_indices_.data(), doc_indices_.size() * sizeof(int64_t));
  bin_.commit();
  idx.commit();
  finalized_ = true;
}

}  // namespace mammoth::data
