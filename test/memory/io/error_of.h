// The message of the mammoth::Error that fn throws, or "no error" (memory/io tests).
#pragma once

#include <functional>
#include <string>

#include "base/error.h"

namespace mammoth::memory::io::testing {

inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace mammoth::memory::io::testing
