// Tests of memory/io/swap_dir.h: start-up checks (missing, not a directory, unwritable, too
// little space, no O_DIRECT), preallocation on a full disk, and removal at destruction and exit.
// The full-disk and read-only cases mount a small tmpfs in a private mount namespace of a child
// process; where that is not permitted they are skipped with a warning.
#include "memory/io/swap_dir.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <string>

#include "base/error.h"
#include "memory/io/aligned_buffer.h"
#include "memory/io/async_io.h"
#include "test/memory/io/child_process.h"
#include "test/memory/io/error_of.h"
#include "test/testing/test_dir.h"

namespace mammoth::memory::io {
namespace {

using testing::run_in_child;

using testing::error_of;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// In a child: a private mount namespace with a filesystem of `type` mounted on `dir`.
// Returns "" on success, else why not.
std::string mount_private(const std::string& dir, const char* type, const char* options,
                          unsigned long flags = 0) {
  if (::unshare(CLONE_NEWNS) != 0) return std::string("unshare: ") + std::strerror(errno);
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
    return std::string("make-private: ") + std::strerror(errno);
  }
  if (::mount(type, dir.c_str(), type, flags, options) != 0) {
    return std::string("mount ") + type + ": " + std::strerror(errno);
  }
  return {};
}

TEST_CASE("a usable directory: files are reserved, and removed with the SwapDir", "[io]") {
  mammoth::testing::TestDir dir;
  std::string sub, file;
  {
    SwapDir swap(dir.path(), 1 << 20);
    sub = swap.path();
    CHECK(sub.rfind(dir.path() + "/mammoth-swap-" + std::to_string(::getpid()) + "-", 0) == 0);
    file = swap.create_file("params", 3 << 20);
    struct stat st {};
    REQUIRE(::stat(file.c_str(), &st) == 0);
    CHECK(st.st_size == 3 << 20);
    CHECK(st.st_blocks * 512 >= 3 << 20);  // allocated, not sparse
    CHECK(contains(error_of([&] { swap.create_file("params", 4096); }), "File exists"));
    CHECK(contains(error_of([&] { swap.create_file("../escape", 4096); }), "plain file name"));
    swap.remove_file("params");
    CHECK_FALSE(std::filesystem::exists(file));
    file = swap.create_file("grads", 0);
    CHECK(std::filesystem::exists(file));
    CHECK(SwapDir::free_bytes(dir.path()) > 0);
  }
  CHECK_FALSE(std::filesystem::exists(file));
  CHECK_FALSE(std::filesystem::exists(sub));
  CHECK(std::filesystem::exists(dir.path()));  // the user's directory itself stays
}

TEST_CASE("a missing path, a file, or too little space is a start-up error", "[io]") {
  mammoth::testing::TestDir dir;
  const std::string missing = dir.file("nope");
  std::string e = error_of([&] { SwapDir(missing, 5 << 20); });
  CHECK(contains(e, "--nvme-dir " + missing + " is not usable: No such file or directory"));
  CHECK(contains(e, "5.00 MiB (5242880 bytes)"));

  const std::string file = dir.write("plain", "x");
  CHECK(contains(error_of([&] { SwapDir(file, 0); }), file + " is not a directory"));

  // More than the filesystem has: the message gives both sizes.
  const int64_t avail = SwapDir::free_bytes(dir.path());
  const int64_t need = avail + (int64_t{1} << 40);
  e = error_of([&] { SwapDir(dir.path(), need); });
  CHECK(contains(e, "--nvme-dir " + dir.path() + " has "));
  CHECK(contains(e, "the offload needs " + format_bytes(need)));
  // Nothing is left behind by a failed start-up.
  int entries = 0;
  for ([[maybe_unused]] const auto& d : std::filesystem::directory_iterator(dir.path())) ++entries;
  CHECK(entries == 1);  // just "plain"
}

TEST_CASE("an unwritable directory is a start-up error", "[io]") {
  mammoth::testing::TestDir dir;
  // Root writes through permission bits, so a read-only mount is the reliable refusal.
  const std::string out = run_in_child([&]() -> std::string {
    const std::string why = mount_private(dir.path(), "tmpfs", "size=1m", MS_RDONLY);
    if (!why.empty()) return "SKIP " + why;
    return error_of([&] { SwapDir(dir.path(), 0); });
  });
  INFO(out);
  if (out.rfind("SKIP", 0) == 0) {
    // Without mounts: a directory no one may create entries in (root included).
    CHECK(contains(error_of([] { SwapDir("/proc/self", 0); }), "is not writable"));
    WARN("read-only mount not permitted here (" << out << "); checked /proc/self instead");
    return;
  }
  CHECK(contains(out, "--nvme-dir " + dir.path() +
                          " is not writable (cannot create a directory in it: Read-only file "
                          "system)"));
}

TEST_CASE("a filesystem without O_DIRECT is a start-up error", "[io]") {
  mammoth::testing::TestDir dir;
  const std::string out = run_in_child([&]() -> std::string {
    const std::string why = mount_private(dir.path(), "ramfs", nullptr);
    if (!why.empty()) return "SKIP " + why;
    const std::string swap = error_of([&] { SwapDir(dir.path(), 0); });
    const std::string engine = error_of([&] { make_async_io({}, dir.path()); });
    return swap + "\n" + engine;
  });
  INFO(out);
  if (out.rfind("SKIP", 0) == 0) {
    WARN("ramfs mount not permitted here: " << out);
    return;
  }
  CHECK(contains(out, "--nvme-dir " + dir.path() +
                          " does not accept O_DIRECT files: Invalid "
                          "argument"));
  CHECK(contains(out, dir.path() + " refuses O_DIRECT files: Invalid argument"));
}

TEST_CASE("a full disk: start-up check, reservation, and a write past the space", "[io]") {
  mammoth::testing::TestDir dir;
  const std::string out = run_in_child([&]() -> std::string {
    const std::string why = mount_private(dir.path(), "tmpfs", "size=1m");
    if (!why.empty()) return "SKIP " + why;
    std::string r;
    r += error_of([&] { SwapDir(dir.path(), 4 << 20); }) + "\n";
    SwapDir swap(dir.path(), 256 << 10);
    r += error_of([&] { swap.create_file("big", 8 << 20); }) + "\n";
    // A file not reserved up front: the write that finds the disk full fails cleanly.
    auto io = make_async_io({}, swap.path());
    const FileId f = io->open(swap.path() + "/unreserved");
    AlignedBuffer b(256 << 10);
    std::vector<Ticket> ts;
    for (int i = 0; i < 8; ++i)
      ts.push_back(io->write(f, int64_t{i} * (256 << 10), b.data(), b.size()));
    r += error_of([&] { io->synchronize(); }) + "\n";
    return r;
  });
  INFO(out);
  if (out.rfind("SKIP", 0) == 0) {
    WARN("tmpfs mount not permitted here (" << out << "); only the statvfs check is tested");
    return;
  }
  CHECK(contains(out, "--nvme-dir " + dir.path() + " has "));
  CHECK(contains(out, "the offload needs 4.00 MiB (4194304 bytes)"));
  CHECK(contains(out, "cannot reserve 8.00 MiB (8388608 bytes) for swap file "));
  CHECK(contains(out, "No space left on device"));
  CHECK(contains(out, "/unreserved at offset "));
  CHECK(contains(out, "length 262144 failed after"));
}

TEST_CASE("a SwapDir still alive at exit() is removed", "[io]") {
  mammoth::testing::TestDir dir;
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    auto* leaked = new SwapDir(dir.path(), 0);  // never destroyed: exit() must clean up
    leaked->create_file("x", 4096);
    const std::string p = leaked->path();
    if (::write(fds[1], p.data(), p.size()) < 0) ::_exit(2);
    ::close(fds[1]);
    std::exit(0);
  }
  ::close(fds[1]);
  char buf[4096];
  const ssize_t n = ::read(fds[0], buf, sizeof(buf));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(n > 0);
  REQUIRE(WIFEXITED(status));
  const std::string sub(buf, static_cast<size_t>(n));
  CHECK(sub.rfind(dir.path() + "/mammoth-swap-", 0) == 0);
  CHECK_FALSE(std::filesystem::exists(sub));
}

}  // namespace
}  // namespace mammoth::memory::io
