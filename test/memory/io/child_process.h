// Helpers for memory/io tests that change process-wide state (rlimits, seccomp filters, mount
// namespaces): the change happens in a forked child, which reports back through a pipe.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <exception>
#include <functional>
#include <string>

namespace mammoth::memory::io::testing {

// Runs `fn` in a forked child and returns the string it returned. An exception in the child
// comes back as "EXCEPTION: <what>", a child that dies as "CHILD DIED: status <n>". The child
// leaves with _exit, skipping atexit hooks and the parent's static destructors; one that hangs
// is killed by SIGALRM after `limit_s` (status 14), so the test fails naming it instead of
// running into Bazel's timeout.
inline std::string run_in_child(const std::function<std::string()>& fn, unsigned limit_s = 30) {
  int fds[2];
  if (::pipe(fds) != 0) return "PIPE FAILED";
  const pid_t pid = ::fork();
  if (pid < 0) return "FORK FAILED";
  if (pid == 0) {
    ::alarm(limit_s);
    ::close(fds[0]);
    std::string out;
    try {
      out = fn();
    } catch (const std::exception& e) {
      out = std::string("EXCEPTION: ") + e.what();
    }
    size_t off = 0;
    while (off < out.size()) {
      const ssize_t n = ::write(fds[1], out.data() + off, out.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return "CHILD DIED: status " + std::to_string(status);
  }
  return out;
}

}  // namespace mammoth::memory::io::testing
