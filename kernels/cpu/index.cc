// CPU indexing kernels on [A, R, C] views: index_select / index_add (embedding and its
// gradient) and gather / scatter_add. The accumulating kernels split work by (a, column
// block), so each output element is summed by one thread in index order: deterministic.
#include "base/error.h"
#include "kernels/cpu/register.h"

namespace mammoth::kernels::cpu {
namespace {

constexpr int64_t kColBlock = 256;

void check_index(const char* op, int64_t v, int64_t R) {
  MAMMOTH_CHECK(v >= 0 && v < R) << "[" << op << "] index " << v
                                 << " is out of range for a dim of size " << R;
}

template <typename T>
void index_select_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                         const void*) {
  const TensorArg& x = in[0];
  const int64_t A = x.shape[0], R = x.shape[1], C = x.shape[2], I = in[1].numel();
  const int64_t* idx = in[1].ptr<const int64_t>();
  const T* xp = x.ptr<const T>();
  T* y = out[0].ptr<T>();
  for (int64_t i = 0; i < I; ++i) check_index("index_select", idx[i], R);
  parallel_for(0, A * I, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t ai = b; ai < e; ++ai) {
                   const int64_t a = ai / I, i = ai % I;
                   std::copy(xp + (a * R + idx[i]) * C, xp + (a * R + idx[i] + 1) * C, y + ai * C);
                 }
               });
}

template <typename T>
void index_add_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  const TensorArg& dx = out[0];
  const int64_t A = dx.shape[0], R = dx.shape[1], C = dx.shape[2], I = in[1].numel();
  const int64_t* idx = in[1].ptr<const int64_t>();
  const T* dy = in[0].ptr<const T>();
  T* dxp = dx.ptr<T>();
  for (int64_t i = 0; i < I; ++i) check_index("index_add", idx[i], R);
  const int64_t cblocks = (C + kColBlock - 1) / kColBlock;
  parallel_for(0, A * cblocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t ab = b; ab < e; ++ab) {
      const int64_t a = ab / cblocks, c0 = (ab % cblocks) * kColBlock;
      const int64_t c1 = std::min(C, c0 + kColBlock);
      for (int64_t i = 0; i < I; ++i) {
        T* dst = dxp + (a * R + idx[i]) * C;
        const T* src = dy + (a * I + i) * C;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    }
  });
}

template <typename T>
void gather_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out, const void*) {
  const TensorArg& x = in[0];
  const int64_t A = x.shape[0], R = x.shape[1], C = x.shape[2], I = in[1].shape[1];
  const int64_t* idx = in[1].ptr<const int64_t>();
  const T* xp = x.ptr<const T>();
  T* y = out[0].ptr<T>();
  parallel_for(0, A * I, std::max<int64_t>(1, 4096 / std::max<int64_t>(C, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t ai = b; ai < e; ++ai) {
                   const int64_t a = ai / I;
                   for (int64_t c = 0; c < C; ++c) {
                     const int64_t r = idx[ai * C + c];
                     check_index("gather", r, R);
                     y[ai * C + c] = xp[(a * R + r) * C + c];
                   }
                 }
               });
}

template <typename T>
void scatter_add_kernel(std::span<const TensorArg> in, std::span<const TensorArg> out,
                        const void*) {
  const TensorArg& dx = out[0];
  const int64_t A = dx.shape[0], R = dx.shape[1], C = dx.shape[2], I = in[1].shape[1];
  const int64_t* idx = in[1].ptr<const int64_t>();
  const T* dy = in[0].ptr<const T>();
  T* dxp = dx.ptr<T>();
  const int64_t cblocks = (C + kColBlock - 1) / kColBlock;
  parallel_for(0, A * cblocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t ab = b; ab < e; ++ab) {
      const int64_t a = ab / cblocks, c0 = (ab % cblocks) * kColBlock;
      const int64_t c1 = std::min(C, c0 + kColBlock);
      for (int64_t i = 0; i < I; ++i) {
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t r = idx[(a * I + i) * C + c];
          check_index("scatter_add", r, R);
          dxp[(a * R + r) * C + c] += dy[(a * I + i) * C + c];
        }
      }
    }
  });
}

}  // namespace

void register_index(Registry& r) {
#define MAMMOTH_REG(NAME) \
  add_float_kernels(r, Kernel::NAME, NAME##_kernel<float>, NAME##_kernel<double>);
  MAMMOTH_REG(index_select)
  // A 16-bit embedding table's rows are copied as they are (the embedding op widens them).
  r.add(Kernel::index_select, DeviceType::kCPU, DType::kBF16, index_select_kernel<bf16>);
  r.add(Kernel::index_select, DeviceType::kCPU, DType::kF16, index_select_kernel<f16>);
  MAMMOTH_REG(index_add)
  MAMMOTH_REG(gather)
  MAMMOTH_REG(scatter_add)
#undef MAMMOTH_REG
}

}  // namespace mammoth::kernels::cpu
