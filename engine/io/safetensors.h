// Reading and writing safetensors files (Hugging Face's weight format), independent of Tensor.
//
// Layout of a file:
//   u64 little-endian N | N bytes of UTF-8 JSON header | data section
// The header maps each tensor name to {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}
// (offsets are relative to the start of the data section) and may hold "__metadata__", a map of
// strings. Like the reference implementation, the reader requires the tensors, sorted by offset,
// to tile the data section exactly: no gaps, no overlaps, nothing after the last tensor.
//
//   io::SafetensorsFile f = io::SafetensorsFile::open("model.safetensors");
//   for (const std::string& name : f.names()) {
//     const io::TensorView& t = f.get(name);  // t.data points into the read-only mapping
//   }
//   io::write_safetensors("out.safetensors", {{"w", DType::kF32, {2, 3}, bytes, 24}});
//
// Every malformed file gives mammoth::Error naming the file (and the tensor); the reader never
// reads outside the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/dtype.h"

namespace mammoth::io {

// A tensor's description and a pointer to its bytes (C order, little endian). Views returned by
// SafetensorsFile point into its mapping and live as long as the file object. `data` is aligned
// to the dtype only if the writer ordered tensors by decreasing element size (the reference
// writer does; write_safetensors keeps the caller's order).
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // [] is a scalar
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
};

// The reference implementation's limit on the header size.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// A tensor's bytes (elements times dtype size) into *out; false for a negative dimension or when
// the product overflows uint64, so sizes read from a file can be checked before use.
bool tensor_bytes(const std::vector<int64_t>& shape, DType dtype, uint64_t* out);

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates the whole header.
  static SafetensorsFile open(const std::string& path);
  // Validates a safetensors image already in memory; the caller keeps `bytes` alive while the
  // result is used. `what` names the source in errors.
  static SafetensorsFile from_memory(const uint8_t* bytes, size_t size, const std::string& what);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // Tensor names in file order (by data offset).
  const std::vector<std::string>& names() const { return names_; }
  // All tensors in file order.
  const std::vector<TensorView>& tensors() const { return tensors_; }
  size_t size() const { return tensors_.size(); }
  // Throws Error naming the tensor and the file when absent.
  const TensorView& get(const std::string& name) const;
  // nullptr when absent.
  const TensorView* find(const std::string& name) const;
  // The "__metadata__" map (empty when the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Byte offset of the data section in the file (8 + header length), e.g. for direct I/O.
  size_t data_offset() const { return data_offset_; }
  size_t file_size() const { return size_; }

 private:
  SafetensorsFile() = default;
  void parse();
  void release();

  std::string path_;
  const uint8_t* bytes_ = nullptr;  // the whole file
  size_t size_ = 0;
  bool mapped_ = false;  // bytes_ is our mmap and must be unmapped
  size_t data_offset_ = 0;
  std::vector<TensorView> tensors_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` in the given order to `path` atomically: the bytes go to `path + ".tmp"`, are
// fsynced, and the temporary file is renamed over `path`. The header is padded with spaces to a
// multiple of 8 bytes, as the reference writer does, so the data section starts 8-aligned.
// Throws Error for duplicate or reserved names, nbytes that disagree with dtype and shape, and
// failed system calls (the temporary file is removed).
void write_safetensors(const std::string& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace mammoth::io
