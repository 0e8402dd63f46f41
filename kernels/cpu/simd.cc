// Picks the instruction set for the fused f32 kernels (simd.h, fast.h).
#include "kernels/cpu/simd.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/fast.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/isa_env.h"

namespace mammoth::kernels::cpu {
namespace {

std::atomic<SimdIsa> g_forced{SimdIsa::kAuto};
std::atomic<int64_t> g_stream_threshold{-1};

SimdIsa best_isa() {
#if defined(__x86_64__)
  static const SimdIsa best = [] {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma")) {
      return SimdIsa::kAvx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
      return SimdIsa::kAvx2;
    }
    return SimdIsa::kPortable;
  }();
  return best;
#else
  return SimdIsa::kPortable;
#endif
}

// What kAuto means: MAMMOTH_ISA's family when it is set (isa_env.h), else the best one.
SimdIsa default_isa() {
  static const SimdIsa isa = [] {
    SimdIsa want = SimdIsa::kAuto;
    switch (isa_request_from_env()) {
      case IsaRequest::kAuto:
        return best_isa();
      case IsaRequest::kAvx512:
        want = SimdIsa::kAvx512;
        break;
      case IsaRequest::kAvx2:
        want = SimdIsa::kAvx2;
        break;
      case IsaRequest::kPortable:
        want = SimdIsa::kPortable;
        break;
    }
    const SimdIsa best = best_isa();
    MAMMOTH_CHECK(simd_isa_supported(want))
        << "[" << kIsaEnvVar << "] " << kIsaEnvVar << "=" << simd_isa_name(want)
        << ", but this CPU cannot run the " << simd_isa_name(want) << " fused kernels (they need "
        << (want == SimdIsa::kAvx512 ? "AVX-512 F and FMA" : "AVX2, FMA and F16C")
        << "); the best it runs is " << simd_isa_name(best) << ": set " << kIsaEnvVar << " to "
        << (best == SimdIsa::kAvx2 ? "avx2, portable" : "portable") << " or auto";
    return want;
  }();
  return isa;
}

}  // namespace

bool simd_isa_supported(SimdIsa isa) {
  switch (isa) {
    case SimdIsa::kAuto:
    case SimdIsa::kPortable:
      return true;
    case SimdIsa::kAvx2:
      return best_isa() == SimdIsa::kAvx2 || best_isa() == SimdIsa::kAvx512;
    case SimdIsa::kAvx512:
      return best_isa() == SimdIsa::kAvx512;
  }
  return false;
}

void set_simd_isa(SimdIsa isa) {
  MAMMOTH_CHECK(simd_isa_supported(isa))
      << "[set_simd_isa] this CPU cannot run the " << simd_isa_name(isa) << " kernels";
  g_forced.store(isa);
}

SimdIsa active_simd_isa() {
  const SimdIsa f = g_forced.load();
  return f == SimdIsa::kAuto ? default_isa() : f;
}

void check_isa_setting() {
  active_simd_isa();
  active_gemm_isa();
}

std::string kernel_isa_summary() {
  const SimdIsa simd = active_simd_isa();
  const GemmIsa gemm = active_gemm_isa();
  std::string text = simd_isa_name(simd);
  if (text != gemm_isa_name(gemm)) text = "fused " + text + ", gemm " + gemm_isa_name(gemm);
  // What the default would be: MAMMOTH_ISA's family, else each one's best.
  const IsaRequest request = isa_request_from_env();
  const GemmIsa gemm_best = gemm_isa_supported(GemmIsa::kAvx512) ? GemmIsa::kAvx512
                            : gemm_isa_supported(GemmIsa::kAvx2) ? GemmIsa::kAvx2
                                                                 : GemmIsa::kPortable;
  const bool defaults = g_forced.load() == SimdIsa::kAuto && simd == default_isa() &&
                        (request == IsaRequest::kAuto
                             ? gemm == gemm_best
                             : std::string(gemm_isa_name(gemm)) == isa_request_name(request));
  if (!defaults) return text + " (forced)";
  return text + " (" + isa_request_source() + ")";
}

const char* simd_isa_name(SimdIsa isa) {
  switch (isa) {
    case SimdIsa::kAuto:
      return "auto";
    case SimdIsa::kAvx512:
      return "avx512";
    case SimdIsa::kAvx2:
      return "avx2";
    case SimdIsa::kPortable:
      return "portable";
  }
  return "?";
}

void set_stream_threshold(int64_t bytes) { g_stream_threshold.store(bytes); }

int64_t parse_cache_size(const std::string& text) {
  size_t i = 0;
  int64_t v = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    if (v > (int64_t{1} << 40)) return -1;
    v = v * 10 + (text[i++] - '0');
  }
  if (i == 0) return -1;
  int64_t unit = 1;
  if (i < text.size() && (text[i] == 'K' || text[i] == 'M' || text[i] == 'G')) {
    unit = text[i] == 'K'   ? (int64_t{1} << 10)
           : text[i] == 'M' ? (int64_t{1} << 20)
                            : (int64_t{1} << 30);
    ++i;
  }
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  return i == text.size() ? v * unit : -1;
}

namespace {

struct SysfsCache {
  int level = 0;
  std::string type;  // "Data", "Instruction" or "Unified"
  int64_t bytes = -1;
};

// cpu0's caches as sysfs lists them (empty where there is no sysfs).
std::vector<SysfsCache> sysfs_caches() {
  std::vector<SysfsCache> caches;
  for (int k = 0; k < 16; ++k) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(k);
    std::ifstream lf(dir + "/level"), tf(dir + "/type"), sf(dir + "/size");
    SysfsCache c;
    std::string size;
    if (!(lf >> c.level) || !(sf >> size)) continue;
    tf >> c.type;
    c.bytes = parse_cache_size(size);
    if (c.bytes > 0) caches.push_back(c);
  }
  return caches;
}

}  // namespace

int64_t last_level_cache_bytes() {
  static const int64_t llc = [] {
    int best_level = 0;
    int64_t best = -1;
    for (const SysfsCache& c : sysfs_caches()) {
      if (c.level > best_level) {
        best_level = c.level;
        best = c.bytes;
      }
    }
    if (best > 0) return best;
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return l3 > 0 ? static_cast<int64_t>(l3) : int64_t{32} << 20;
  }();
  return llc;
}

int64_t l1_data_cache_bytes() {
  static const int64_t l1d = [] {
    for (const SysfsCache& c : sysfs_caches()) {
      if (c.level == 1 && c.type != "Instruction") return c.bytes;
    }
    const long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    return l1 > 0 ? static_cast<int64_t>(l1) : int64_t{32} << 10;
  }();
  return l1d;
}

bool stream_output(int64_t bytes) {
  const int64_t llc = last_level_cache_bytes();
  const int64_t forced = g_stream_threshold.load();
  return bytes > (forced >= 0 ? forced : llc);
}

const FastKernels& fast_kernels() {
  switch (active_simd_isa()) {
    case SimdIsa::kAvx512:
      return avx512::fast_kernels();
    case SimdIsa::kAvx2:
      return avx2::fast_kernels();
    default:
      return portable::fast_kernels();
  }
}

}  // namespace mammoth::kernels::cpu
