// Shared helpers for the libFuzzer targets in test/fuzz (built by tools/fuzz.sh, not Bazel).
//
// Most of our readers take a path and mmap it, so a target writes its input to a file in a
// per-process scratch directory (on tmpfs when /dev/shm is writable, so no disk I/O) and calls
// the reader on that path. A mammoth::Error is a clean refusal; anything else that escapes the
// target (another exception, a crash, a sanitizer report, a failed invariant) is a finding.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace mammoth::fuzz {

// The scratch directory, created on first use and removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string base = "/dev/shm";
    if (::access(base.c_str(), W_OK) != 0) {
      const char* t = std::getenv("TMPDIR");
      base = t ? t : "/tmp";
    }
    std::string pattern = base + "/mammoth_fuzz.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    static std::string* path = new std::string(pattern);
    std::atexit([] {
      std::string cmd = "rm -rf '" + *path + "'";
      if (std::system(cmd.c_str()) != 0) {
      }
    });
    return pattern;
  }();
  return dir;
}

// Writes `bytes` to scratch_dir()/name (replacing it) and returns the path.
inline std::string write_scratch(const std::string& name, const void* bytes, size_t size) {
  const std::string path = scratch_dir() + "/" + name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::perror(path.c_str());
    std::abort();
  }
  const char* p = static_cast<const char*>(bytes);
  while (size > 0) {
    const ssize_t w = ::write(fd, p, size);
    if (w <= 0) {
      std::perror("write");
      std::abort();
    }
    p += w;
    size -= static_cast<size_t>(w);
  }
  ::close(fd);
  return path;
}

// A failed invariant: print and abort, so libFuzzer records the input as a crash.
[[noreturn]] inline void invariant_failed(const char* what) {
  std::fprintf(stderr, "fuzz invariant failed: %s\n", what);
  std::abort();
}

// Reads every byte of [p, p + n) so that ASan sees an out-of-bounds view.
inline uint64_t touch(const uint8_t* p, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; ++i) sum += p[i];
  return sum;
}

// Splits `data` at the first occurrence of `sep`: the part before it, and after it (empty when
// `sep` is absent).
inline void split_once(std::string_view data, std::string_view sep, std::string_view* head,
                       std::string_view* tail) {
  const size_t at = data.find(sep);
  if (at == std::string_view::npos) {
    *head = data;
    *tail = {};
  } else {
    *head = data.substr(0, at);
    *tail = data.substr(at + sep.size());
  }
}

}  // namespace mammoth::fuzz
