// A fresh temporary directory per test (under $TEST_TMPDIR when Bazel sets it), removed at the
// end of the scope.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace mammoth::testing {

class TestDir {
 public:
  TestDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string tmpl = std::string(base ? base : "/tmp") + "/mammoth_data_XXXXXX";
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : std::string();
  }
  ~TestDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TestDir(const TestDir&) = delete;
  TestDir& operator=(const TestDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Writes `data` to `name` in this directory and returns the full path.
  std::string write(const std::string& name, const std::string& data) const {
    std::ofstream out(file(name), std::ios::binary);
    out << data;
    return file(name);
  }

 private:
  std::string path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace mammoth::testing
