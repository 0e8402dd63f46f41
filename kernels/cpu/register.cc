// The CPU backend's entry point: registers every CPU kernel family.
#include "kernels/cpu/register.h"

namespace mammoth::kernels::cpu {

void register_kernels(Registry& r) {
  register_elementwise(r);
  register_reduce(r);
  register_matmul(r);
  register_nn(r);
  register_index(r);
  register_attention(r);
  register_optim(r);
}

}  // namespace mammoth::kernels::cpu
