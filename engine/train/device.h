// Where a job runs: the `--device auto|cpu|cuda` choice, moving a model there in place, and the
// host copies that checkpoints and logs read.
//
// DESIGN.md: CUDA device = local rank (modulo the device count) when CUDA devices exist,
// otherwise the CPU backend. Models are built and initialised on the host (initialisation
// depends only on the seed and the names, so a CUDA run starts from the CPU run's weights) and
// then moved; every tensor a forward pass creates follows its input's device.
#pragma once

#include <string>

#include "base/device.h"
#include "engine/nn/module.h"
#include "engine/tensor.h"

namespace mammoth::engine::train {

struct DeviceChoice {
  Device device;
  // How it was chosen, for the job's start-up line: "auto: CUDA device 0 of 8 (local rank 0)",
  // "auto: no CUDA device (<reason>); CPU kernels avx512 (best on this CPU)",
  // "--device cpu; CPU kernels avx2 (MAMMOTH_ISA=avx2)" (kernels/cpu/isa_env.h).
  std::string why;
};

// Resolves --device: "cpu"; "cuda" (the local rank's device; an error naming the reason when
// none is usable or the build has no CUDA backend); "auto" (CUDA when usable, else the CPU).
// Selecting a CUDA device makes it the process's current device.
DeviceChoice choose_device(const std::string& flag, const char* command);

// Moves the storage of every tensor in `tensors` to `device` in place: all handles sharing a
// tensor (a module's member and its named_parameters() entry) and all views of one storage (tied
// weights) follow, so the module trains on the device without being rebuilt. Gradients are
// dropped. Refuses tensors under a residency hook (offload chunks: move before packing them).
void move_to_device(const nn::NamedTensors& tensors, Device device);

// `t` itself on the CPU, else a contiguous host copy (made through a kernel on the device first,
// so paged storage is made resident before its bytes are read).
Tensor to_host(const Tensor& t);
nn::NamedTensors to_host(const nn::NamedTensors& tensors);

}  // namespace mammoth::engine::train
