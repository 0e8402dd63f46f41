// Internal to the CPU backend: one registration function per kernel family file.
#pragma once

#include "base/thread_pool.h"
#include "kernels/registry.h"

namespace mammoth::kernels::cpu {

// Registers the f32 and f64 instantiations of a floating-point kernel.
inline void add_float_kernels(Registry& r, Kernel k, KernelFn f32, KernelFn f64) {
  r.add(k, DeviceType::kCPU, DType::kF32, f32);
  r.add(k, DeviceType::kCPU, DType::kF64, f64);
}

void register_elementwise(Registry& r);
void register_reduce(Registry& r);
void register_matmul(Registry& r);
void register_nn(Registry& r);
void register_index(Registry& r);
void register_attention(Registry& r);
void register_optim(Registry& r);
void register_moe(Registry& r);

}  // namespace mammoth::kernels::cpu
