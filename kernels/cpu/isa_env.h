// MAMMOTH_ISA: one setting that forces the CPU kernels' instruction set for a whole process,
// whatever the command or test binary.
//
//   MAMMOTH_ISA=avx512 | avx2 | portable   the fused f32 kernels (simd.h) and the GEMM (gemm.h)
//                                          both run that family
//   MAMMOTH_ISA=auto, empty or unset       each picks the best family the CPU supports
//
// The variable is read once, the first time a kernel family is chosen; the kernel registry
// chooses both when it starts (kernels/cpu/register.cc), so a bad value stops any command at
// start-up. A value that is not one of the above, or one this CPU cannot run, is a
// mammoth::Error naming the variable: never a silent fallback. set_simd_isa / set_gemm_isa
// (tests, `bench --isa`) still override it; their kAuto returns to this setting.
#pragma once

#include <string>

namespace mammoth::kernels::cpu {

enum class IsaRequest { kAuto, kAvx512, kAvx2, kPortable };

// The name of the environment variable, for messages.
inline constexpr const char* kIsaEnvVar = "MAMMOTH_ISA";

// Parses a value of MAMMOTH_ISA: nullptr, "" and "auto" are kAuto; anything else but
// avx512, avx2 or portable (lower case) throws mammoth::Error naming the variable.
IsaRequest parse_isa_request(const char* value);

// MAMMOTH_ISA as parsed, read from the environment once (throws as parse_isa_request does,
// on every call while the value is bad).
IsaRequest isa_request_from_env();

// "avx512", "avx2", "portable" or "auto".
const char* isa_request_name(IsaRequest request);

// Who picks the kernels' family when nothing forces it, for settings lines: "MAMMOTH_ISA=avx2",
// or "best on this CPU" when MAMMOTH_ISA is auto or unset.
std::string isa_request_source();

}  // namespace mammoth::kernels::cpu
