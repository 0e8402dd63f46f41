#include "engine/train/device.h"

#include <map>
#include <memory>

#include "base/error.h"
#include "engine/autograd.h"
#include "engine/ops.h"
#include "kernels/cpu/simd.h"
#ifdef MAMMOTH_WITH_CUDA
#include "memory/cuda/device.h"
#endif

namespace mammoth::engine::train {

namespace {

// The CPU, with the kernels' instruction set (and MAMMOTH_ISA when it chose it) after the
// reason: "--device cpu; CPU kernels avx2 (MAMMOTH_ISA=avx2)". A bad MAMMOTH_ISA throws here.
DeviceChoice cpu_choice(const std::string& why) {
  return {Device::cpu(), why + "; CPU kernels " + kernels::cpu::kernel_isa_summary()};
}

}  // namespace

DeviceChoice choose_device(const std::string& flag, const char* command) {
  MAMMOTH_CHECK(flag == "auto" || flag == "cpu" || flag == "cuda")
      << "[" << command << "] --device must be auto, cpu or cuda, got '" << flag << "'";
  if (flag == "cpu") return cpu_choice("--device cpu");
#ifdef MAMMOTH_WITH_CUDA
  std::string reason;
  if (!memory::cuda::cuda_available(&reason)) {
    MAMMOTH_CHECK(flag != "cuda") << "[" << command
                                  << "] --device cuda: no usable CUDA device: " << reason
                                  << " (--device auto or cpu trains on the CPU)";
    return cpu_choice("auto: no CUDA device (" + reason + ")");
  }
  const Device d = memory::cuda::select_device();
  return {d, (flag == "auto" ? std::string("auto: ") : std::string("--device cuda: ")) +
                 "CUDA device " + std::to_string(d.index) + " of " +
                 std::to_string(memory::cuda::device_count()) + " (local rank " +
                 std::to_string(memory::cuda::local_rank()) + ")"};
#else
  MAMMOTH_CHECK(flag != "cuda") << "[" << command
                                << "] --device cuda: this build has no CUDA backend (built "
                                   "without the CUDA toolkit or with --config=cpu)";
  return cpu_choice("auto: this build has no CUDA backend");
#endif
}

void move_to_device(const nn::NamedTensors& tensors, Device device) {
  // One copy per storage, so views of it (tied weights) stay views of one copy.
  std::map<const Storage*, std::shared_ptr<Storage>> moved;
  for (const auto& [name, t] : tensors) {
    if (!t.defined() || t.device() == device) continue;
    const std::shared_ptr<Storage>& from = t.storage();
    MAMMOTH_CHECK(!from->ensure_resident)
        << "[move_to_device] '" << name
        << "' lives in paged (offload) memory: move the model before packing it into chunks";
    auto it = moved.find(from.get());
    if (it == moved.end()) {
      // The whole storage as a flat tensor of this tensor's dtype.
      const size_t es = dtype_size(t.dtype());
      MAMMOTH_CHECK(from->nbytes % es == 0)
          << "[move_to_device] '" << name << "': storage of " << from->nbytes
          << " bytes is not a whole number of " << dtype_name(t.dtype()) << " elements";
      auto flat = std::make_shared<TensorImpl>();
      flat->storage = from;
      flat->shape = {static_cast<int64_t>(from->nbytes / es)};
      flat->strides = {1};
      flat->dtype = t.dtype();
      it = moved.emplace(from.get(), Tensor(flat).to(device).storage()).first;
    }
  }
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) continue;
    auto it = moved.find(t.storage().get());
    if (it == moved.end()) continue;
    t.zero_grad();
    t.impl()->storage = it->second;
  }
}

Tensor to_host(const Tensor& t) {
  // Paged storage (offload chunks, ZeRO-3 shards on NVMe) may have no address while evicted:
  // a copy (a kernel, which pages it in) is what raw readers such as checkpoint writers get.
  if (!t.defined() || (t.device().is_cpu() && !t.storage()->ensure_resident)) return t;
  NoGradGuard ng;
  return t.clone().to(Device::cpu());
}

nn::NamedTensors to_host(const nn::NamedTensors& tensors) {
  nn::NamedTensors out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) out.emplace_back(name, to_host(t));
  return out;
}

}  // namespace mammoth::engine::train
