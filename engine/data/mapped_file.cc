#include "engine/data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "base/error.h"

namespace mammoth::data {

MappedFile MappedFile::open(const std::string& path, const char* what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MAMMOTH_CHECK(fd >= 0) << "[" << what << "] cannot open '" << path
                         << "': " << std::strerror(errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd);
    MAMMOTH_THROW() << "[" << what << "] '" << path << "' is not a readable regular file"
                    << (err ? std::string(": ") + std::strerror(err) : std::string());
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(st.st_size);
  if (f.size_ > 0) {
    void* p = ::mmap(nullptr, f.size_, PROT_READ, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    MAMMOTH_CHECK(p != MAP_FAILED) << "[" << what << "] cannot mmap '" << path << "' (" << f.size_
                                   << " bytes): " << std::strerror(err);
    f.data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
  return f;
}

MappedFile::~MappedFile() { reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    reset();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::reset() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

AtomicFileWriter::AtomicFileWriter(const std::string& path, const char* what)
    : path_(path), tmp_(path + ".tmp"), what_(what) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MAMMOTH_CHECK(fd_ >= 0) << "[" << what_ << "] cannot create '" << tmp_
                          << "': " << std::strerror(errno);
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, size_t size) { write_at(written_, data, size); }

void AtomicFileWriter::write_at(uint64_t offset, const void* data, size_t size) {
  MAMMOTH_CHECK(fd_ >= 0) << "[" << what_ << "] write to '" << path_ << "' after commit";
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd_, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    MAMMOTH_CHECK(n > 0) << "[" << what_ << "] error writing '" << tmp_ << "' at byte " << offset
                         << ": " << std::strerror(errno);
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
    if (offset > written_) written_ = offset;
  }
}

void AtomicFileWriter::commit() {
  MAMMOTH_CHECK(fd_ >= 0) << "[" << what_ << "] '" << path_ << "' committed twice";
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    MAMMOTH_THROW() << "[" << what_ << "] error closing '" << tmp_ << "': " << std::strerror(err);
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    MAMMOTH_THROW() << "[" << what_ << "] cannot rename '" << tmp_ << "' to '" << path_
                    << "': " << std::strerror(err);
  }
}

void write_file_atomic(const std::string& path, const void* data, size_t size, const char* what) {
  AtomicFileWriter w(path, what);
  w.write(data, size);
  w.commit();
}

}  // namespace mammoth::data
