// The fused f32 kernels (fast_impl.h) compiled for the avx512 vector type.
//
// GCC 12's AVX-512 intrinsics build their pass-through operand from _mm512_undefined_ps(),
// which -W(maybe-)uninitialized reports once inlined; the value is never read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "kernels/cpu/simd_avx512.h"

#define MAMMOTH_FAST_NS avx512
#include "kernels/cpu/fast_impl.h"
