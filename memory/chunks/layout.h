// How tensors are packed into chunks, and how big a chunk is. One function each, shared by the
// runtime (engine/offload) and the planner's dry run of the chunk manager (plan/offload_traffic),
// so that the planner pages exactly the chunks the runtime will.
#pragma once

#include <cstdint>
#include <vector>

namespace mammoth::memory::chunks {

// The chunk size for tensors whose largest is `largest` bytes when `requested` is asked for.
// A chunk holds the largest tensor whole (kernels read a parameter as one buffer) unless the
// budgets cannot then hold the chunks one update needs at once: `device_lists` chunks within
// `device_mem` (the lists computed on the device), or, with NVMe-homed moments
// (`nvme_states`), two staging chunks within `host_mem` (0: unlimited, each). Then, where
// `spans_allowed`, the requested size stands and larger tensors span several chunks.
struct ChunkSizing {
  int64_t chunk_bytes = 0;  // before the manager rounds it up to io::kBlockSize
  bool spans = false;       // tensors larger than a chunk span consecutive chunks
};
ChunkSizing choose_chunk_bytes(int64_t requested, int64_t largest, int64_t device_mem,
                               int device_lists, int64_t host_mem, bool nvme_states,
                               bool spans_allowed);

// Where one tensor lies: `pieces` == 1, at `offset` bytes into `chunk`; > 1, whole chunks
// chunk .. chunk + pieces - 1 (offset 0; the last piece holds the rest and may be shared).
struct ChunkPlace {
  int chunk = 0;
  int64_t offset = 0;
  int pieces = 1;
};
struct ChunkLayout {
  std::vector<int64_t> used;       // bytes of each chunk that tensors hold
  std::vector<int> members;        // tensors starting in each chunk
  std::vector<ChunkPlace> places;  // per tensor, in the order packed
};
// Where a tensor may start in a chunk: as memory::CpuAllocator aligns, the SIMD alignment the
// kernels expect.
inline constexpr int64_t kTensorAlignment = 64;
// First fit in the order given, each tensor `alignment`-aligned in its chunk; a tensor larger
// than `chunk_bytes` (the manager's, rounded) takes whole chunks and its last piece's rest is
// open to the next tensors.
ChunkLayout pack_chunks(const std::vector<int64_t>& bytes, int64_t chunk_bytes,
                        int64_t alignment = kTensorAlignment);

}  // namespace mammoth::memory::chunks
