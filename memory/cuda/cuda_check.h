// Status checks for every CUDA, cuBLAS(Lt) and NCCL call: a failure throws mammoth::Error with
// the file, line, the call's text and the library's decoded error name and string.
//
//   CUDA_CHECK(cudaMalloc(&p, n));
//   CUBLAS_CHECK(cublasLtMatmul(...));    // the caller includes <cublasLt.h> or <cublas_v2.h>
//   NCCL_CHECK(ncclAllReduce(...));       // the caller includes <nccl.h>
//
// The macros only name cuBLAS and NCCL functions when expanded, so this header needs nothing
// but the CUDA runtime.
#pragma once

#include <cuda_runtime_api.h>

#include "base/error.h"

namespace mammoth::memory::cuda {
// "CUBLAS_STATUS_NOT_SUPPORTED (the functionality requested is not supported)"; decoded here so
// that code using only cuBLASLt need not link libcublas for cublasGetStatusString.
const char* cublas_status_string(int status);
}  // namespace mammoth::memory::cuda

#define CUDA_CHECK(expr)                                                                           \
  do {                                                                                             \
    const cudaError_t mammoth_cuda_rc_ = (expr);                                                   \
    if (mammoth_cuda_rc_ != cudaSuccess) {                                                         \
      MAMMOTH_THROW() << "[cuda] " #expr " failed: " << cudaGetErrorName(mammoth_cuda_rc_) << " (" \
                      << cudaGetErrorString(mammoth_cuda_rc_) << ")";                              \
    }                                                                                              \
  } while (0)

// After a kernel launch: reports bad launch configurations (and earlier asynchronous faults).
#define CUDA_CHECK_LAUNCH(name) CUDA_CHECK((static_cast<void>(name), cudaGetLastError()))

#define CUBLAS_CHECK(expr)                                              \
  do {                                                                  \
    const cublasStatus_t mammoth_cublas_rc_ = (expr);                   \
    if (mammoth_cublas_rc_ != CUBLAS_STATUS_SUCCESS) {                  \
      MAMMOTH_THROW() << "[cublas] " #expr " failed: "                  \
                      << ::mammoth::memory::cuda::cublas_status_string( \
                             static_cast<int>(mammoth_cublas_rc_));     \
    }                                                                   \
  } while (0)

#define NCCL_CHECK(expr)                                                                     \
  do {                                                                                       \
    const ncclResult_t mammoth_nccl_rc_ = (expr);                                            \
    if (mammoth_nccl_rc_ != ncclSuccess) {                                                   \
      MAMMOTH_THROW() << "[nccl] " #expr " failed: " << ncclGetErrorString(mammoth_nccl_rc_) \
                      << " (code " << static_cast<int>(mammoth_nccl_rc_)                     \
                      << ", last: " << ncclGetLastError(nullptr) << ")";                     \
    }                                                                                        \
  } while (0)
