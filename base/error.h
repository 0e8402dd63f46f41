// Error reporting for every layer of Mammoth.
//
// User-reachable failures (bad shapes, bad flags, malformed files, failed system calls) throw
// mammoth::Error with the file, line and a message the user can act on. Usage:
//
//   MAMMOTH_CHECK(a.dim() == 2) << "[matmul] expected a matrix, got shape " << a.shape();
//   MAMMOTH_THROW() << "[train] unknown option --" << name;
//
// Messages start with the function or subsystem in brackets and carry the offending values.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mammoth {

class Error : public std::runtime_error {
 public:
  Error(const std::string& what, const std::string& message)
      : std::runtime_error(what), message_(message) {}
  // The message without the file:line prefix (what() has both).
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

namespace detail {

// Collects a message with operator<<; Thrower turns it into an Error.
class ErrorStream {
 public:
  ErrorStream(const char* file, int line, const char* condition)
      : file_(file), line_(line), condition_(condition) {}
  template <typename T>
  ErrorStream& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  [[noreturn]] void raise() const;

 private:
  const char* file_;
  int line_;
  const char* condition_;
  std::ostringstream stream_;
};

struct Thrower {
  // operator& binds more loosely than <<, so the whole message is built first.
  [[noreturn]] void operator&(const ErrorStream& s) const { s.raise(); }
};

}  // namespace detail
}  // namespace mammoth

#define MAMMOTH_CHECK(cond)                                      \
  if (__builtin_expect(static_cast<bool>(cond), 1)) {            \
  } else                                                         \
    ::mammoth::detail::Thrower() & ::mammoth::detail::ErrorStream(__FILE__, __LINE__, #cond)

#define MAMMOTH_THROW() \
  ::mammoth::detail::Thrower() & ::mammoth::detail::ErrorStream(__FILE__, __LINE__, nullptr)
