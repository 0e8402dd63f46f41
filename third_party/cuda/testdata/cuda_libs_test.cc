// Links //third_party/cuda (cudart, cuBLAS, cuBLASLt, NCCL) from plain C++ built with
// -Wall -Wextra -Werror, and checks that the libraries loaded at run time are the versions
// the headers describe. None of these calls needs a GPU or a driver.
#include <cstdio>

#ifdef MAMMOTH_TEST_CUDA
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>
#endif

int main() {
#ifdef MAMMOTH_TEST_CUDA
  int failures = 0;
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) != cudaSuccess || runtime != CUDART_VERSION) {
    std::fprintf(stderr, "cudart: runtime %d, headers %d\n", runtime, CUDART_VERSION);
    ++failures;
  }
  int cublas_major = -1;
  if (cublasGetProperty(MAJOR_VERSION, &cublas_major) != CUBLAS_STATUS_SUCCESS ||
      cublas_major != CUBLAS_VER_MAJOR) {
    std::fprintf(stderr, "cuBLAS: library major %d, headers %d\n", cublas_major, CUBLAS_VER_MAJOR);
    ++failures;
  }
  const size_t lt = cublasLtGetVersion();
  if (lt / 10000 != CUBLAS_VER_MAJOR) {  // cuBLASLt ships with cuBLAS
    std::fprintf(stderr, "cuBLASLt: library %zu, headers major %d\n", lt, CUBLAS_VER_MAJOR);
    ++failures;
  }
  int nccl = 0;
  if (ncclGetVersion(&nccl) != ncclSuccess || nccl != NCCL_VERSION_CODE) {
    std::fprintf(stderr, "NCCL: library %d, headers %d\n", nccl, NCCL_VERSION_CODE);
    ++failures;
  }
  std::printf("cudart %d, cuBLAS %d, cuBLASLt %zu, NCCL %d\n", runtime, cublas_major, lt, nccl);
  return failures == 0 ? 0 : 1;
#else
  std::printf("CUDA disabled (no toolkit)\n");
  return 0;
#endif
}
