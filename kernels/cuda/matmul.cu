// cuBLASLt GEMM (kernels/cuda/gemm.h) and the matmul registry kernel over it.
//
// Row-major to column-major: a row-major [R, C] matrix with leading dim ld is the column-major
// [C, R] matrix with the same ld, i.e. its transpose. So C = op(A) op(B) (row-major) is computed
// as the column-major product C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our B and its "B" is our A,
// each described as stored, with the transpose flag carried over unchanged.
#include <cublasLt.h>

#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <unordered_map>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.h"
#include "kernels/params.h"

namespace mammoth::kernels::cuda {
namespace {

std::atomic<bool> g_allow_tf32{false};

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int kMaxDevices = 64;

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    case DType::kF16:
      return CUDA_R_16F;
    default:
      MAMMOTH_THROW() << "[gemm] unsupported dtype " << dtype_name(t) << " (f32, bf16, f16)";
  }
}

// The per-device library handle and per-(device, stream) workspaces, created on first use.
struct LtState {
  std::mutex mu;
  cublasLtHandle_t handle[kMaxDevices] = {};
  std::map<std::pair<int, cudaStream_t>, void*> workspace;
};

LtState& lt_state() {
  static LtState* s = new LtState;  // leaked: kernels may run during static destruction
  return *s;
}

cublasLtHandle_t lt_handle(int device) {
  LtState& s = lt_state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.handle[device] == nullptr) CUBLAS_CHECK(cublasLtCreate(&s.handle[device]));
  return s.handle[device];
}

void* lt_workspace(int device, cudaStream_t st) {
  LtState& s = lt_state();
  std::lock_guard<std::mutex> lock(s.mu);
  void*& w = s.workspace[{device, st}];
  if (w == nullptr) CUDA_CHECK(cudaMalloc(&w, kWorkspaceBytes));
  return w;
}

int alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int a = 16;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

using PlanKey =
    std::tuple<int, int, bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
               int64_t, int64_t, int64_t, int, bool, int, int, int, int, bool>;

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct PlanCache {
  std::mutex mu;
  std::map<PlanKey, Plan> plans;
};

PlanCache& plan_cache() {
  static PlanCache* c = new PlanCache;
  return *c;
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                                   int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, t, static_cast<uint64_t>(rows),
                                          static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof(count)));
    CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof(stride)));
  }
  return l;
}

// A and B's dtype (GemmArgs::input_dtype; kF32 means dtype's).
DType input_dtype_of(const GemmArgs& g) {
  return g.input_dtype == DType::kF32 ? g.dtype : g.input_dtype;
}

Plan make_plan(const GemmArgs& g, int device, bool tf32, bool has_bias) {
  Plan p;
  const cudaDataType_t t = cuda_type(g.dtype), ti = cuda_type(input_dtype_of(g));
  const cublasComputeType_t compute =
      g.dtype == DType::kF32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, compute, CUDA_R_32F));
  // cuBLASLt A := our B, cuBLASLt B := our A (see the file comment).
  const cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  switch (g.epilogue) {
    case Epilogue::kNone:
      break;
    case Epilogue::kBias:
      epi = CUBLASLT_EPILOGUE_BIAS;
      break;
    case Epilogue::kGeluTanh:
      epi = CUBLASLT_EPILOGUE_GELU;
      break;
    case Epilogue::kBiasGeluTanh:
      epi = CUBLASLT_EPILOGUE_GELU_BIAS;
      break;
  }
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (has_bias) {
    const cudaDataType_t bt = t;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  // Stored shapes: our B is [K, N] row-major = column-major [N, K] (or [K, N] when trans_b).
  const int64_t ar = g.trans_b ? g.K : g.N, ac = g.trans_b ? g.N : g.K;
  const int64_t br = g.trans_a ? g.M : g.K, bc = g.trans_a ? g.K : g.M;
  p.a = make_layout(ti, ar, ac, g.ldb, g.batch, g.stride_b);
  p.b = make_layout(ti, br, bc, g.lda, g.batch, g.stride_a);
  p.c = make_layout(t, g.N, g.M, g.ldc, g.batch, g.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws)));
  const uint32_t align_a = alignment_of(g.B), align_b = alignment_of(g.A),
                 align_c = alignment_of(g.C);
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c)));
  CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c)));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_handle(device), p.op, p.a, p.b, p.c,
                                                           p.c, pref, 1, &result, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  MAMMOTH_CHECK(st == CUBLAS_STATUS_SUCCESS && returned > 0)
      << "[gemm] cuBLASLt has no algorithm for " << dtype_name(g.dtype) << " M=" << g.M
      << " N=" << g.N << " K=" << g.K << " trans_a=" << g.trans_a << " trans_b=" << g.trans_b
      << " lda=" << g.lda << " ldb=" << g.ldb << " ldc=" << g.ldc << " batch=" << g.batch << ": "
      << memory::cuda::cublas_status_string(static_cast<int>(st));
  p.algo = result.algo;
  return p;
}

template <typename T>
__global__ void scale_matrix(T* c, int64_t rows, int64_t cols, int64_t ld, float beta) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < rows * cols;
       e += int64_t{gridDim.x} * blockDim.x) {
    T* p = c + (e / cols) * ld + e % cols;
    *p = from_float<T>(beta == 0.0f ? 0.0f : beta * to_float(*p));
  }
}

// K == 0: op(A) op(B) is all zeros, so C = beta * C (and the epilogue of a zero product).
void gemm_empty_k(const GemmArgs& g) {
  MAMMOTH_CHECK(g.epilogue == Epilogue::kNone) << "[gemm] K == 0 with an epilogue is not supported";
  for (int64_t i = 0; i < g.batch; ++i) {
    const int64_t n = g.M * g.N;
    const unsigned grid = grid_for(n, 256);
    switch (g.dtype) {
      case DType::kF32:
        scale_matrix<<<grid, 256, 0, stream()>>>(static_cast<float*>(g.C) + i * g.stride_c, g.M,
                                                 g.N, g.ldc, g.beta);
        break;
      case DType::kBF16:
        scale_matrix<<<grid, 256, 0, stream()>>>(static_cast<bf16_t*>(g.C) + i * g.stride_c, g.M,
                                                 g.N, g.ldc, g.beta);
        break;
      default:
        scale_matrix<<<grid, 256, 0, stream()>>>(static_cast<f16_t*>(g.C) + i * g.stride_c, g.M,
                                                 g.N, g.ldc, g.beta);
        break;
    }
    CUDA_CHECK_LAUNCH("gemm_empty_k");
  }
}

}  // namespace

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow); }
bool allow_tf32() { return g_allow_tf32.load(); }

void gemm(const GemmArgs& g) {
  MAMMOTH_CHECK(g.M >= 0 && g.N >= 0 && g.K >= 0 && g.batch >= 1)
      << "[gemm] bad shape M=" << g.M << " N=" << g.N << " K=" << g.K << " batch=" << g.batch;
  if (g.M == 0 || g.N == 0) return;
  if (g.K == 0) return gemm_empty_k(g);
  const bool has_bias = g.epilogue == Epilogue::kBias || g.epilogue == Epilogue::kBiasGeluTanh;
  MAMMOTH_CHECK(!has_bias || g.bias != nullptr) << "[gemm] bias epilogue without a bias";
  // A zero batch stride broadcasts an operand; cuBLASLt's strided batch is not documented to
  // allow it, so such products run one batch entry at a time.
  const DType in_dtype = input_dtype_of(g);
  MAMMOTH_CHECK(in_dtype == g.dtype || (g.dtype == DType::kF32 && in_dtype != DType::kF64))
      << "[gemm] " << dtype_name(in_dtype) << " operands need an f32 or " << dtype_name(in_dtype)
      << " C, got " << dtype_name(g.dtype);
  if (g.batch > 1 && (g.stride_a == 0 || g.stride_b == 0 || g.stride_c == 0)) {
    const size_t es = dtype_size(g.dtype), ies = dtype_size(in_dtype);
    for (int64_t i = 0; i < g.batch; ++i) {
      GemmArgs one = g;
      one.batch = 1;
      one.A = static_cast<const char*>(g.A) + i * g.stride_a * ies;
      one.B = static_cast<const char*>(g.B) + i * g.stride_b * ies;
      one.C = static_cast<char*>(g.C) + i * g.stride_c * es;
      gemm(one);
    }
    return;
  }
  const int device = memory::cuda::current_device();
  const bool tf32 = allow_tf32();
  const PlanKey key{device,
                    static_cast<int>(g.dtype) * 16 + static_cast<int>(in_dtype),
                    g.trans_a,
                    g.trans_b,
                    g.M,
                    g.N,
                    g.K,
                    g.lda,
                    g.ldb,
                    g.ldc,
                    g.batch,
                    g.batch > 1 ? g.stride_a : 0,
                    g.batch > 1 ? g.stride_b : 0,
                    g.batch > 1 ? g.stride_c : 0,
                    static_cast<int>(g.epilogue),
                    tf32,
                    alignment_of(g.A),
                    alignment_of(g.B),
                    alignment_of(g.C),
                    has_bias ? alignment_of(g.bias) : 0,
                    g.beta != 0.0f};
  PlanCache& cache = plan_cache();
  Plan plan;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.plans.find(key);
    if (it == cache.plans.end())
      it = cache.plans.emplace(key, make_plan(g, device, tf32, has_bias)).first;
    plan = it->second;
  }
  if (has_bias) {
    // The bias pointer changes per call; the descriptor is shared, so it is set under the lock
    // together with the launch below only for this call's duration.
    std::lock_guard<std::mutex> lock(cache.mu);
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias,
                                                sizeof(g.bias)));
    CUBLAS_CHECK(cublasLtMatmul(lt_handle(device), plan.op, &g.alpha, g.B, plan.a, g.A, plan.b,
                                &g.beta, g.C, plan.c, g.C, plan.c, &plan.algo,
                                lt_workspace(device, stream()), kWorkspaceBytes, stream()));
    return;
  }
  CUBLAS_CHECK(cublasLtMatmul(lt_handle(device), plan.op, &g.alpha, g.B, plan.a, g.A, plan.b,
                              &g.beta, g.C, plan.c, g.C, plan.c, &plan.algo,
                              lt_workspace(device, stream()), kWorkspaceBytes, stream()));
}

namespace {

// Operand [rows, cols] with one unit stride: row-major (ld = row stride) or a transposed view.
struct MatrixLayout {
  bool trans;
  int64_t ld;
};

MatrixLayout layout_of(const TensorArg& t) {
  const int64_t rs = t.strides[t.ndim - 2], cs = t.strides[t.ndim - 1];
  const int64_t rows = t.shape[t.ndim - 2], cols = t.shape[t.ndim - 1];
  // cuBLASLt needs ld >= the stored leading extent even where a size-1 dim makes it unused.
  if (cs == 1 || cols == 1)
    return {false, std::max<int64_t>(rows == 1 ? cols : rs, std::max<int64_t>(cols, 1))};
  MAMMOTH_CHECK(rs == 1 || rows == 1)
      << "[matmul] operand needs a unit stride in its last two dims (strides " << rs << ", " << cs
      << ")";
  return {true, std::max<int64_t>(cs, std::max<int64_t>(rows, 1))};
}

template <typename T>
__global__ void round_to_half(const float* src, T* dst, int64_t n) {
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < n;
       e += int64_t{gridDim.x} * blockDim.x) {
    dst[e] = from_float<T>(src[e]);
  }
}

// A 16-bit copy of an f32 operand with the same strides: every element of its footprint (one
// past the largest offset it addresses; broadcast dims have stride 0) rounded to nearest even,
// so the copy's data pointer stands in for the operand's with the same ld and batch stride.
memory::cuda::DeviceBuffer rounded_copy(const TensorArg& t, bool bf16) {
  int64_t extent = 1;
  for (int d = 0; d < t.ndim; ++d) {
    if (t.shape[d] == 0) return memory::cuda::DeviceBuffer();
    extent += (t.shape[d] - 1) * t.strides[d];
  }
  memory::cuda::DeviceBuffer out(static_cast<size_t>(extent) * 2);
  const auto* src = static_cast<const float*>(t.data);
  if (bf16) {
    round_to_half<<<grid_for(extent, 256), 256, 0, stream()>>>(src, out.as<bf16_t>(), extent);
  } else {
    round_to_half<<<grid_for(extent, 256), 256, 0, stream()>>>(src, out.as<f16_t>(), extent);
  }
  CUDA_CHECK_LAUNCH("matmul: rounding an operand to 16 bits");
  return out;
}

template <typename T>
void matmul_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                   const void* params) {
  const auto* p = static_cast<const MatmulParams*>(params);
  const TensorArg &a = in[0], &b = in[1], &c = out[0];
  const MatrixLayout la = layout_of(a), lb = layout_of(b);
  GemmArgs g;
  g.dtype = dtype_of<T>();
  g.batch = a.shape[0];
  g.M = a.shape[1];
  g.K = a.shape[2];
  g.N = b.shape[2];
  g.A = a.data;
  g.lda = la.ld;
  g.trans_a = la.trans;
  g.B = b.data;
  g.ldb = lb.ld;
  g.trans_b = lb.trans;
  g.C = c.data;
  g.ldc = std::max<int64_t>(c.strides[1], std::max<int64_t>(g.N, 1));
  g.stride_a = a.strides[0];
  g.stride_b = b.strides[0];
  g.stride_c = c.strides[0];
  g.alpha = static_cast<float>(p->alpha);
  g.beta = static_cast<float>(p->beta);
  if (g.batch == 0) return;
  // Autocast on f32 operands: round them to bf16 / f16 (the CPU kernel's semantics) and let
  // cuBLASLt multiply those on tensor cores with fp32 accumulation into the f32 C.
  memory::cuda::DeviceBuffer a16, b16;
  if constexpr (std::is_same_v<T, float>) {
    if (p->compute != MatmulCompute::kNative) {
      const bool bf16 = p->compute == MatmulCompute::kBF16;
      g.input_dtype = bf16 ? DType::kBF16 : DType::kF16;
      a16 = rounded_copy(a, bf16);
      b16 = rounded_copy(b, bf16);
      g.A = a16.get();
      g.B = b16.get();
    }
  }
  gemm(g);
}

}  // namespace

void register_matmul(Registry& r) { MAMMOTH_CUDA_REG3(r, matmul, matmul_kernel); }

}  // namespace mammoth::kernels::cuda
