// SwapDir: the NVMe tier's files under --nvme-dir, checked at start-up and removed at the end.
//
// A full disk or a bad directory must stop a job before its first step, not hours into it.
// The constructor therefore checks that the directory exists, is a directory, is writable,
// accepts O_DIRECT, and has `required_bytes` free (statvfs: blocks available to unprivileged
// users), throwing mammoth::Error that names --nvme-dir, the path and the sizes. Files are
// created in a private subdirectory (mammoth-swap-<pid>-XXXXXX) and preallocated with
// fallocate(), so their space is owned from the start and a later write cannot hit ENOSPC.
//
// The subdirectory and everything in it are removed by the destructor and, for a process that
// leaves through exit() with the SwapDir still alive, by an atexit hook. (A SIGKILL leaves it
// behind; the pid in its name says whose it was.)
#pragma once

#include <cstdint>
#include <string>

namespace mammoth::memory::io {

class SwapDir {
 public:
  // `root` is the user's --nvme-dir. required_bytes >= 0.
  SwapDir(const std::string& root, int64_t required_bytes);
  ~SwapDir();
  SwapDir(const SwapDir&) = delete;
  SwapDir& operator=(const SwapDir&) = delete;

  const std::string& root() const { return root_; }
  // The private subdirectory holding this process's files.
  const std::string& path() const { return path_; }

  // Creates `name` in path() with `reserve_bytes` allocated on disk (fallocate; where the
  // filesystem cannot preallocate, the file is only sized). Returns the full path. Throws Error
  // naming the file and the sizes when the space is not there.
  std::string create_file(const std::string& name, int64_t reserve_bytes);
  // Removes a file created by create_file (missing is not an error).
  void remove_file(const std::string& name);

  // Bytes available to unprivileged users on the filesystem holding `dir` (statvfs). Throws
  // Error naming the path when statvfs fails.
  static int64_t free_bytes(const std::string& dir);

 private:
  std::string root_;
  std::string path_;
};

// "1.50 GiB (1610612736 bytes)": sizes in errors, readable and exact.
std::string format_bytes(int64_t bytes);

}  // namespace mammoth::memory::io
