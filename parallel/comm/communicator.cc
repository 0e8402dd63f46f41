// Shared pieces of the Communicator backends: op names and the argument checks of
// buffer_checks.h.
#include "parallel/comm/communicator.h"

#include <cstdint>
#include <sstream>

#include "base/error.h"
#include "base/thread_pool.h"
#include "parallel/comm/buffer_checks.h"

namespace mammoth::parallel {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

namespace detail {

std::string where(const char* op, const Communicator& comm) {
  return std::string("[") + op + "] group '" + comm.name() + "' (" + comm.backend() + ")";
}

void check_tensor(const engine::Tensor& t, const char* arg, const char* op,
                  const Communicator& comm, DeviceType device_type) {
  MAMMOTH_CHECK(t.defined()) << where(op, comm) << ": " << arg << " is an undefined tensor";
  MAMMOTH_CHECK(t.is_contiguous())
      << where(op, comm) << ": " << arg << " must be contiguous, got shape "
      << engine::shape_str(t.shape()) << " strides " << engine::shape_str(t.strides());
  MAMMOTH_CHECK(t.device().type == device_type)
      << where(op, comm) << ": " << arg << " is on " << t.device() << " but the " << comm.backend()
      << " backend takes " << (device_type == DeviceType::kCPU ? "CPU" : "CUDA") << " tensors";
}

void check_same_kind(const engine::Tensor& in, const engine::Tensor& out, const char* op,
                     const Communicator& comm) {
  MAMMOTH_CHECK(in.dtype() == out.dtype())
      << where(op, comm) << ": in is " << in.dtype() << " but out is " << out.dtype();
  MAMMOTH_CHECK(in.device() == out.device())
      << where(op, comm) << ": in is on " << in.device() << " but out is on " << out.device();
}

void check_reduce_dtype(ReduceOp op, DType dtype, const char* name, const Communicator& comm) {
  if (op == ReduceOp::kAvg) {
    MAMMOTH_CHECK(is_floating(dtype)) << where(name, comm) << ": avg needs a floating dtype, got "
                                      << dtype << " (use sum and divide)";
  }
  if (dtype == DType::kBool) {
    MAMMOTH_CHECK(op == ReduceOp::kMax)
        << where(name, comm) << ": bool tensors reduce only with max (logical or), not "
        << reduce_op_name(op);
  }
}

void check_peer(int peer, const char* op, const Communicator& comm) {
  MAMMOTH_CHECK(peer >= 0 && peer < comm.size())
      << where(op, comm) << ": peer " << peer << " is not a rank of this group of " << comm.size();
}

void check_v_counts(const engine::Tensor& in, std::span<const int64_t> send_counts,
                    const engine::Tensor& out, std::span<const int64_t> recv_counts, const char* op,
                    const Communicator& comm) {
  const auto check = [&](std::span<const int64_t> counts, const engine::Tensor& t,
                         const char* counts_name, const char* arg) {
    MAMMOTH_CHECK(static_cast<int64_t>(counts.size()) == comm.size())
        << where(op, comm) << ": " << counts_name << " has " << counts.size()
        << " entries, one per rank of the group (" << comm.size() << ") needed";
    int64_t total = 0;
    for (size_t i = 0; i < counts.size(); ++i) {
      MAMMOTH_CHECK(counts[i] >= 0)
          << where(op, comm) << ": " << counts_name << "[" << i << "] is " << counts[i];
      total += counts[i];
    }
    MAMMOTH_CHECK(total == t.numel()) << where(op, comm) << ": " << counts_name << " sum to "
                                      << total << " but " << arg << " holds " << t.numel();
  };
  check(send_counts, in, "send_counts", "in");
  check(recv_counts, out, "recv_counts", "out");
  MAMMOTH_CHECK(!overlaps(in.raw_data(), in.nbytes(), out.raw_data(), out.nbytes()))
      << where(op, comm) << ": in and out overlap (all_to_all_v has no in-place form)";
}

bool overlaps(const void* a, size_t na, const void* b, size_t nb) {
  if (na == 0 || nb == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a);
  const auto pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + nb && pb < pa + na;
}

namespace {

template <typename T, typename Load, typename Store>
void divide_typed(void* data, int64_t n, int divisor, Load load, Store store) {
  T* p = static_cast<T*>(data);
  // One pass over the buffer; worth threads only for large buckets.
  parallel_for(0, n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = store(load(p[i]) / divisor);
  });
}

}  // namespace

void divide_cpu(const engine::Tensor& t, int divisor) {
  if (divisor == 1 || t.numel() == 0) return;
  void* d = t.raw_data();
  const int64_t n = t.numel();
  switch (t.dtype()) {
    case DType::kF32:
      divide_typed<float>(
          d, n, divisor, [](float v) { return v; }, [](float v) { return v; });
      return;
    case DType::kF64:
      divide_typed<double>(
          d, n, divisor, [](double v) { return v; }, [](double v) { return v; });
      return;
    case DType::kBF16:
      divide_typed<bf16>(d, n, divisor, bf16_to_float, float_to_bf16);
      return;
    case DType::kF16:
      divide_typed<f16>(d, n, divisor, f16_to_float, float_to_f16);
      return;
    default:
      MAMMOTH_THROW() << "[divide_cpu] avg of " << t.dtype() << " is not supported";
  }
}

std::string describe_op(const char* op, const char* detail, const engine::Tensor& t) {
  std::ostringstream s;
  s << op << "(";
  if (detail && *detail) s << detail << ", ";
  if (t.defined()) {
    s << t.dtype() << ", " << t.numel() << " elements";
  }
  s << ")";
  return s.str();
}

}  // namespace detail
}  // namespace mammoth::parallel
