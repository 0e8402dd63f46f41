// The kernel registry: (kernel, device type, dtype) -> function.
//
// One explicit process-wide table. Backends fill it in their register_kernels() functions,
// called once when the registry is first used; the engine looks kernels up by the dtype of
// their first input (the output dtype for copy and fill). A missing entry is a clear error
// naming all three keys.
#pragma once

#include <vector>

#include "base/device.h"
#include "base/dtype.h"
#include "kernels/kernel.h"
#include "kernels/op_list.h"

namespace mammoth::kernels {

class Registry {
 public:
  static Registry& instance();

  void add(Kernel kernel, DeviceType device, DType dtype, KernelFn fn);
  // nullptr when absent.
  KernelFn find(Kernel kernel, DeviceType device, DType dtype) const;
  // Throws mammoth::Error when absent.
  KernelFn get(Kernel kernel, DeviceType device, DType dtype) const;
  // Every (dtype) registered for a kernel on a device.
  std::vector<DType> dtypes(Kernel kernel, DeviceType device) const;

 private:
  Registry();
  static constexpr int kNumDTypes = 8;
  static constexpr int kNumDevices = 2;
  KernelFn table_[kKernelCount][kNumDevices][kNumDTypes] = {};
};

// Calls the kernel registered for (kernel, device, dtype).
void launch(Kernel kernel, DeviceType device, DType dtype, std::span<const TensorArg> inputs,
            std::span<const TensorArg> outputs, const void* params = nullptr);

namespace cpu {
void register_kernels(Registry& registry);
}
namespace cuda {
// Defined by the CUDA backend when it is built (MAMMOTH_WITH_CUDA).
void register_kernels(Registry& registry);
}  // namespace cuda

}  // namespace mammoth::kernels
