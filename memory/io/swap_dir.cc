#include "memory/io/swap_dir.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "base/error.h"

namespace mammoth::memory::io {
namespace {

// Directories of live SwapDirs, removed by an atexit hook if the process exits while they live.
// An explicit process-wide singleton: exit() skips the destructors of stack objects.
struct LiveDirs {
  std::mutex mu;
  std::set<std::string> paths;
};

LiveDirs& live_dirs() {
  // Never destroyed, so the atexit hook can still use it after static destructors ran.
  static LiveDirs* dirs = new LiveDirs;
  return *dirs;
}

void remove_live_dirs() {
  LiveDirs& d = live_dirs();
  std::lock_guard<std::mutex> lock(d.mu);
  for (const std::string& p : d.paths) {
    std::error_code ec;
    std::filesystem::remove_all(p, ec);
  }
  d.paths.clear();
}

void track(const std::string& path) {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(remove_live_dirs); });
  LiveDirs& d = live_dirs();
  std::lock_guard<std::mutex> lock(d.mu);
  d.paths.insert(path);
}

void untrack(const std::string& path) {
  LiveDirs& d = live_dirs();
  std::lock_guard<std::mutex> lock(d.mu);
  d.paths.erase(path);
}

}  // namespace

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  char buf[96];
  if (u == 0) {
    std::snprintf(buf, sizeof(buf), "%lld bytes", static_cast<long long>(bytes));
  } else {
    std::snprintf(buf, sizeof(buf), "%.2f %s (%lld bytes)", v, units[u],
                  static_cast<long long>(bytes));
  }
  return buf;
}

int64_t SwapDir::free_bytes(const std::string& dir) {
  struct statvfs st {};
  MAMMOTH_CHECK(::statvfs(dir.c_str(), &st) == 0)
      << "[nvme] statvfs(" << dir << ") failed: " << std::strerror(errno);
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

SwapDir::SwapDir(const std::string& root, int64_t required_bytes) : root_(root) {
  MAMMOTH_CHECK(!root.empty()) << "[nvme] --nvme-dir is empty: name a directory on an NVMe drive";
  MAMMOTH_CHECK(required_bytes >= 0)
      << "[nvme] required space must be >= 0, got " << required_bytes;
  struct stat st {};
  if (::stat(root.c_str(), &st) != 0) {
    MAMMOTH_THROW() << "[nvme] --nvme-dir " << root << " is not usable: " << std::strerror(errno)
                    << (errno == ENOENT ? " (create it first, on a disk with "
                                        : " (it must be a writable directory with ")
                    << format_bytes(required_bytes) << " free)";
  }
  MAMMOTH_CHECK(S_ISDIR(st.st_mode)) << "[nvme] --nvme-dir " << root << " is not a directory";

  // Writability is tested by doing it: access(W_OK) says yes to root even on read-only mounts.
  std::string tmpl = root + "/mammoth-swap-" + std::to_string(::getpid()) + "-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) {
    MAMMOTH_THROW() << "[nvme] --nvme-dir " << root
                    << " is not writable (cannot create a directory in it: " << std::strerror(errno)
                    << ")";
  }
  path_ = tmpl;
  track(path_);
  try {
    const int64_t avail = free_bytes(root);
    MAMMOTH_CHECK(avail >= required_bytes)
        << "[nvme] --nvme-dir " << root << " has " << format_bytes(avail)
        << " available, but the offload needs " << format_bytes(required_bytes)
        << "; free space there or choose another directory";
    // O_DIRECT is a property of the filesystem: find out now, not on the first eviction.
    const std::string probe = path_ + "/.direct-probe";
    const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
    const int e = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(probe.c_str());
    MAMMOTH_CHECK(fd >= 0) << "[nvme] --nvme-dir " << root
                           << " does not accept O_DIRECT files: " << std::strerror(e)
                           << (e == EINVAL ? " (tmpfs and overlay filesystems refuse direct I/O; "
                                             "choose a directory on ext4 or xfs)"
                                           : "");
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    untrack(path_);
    throw;
  }
}

SwapDir::~SwapDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
  untrack(path_);
}

std::string SwapDir::create_file(const std::string& name, int64_t reserve_bytes) {
  MAMMOTH_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..")
      << "[nvme] swap file name must be a plain file name, got '" << name << "'";
  MAMMOTH_CHECK(reserve_bytes >= 0)
      << "[nvme] reserve for " << name << " must be >= 0, got " << reserve_bytes;
  const std::string file = path_ + "/" + name;
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  MAMMOTH_CHECK(fd >= 0) << "[nvme] cannot create swap file " << file << ": "
                         << std::strerror(errno);
  if (reserve_bytes > 0) {
    int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(reserve_bytes));
    int e = rc == 0 ? 0 : errno;
    if (rc != 0 && e == EOPNOTSUPP) {
      // The filesystem cannot preallocate; size the file and rely on the start-up check.
      rc = ::ftruncate(fd, static_cast<off_t>(reserve_bytes));
      e = rc == 0 ? 0 : errno;
    }
    if (rc != 0) {
      ::close(fd);
      ::unlink(file.c_str());
      int64_t avail = -1;
      try {
        avail = free_bytes(path_);
      } catch (const Error&) {
      }
      MAMMOTH_THROW() << "[nvme] cannot reserve " << format_bytes(reserve_bytes)
                      << " for swap file " << file << ": " << std::strerror(e) << " ("
                      << (avail >= 0 ? format_bytes(avail) : std::string("unknown space"))
                      << " available in --nvme-dir " << root_ << ")";
    }
  }
  ::close(fd);
  return file;
}

void SwapDir::remove_file(const std::string& name) {
  const std::string file = path_ + "/" + name;
  if (::unlink(file.c_str()) != 0 && errno != ENOENT) {
    MAMMOTH_THROW() << "[nvme] cannot remove swap file " << file << ": " << std::strerror(errno);
  }
}

}  // namespace mammoth::memory::io
