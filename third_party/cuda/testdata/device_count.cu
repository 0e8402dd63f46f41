// Test fixture for cuda_library: host code and a kernel compiled by nvcc for sm_80/sm_90.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "base/error.h"
#include "third_party/cuda/testdata/device_count.h"

namespace mammoth::testdata {
namespace {

__global__ void write_answer(int* out) { *out = 42; }

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw std::runtime_error(std::string("[cuda_answer] ") + what + ": " + cudaGetErrorString(rc));
  }
}

}  // namespace

int cuda_device_count(std::string* reason) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc == cudaErrorInsufficientDriver || rc == cudaErrorNoDevice) {
    *reason = cudaGetErrorString(rc);
    return 0;
  }
  check(rc, "cudaGetDeviceCount");
  return count;
}

int cuda_answer() {
  int* device = nullptr;
  check(cudaMalloc(&device, sizeof(int)), "cudaMalloc");
  write_answer<<<1, 1>>>(device);
  check(cudaGetLastError(), "launch write_answer");
  int host = 0;
  check(cudaMemcpy(&host, device, sizeof(int), cudaMemcpyDeviceToHost), "cudaMemcpy");
  check(cudaFree(device), "cudaFree");
  // Uses //base from device code's translation unit: proves deps' headers reach nvcc.
  MAMMOTH_CHECK(host == 42) << "[cuda_answer] kernel wrote " << host << ", expected 42";
  return host;
}

}  // namespace mammoth::testdata
