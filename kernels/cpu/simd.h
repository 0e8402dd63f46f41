// Runtime choice of the vector instruction set for the CPU backend's fused f32 kernels
// (softmax, norms, cross-entropy, attention, AdamW, ...).
//
// Those kernels are written once against a small vector type (simd_avx512.h, simd_avx2.h,
// simd_portable.h) and compiled three times, each translation unit with its own -m flags. The
// best family the CPU supports is picked at run time, unless MAMMOTH_ISA names another
// (isa_env.h: one setting for both these kernels and the GEMM, for any binary); tests force
// the others with set_simd_isa. The GEMM has its own switch (gemm.h: set_gemm_isa).
#pragma once

#include <cstdint>
#include <string>

namespace mammoth::kernels::cpu {

enum class SimdIsa { kAuto, kAvx512, kAvx2, kPortable };

// Forces a kernel family (tests, benchmarks). kAuto returns to the default: the family
// MAMMOTH_ISA names when it is set (isa_env.h), else the best the CPU supports.
// Throws mammoth::Error if the CPU lacks the requested ISA.
void set_simd_isa(SimdIsa isa);
// The family the fused kernels use now (never kAuto). Throws mammoth::Error, naming the
// variable, while nothing is forced and MAMMOTH_ISA is unknown or names a family this CPU
// cannot run.
SimdIsa active_simd_isa();
const char* simd_isa_name(SimdIsa isa);
// True if this CPU can run the given family (kAuto and kPortable always can).
bool simd_isa_supported(SimdIsa isa);

// Chooses both kernel families now (the registry's start-up hook): throws what
// active_simd_isa or active_gemm_isa would for a bad MAMMOTH_ISA.
void check_isa_setting();

// The kernels' ISA for start-up lines: "avx512 (best on this CPU)", "avx2 (MAMMOTH_ISA=avx2)",
// or both families when something forced them apart: "fused avx2, gemm avx512 (forced)".
std::string kernel_isa_summary();

// Outputs larger than this many bytes are written with non-temporal stores (default: the
// last-level cache size). Tests set 0 to force that path on small inputs; -1 restores the default.
void set_stream_threshold(int64_t bytes);

// The last-level cache in bytes: the highest-level cache in /sys/devices/system/cpu/cpu0/cache,
// else sysconf's, else 32 MiB. sysfs comes first because glibc's figure can be far off under a
// hypervisor: on the Zen 4 VMs here sysconf says 320 MiB for a 32 MiB L3, which kept every row
// kernel off its streaming-store path.
int64_t last_level_cache_bytes();
// The level-1 data cache in bytes: sysfs, else sysconf, else 32 KiB.
int64_t l1_data_cache_bytes();
// A sysfs cache "size" ("32768K", "1M", "512"): bytes, or -1 if it is not one.
int64_t parse_cache_size(const std::string& text);

}  // namespace mammoth::kernels::cpu
