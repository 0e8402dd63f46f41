// Per-thread scratch memory for kernels: 64-byte aligned, grown on demand and kept for the
// thread's life, so a kernel called every step neither allocates, nor page-faults, nor splits
// cache lines on its scratch (glibc's large blocks start 16 bytes into a page).
#ifndef MAMMOTH_BASE_SCRATCH_H_
#define MAMMOTH_BASE_SCRATCH_H_

#include <cstddef>
#include <cstdint>

namespace mammoth {

// One slot per use. A kernel must not use a slot that a kernel it calls also uses (attention
// calls the sgemm, so their slots differ); the fp32 and bf16 GEMMs never nest and share theirs.
enum class ScratchSlot : int {
  kGemmPackA,
  kGemmPackB,
  kGemmTile,
  kRowBuffer,     // softmax's exponentials
  kNormPartials,  // norm backward's weight-gradient partials (filled by the pool's threads)
  kNormBlock,     // norm backward's accumulators for the block a thread is on
  kAttentionA,    // attention's score tile (forward) / probabilities (backward)
  kAttentionB,    // attention's output accumulator (forward) / dP (backward)
  kAttentionT,    // attention's key and value blocks transposed (K^T, V^T)
  kCount,
};

// At least `bytes` of this thread's buffer for `slot`; its contents are unspecified (whatever
// this thread left there). Valid until this thread asks for the same slot again.
void* thread_scratch(ScratchSlot slot, size_t bytes);

template <typename T>
T* thread_scratch(ScratchSlot slot, int64_t count) {
  return static_cast<T*>(thread_scratch(slot, sizeof(T) * static_cast<size_t>(count)));
}

}  // namespace mammoth

#endif  // MAMMOTH_BASE_SCRATCH_H_
