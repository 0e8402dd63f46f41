// SaveDirLock: one job per checkpoint directory; released when its holder ends, however it ends.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <optional>
#include <string>

#include "base/error.h"
#include "engine/train/checkpoint.h"
#include "test/testing/test_dir.h"

namespace mammoth::engine::train {
namespace {

TEST_CASE("a second claim on a save dir is refused naming the holder, and freed at release") {
  testing::TestDir dir;
  const std::string save = dir.file("run");  // created by the lock
  std::optional<SaveDirLock> first(std::in_place, save);
  // flock is per open file, so a second claim in this process contends like another job.
  CHECK_THROWS_WITH(SaveDirLock(save),
                    Catch::Contains("--save-dir " + save + " is in use by another job (pid " +
                                    std::to_string(::getpid()) + " on "));
  first.reset();
  CHECK_NOTHROW(SaveDirLock(save));
}

TEST_CASE("a holder that dies without cleaning up leaves the save dir free") {
  testing::TestDir dir;
  const std::string save = dir.file("run");
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    SaveDirLock held(save);
    const char ok = 1;
    if (::write(ready[1], &ok, 1) != 1) ::_exit(2);
    ::pause();  // until SIGKILL: no destructor runs
    ::_exit(0);
  }
  char ok = 0;
  REQUIRE(::read(ready[0], &ok, 1) == 1);
  CHECK_THROWS_WITH(SaveDirLock(save), Catch::Contains("pid " + std::to_string(child)));
  ::kill(child, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK_NOTHROW(SaveDirLock(save));
  ::close(ready[0]);
  ::close(ready[1]);
}

}  // namespace
}  // namespace mammoth::engine::train
