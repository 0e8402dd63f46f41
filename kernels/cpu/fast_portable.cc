// The fused f32 kernels (fast_impl.h) compiled for the portable vector type.
#include "kernels/cpu/simd_portable.h"

#define MAMMOTH_FAST_NS portable
#include "kernels/cpu/fast_impl.h"
