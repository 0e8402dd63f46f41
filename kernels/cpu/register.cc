// The CPU backend's entry point: registers every CPU kernel family.
#include "kernels/cpu/register.h"

#include "kernels/cpu/simd.h"

namespace mammoth::kernels::cpu {

void register_kernels(Registry& r) {
  // MAMMOTH_ISA is read here, once, for both the fused kernels and the GEMM: a bad value stops
  // the process at start-up, not at its first kernel of that family.
  check_isa_setting();
  register_elementwise(r);
  register_reduce(r);
  register_matmul(r);
  register_nn(r);
  register_index(r);
  register_attention(r);
  register_optim(r);
  register_moe(r);
}

}  // namespace mammoth::kernels::cpu
