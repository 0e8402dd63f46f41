// Argument checks and buffer arithmetic shared by the Communicator backends, so both enforce the
// buffer rules stated in communicator.h with the same messages. Internal to parallel/comm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "base/device.h"
#include "engine/tensor.h"
#include "parallel/comm/communicator.h"

namespace mammoth::parallel::detail {

// Where a collective's arguments come from in an error message: "[all_reduce] group 'dp' (mpi)".
std::string where(const char* op, const Communicator& comm);

// Throws unless `t` is defined, contiguous and on a device of `device_type`.
void check_tensor(const engine::Tensor& t, const char* arg, const char* op,
                  const Communicator& comm, DeviceType device_type);
// Throws unless in and out have the same dtype and device.
void check_same_kind(const engine::Tensor& in, const engine::Tensor& out, const char* op,
                     const Communicator& comm);
// Throws unless `op` is defined for `dtype`: sum/max for all numeric types except bool (max
// only), avg for floating types only.
void check_reduce_dtype(ReduceOp op, DType dtype, const char* name, const Communicator& comm);
void check_peer(int peer, const char* op, const Communicator& comm);

// all_to_all_v's counts: one per rank, none negative, summing to in's and out's sizes; in and
// out distinct (when either holds anything).
void check_v_counts(const engine::Tensor& in, std::span<const int64_t> send_counts,
                    const engine::Tensor& out, std::span<const int64_t> recv_counts, const char* op,
                    const Communicator& comm);

// Byte ranges [a, a+na) and [b, b+nb) intersect.
bool overlaps(const void* a, size_t na, const void* b, size_t nb);

// Divides every element of a CPU tensor of floating dtype by `divisor` (the avg of all_reduce).
void divide_cpu(const engine::Tensor& t, int divisor);

// "all_reduce(sum, f32, 1024 elements)".
std::string describe_op(const char* op, const char* detail, const engine::Tensor& t);

}  // namespace mammoth::parallel::detail
