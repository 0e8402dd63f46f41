// Read-only memory maps and atomic file writes shared by the token data formats.
//
// Training reads token files far larger than memory in random order; mmap lets the page cache
// do the work and costs nothing for files that are never touched. Writers write to
// "<path>.tmp" and rename, so a crash never leaves a half-written file under the real name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace mammoth::data {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps the whole file read-only; throws mammoth::Error naming the path when it cannot.
  // `what` names the caller in messages, e.g. "token_shard".
  static MappedFile open(const std::string& path, const char* what);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void reset();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Writes `size` bytes to "<path>.tmp", then renames it to `path`.
void write_file_atomic(const std::string& path, const void* data, size_t size, const char* what);

// Streams a file to "<path>.tmp" and renames it to `path` on commit(); a writer destroyed
// without commit() removes the temporary file.
class AtomicFileWriter {
 public:
  AtomicFileWriter(const std::string& path, const char* what);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t size);
  // Overwrites bytes already written (for headers whose counts are known only at the end).
  void write_at(uint64_t offset, const void* data, size_t size);
  uint64_t bytes_written() const { return written_; }
  void commit();

 private:
  std::string path_;
  std::string tmp_;
  const char* what_;
  int fd_ = -1;
  uint64_t written_ = 0;
};

}  // namespace mammoth::data
