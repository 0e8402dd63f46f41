#include "memory/chunks/layout.h"

#include <algorithm>

#include "base/error.h"
#include "memory/io/async_io.h"

namespace mammoth::memory::chunks {

ChunkSizing choose_chunk_bytes(int64_t requested, int64_t largest, int64_t device_mem,
                               int device_lists, int64_t host_mem, bool nvme_states,
                               bool spans_allowed) {
  const int64_t block = static_cast<int64_t>(io::kBlockSize);
  const int64_t whole = (std::max(requested, largest) + block - 1) / block * block;
  const bool cramped = (device_mem > 0 && device_mem < device_lists * whole) ||
                       (nvme_states && host_mem > 0 && host_mem < 2 * whole);
  ChunkSizing s;
  s.spans = cramped && largest > requested && spans_allowed;
  s.chunk_bytes = s.spans ? requested : std::max(requested, largest);
  return s;
}

ChunkLayout pack_chunks(const std::vector<int64_t>& bytes, int64_t chunk_bytes, int64_t alignment) {
  MAMMOTH_CHECK(chunk_bytes > 0 && alignment > 0)
      << "[chunks] pack_chunks: chunk size " << chunk_bytes << ", alignment " << alignment;
  ChunkLayout out;
  out.places.reserve(bytes.size());
  for (const int64_t n : bytes) {
    if (n > chunk_bytes) {
      const int pieces = static_cast<int>((n + chunk_bytes - 1) / chunk_bytes);
      out.places.push_back({static_cast<int>(out.used.size()), 0, pieces});
      for (int j = 0; j < pieces; ++j) {
        out.used.push_back(j + 1 < pieces ? chunk_bytes : n - (pieces - 1) * chunk_bytes);
        out.members.push_back(j == 0 ? 1 : 0);
      }
      continue;
    }
    int64_t at = out.used.empty() ? chunk_bytes + 1
                                  : (out.used.back() + alignment - 1) / alignment * alignment;
    if (out.used.empty() || at + n > chunk_bytes) {
      out.used.push_back(0);
      out.members.push_back(0);
      at = 0;
    }
    out.places.push_back({static_cast<int>(out.used.size()) - 1, at, 1});
    out.used.back() = at + n;
    ++out.members.back();
  }
  return out;
}

}  // namespace mammoth::memory::chunks
