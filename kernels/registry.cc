#include "kernels/registry.h"

#include "base/error.h"

namespace mammoth::kernels {

Registry::Registry() {
  cpu::register_kernels(*this);
#ifdef MAMMOTH_WITH_CUDA
  cuda::register_kernels(*this);
#endif
}

Registry& Registry::instance() {
  static Registry r;
  return r;
}

void Registry::add(Kernel kernel, DeviceType device, DType dtype, KernelFn fn) {
  table_[static_cast<int>(kernel)][static_cast<int>(device)][static_cast<int>(dtype)] = fn;
}

KernelFn Registry::find(Kernel kernel, DeviceType device, DType dtype) const {
  return table_[static_cast<int>(kernel)][static_cast<int>(device)][static_cast<int>(dtype)];
}

KernelFn Registry::get(Kernel kernel, DeviceType device, DType dtype) const {
  KernelFn fn = find(kernel, device, dtype);
  MAMMOTH_CHECK(fn != nullptr) << "[" << kernel_name(kernel) << "] no kernel for dtype "
                               << dtype_name(dtype) << " on "
                               << (device == DeviceType::kCPU ? "cpu" : "cuda");
  return fn;
}

std::vector<DType> Registry::dtypes(Kernel kernel, DeviceType device) const {
  std::vector<DType> out;
  for (DType t : kAllDTypes) {
    if (find(kernel, device, t) != nullptr) out.push_back(t);
  }
  return out;
}

void launch(Kernel kernel, DeviceType device, DType dtype, std::span<const TensorArg> inputs,
            std::span<const TensorArg> outputs, const void* params) {
  Registry::instance().get(kernel, device, dtype)(inputs, outputs, params);
}

}  // namespace mammoth::kernels
