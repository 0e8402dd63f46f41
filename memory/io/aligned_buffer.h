// AlignedBuffer: an owned, zero-initialised host buffer aligned for O_DIRECT I/O.
//
// O_DIRECT transfers need the buffer address, the file offset and the length aligned to the
// device's logical block; Mammoth uses 4 KiB everywhere (kBlockSize in async_io.h), which
// satisfies every block device and also matches a page, so registered buffers pin whole pages.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "base/error.h"

namespace mammoth::memory::io {

class AlignedBuffer {
 public:
  static constexpr size_t kDefaultAlignment = 4096;

  AlignedBuffer() = default;
  // `size` bytes rounded up to a multiple of `alignment` (a power of two, >= sizeof(void*)).
  explicit AlignedBuffer(size_t size, size_t alignment = kDefaultAlignment) {
    MAMMOTH_CHECK(alignment >= sizeof(void*) && (alignment & (alignment - 1)) == 0)
        << "[AlignedBuffer] alignment must be a power of two >= " << sizeof(void*) << ", got "
        << alignment;
    size_ = (size + alignment - 1) / alignment * alignment;
    if (size_ == 0) return;
    void* p = nullptr;
    const int rc = ::posix_memalign(&p, alignment, size_);
    MAMMOTH_CHECK(rc == 0) << "[AlignedBuffer] cannot allocate " << size_ << " bytes aligned to "
                           << alignment << ": " << std::strerror(rc);
    // Touching every page now keeps page faults out of timed I/O and makes reads of never-filled
    // bytes deterministic.
    std::memset(p, 0, size_);
    data_ = static_cast<char*>(p);
  }
  ~AlignedBuffer() { std::free(data_); }

  AlignedBuffer(AlignedBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept {
    if (this != &other) {
      std::free(data_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  char* data() { return data_; }
  const char* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mammoth::memory::io
