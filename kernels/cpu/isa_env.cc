// Reads MAMMOTH_ISA (isa_env.h).
#include "kernels/cpu/isa_env.h"

#include <cstdlib>
#include <cstring>

#include "base/error.h"

namespace mammoth::kernels::cpu {

IsaRequest parse_isa_request(const char* value) {
  if (value == nullptr || *value == '\0' || !std::strcmp(value, "auto")) return IsaRequest::kAuto;
  if (!std::strcmp(value, "avx512")) return IsaRequest::kAvx512;
  if (!std::strcmp(value, "avx2")) return IsaRequest::kAvx2;
  if (!std::strcmp(value, "portable")) return IsaRequest::kPortable;
  MAMMOTH_THROW() << "[" << kIsaEnvVar << "] unknown instruction set " << kIsaEnvVar << "='"
                  << value << "': use avx512, avx2, portable or auto (unset: auto)";
}

IsaRequest isa_request_from_env() {
  // A throwing initializer leaves the static unset, so a bad value fails every call alike.
  static const IsaRequest request = parse_isa_request(std::getenv(kIsaEnvVar));
  return request;
}

const char* isa_request_name(IsaRequest request) {
  switch (request) {
    case IsaRequest::kAuto:
      return "auto";
    case IsaRequest::kAvx512:
      return "avx512";
    case IsaRequest::kAvx2:
      return "avx2";
    case IsaRequest::kPortable:
      return "portable";
  }
  return "?";
}

std::string isa_request_source() {
  const IsaRequest request = isa_request_from_env();
  if (request == IsaRequest::kAuto) return "best on this CPU";
  return std::string(kIsaEnvVar) + "=" + isa_request_name(request);
}

}  // namespace mammoth::kernels::cpu
