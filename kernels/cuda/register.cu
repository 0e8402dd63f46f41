// The CUDA backend's entry point: registers every CUDA kernel family for DeviceType::kCUDA
// (f32, bf16 and f16 for the float kernels; every dtype for copy and fill).
#include "kernels/cuda/common.cuh"

namespace mammoth::kernels::cuda {

void register_kernels(Registry& r) {
  register_elementwise(r);
  register_reduce(r);
  register_matmul(r);
  register_nn(r);
  register_index(r);
  register_attention(r);
  register_optim(r);
  register_moe(r);
}

}  // namespace mammoth::kernels::cuda
