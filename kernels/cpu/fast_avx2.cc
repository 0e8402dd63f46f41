// The fused f32 kernels (fast_impl.h) compiled for the avx2 vector type.
#include "kernels/cpu/simd_avx2.h"

#define MAMMOTH_FAST_NS avx2
#include "kernels/cpu/fast_impl.h"
