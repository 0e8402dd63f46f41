#include "base/error.h"

#include <cstring>

namespace mammoth::detail {

void ErrorStream::raise() const {
  std::string message = stream_.str();
  if (message.empty() && condition_ != nullptr) message = std::string("check failed: ") + condition_;
  const char* base = std::strrchr(file_, '/');
  std::ostringstream what;
  what << (base ? base + 1 : file_) << ":" << line_ << ": " << message;
  throw Error(what.str(), message);
}

}  // namespace mammoth::detail
