// Test fixture for cuda_library: a host entry point implemented in a .cu file.
#pragma once

#include <string>

namespace mammoth::testdata {

// Number of CUDA devices, or 0 with *reason set when there is no usable device (no driver,
// no GPU). Throws std::runtime_error on any other CUDA error.
int cuda_device_count(std::string* reason);

// Runs a one-thread kernel that writes 42 and reads it back; only call with a device.
int cuda_answer();

}  // namespace mammoth::testdata
