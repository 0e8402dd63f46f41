// The NCCL backend on CUDA tensors (needs a GPU: tagged "gpu"; CI only builds it). One process
// (NCCL refuses two ranks on one device, and the lent machine has one GPU): the communicator is
// bootstrapped over MPI, every collective runs on the device and its result, copied back, is
// what a group of one must give; a CPU tensor is refused naming the operation.
#include "parallel/comm/nccl_communicator.h"

#include <catch2/catch.hpp>

#include "base/error.h"
#include "engine/ops.h"
#include "parallel/comm/mpi_communicator.h"

using namespace mammoth;
using engine::Tensor;
using parallel::ReduceOp;

namespace {

Tensor ramp(int64_t n, DType dtype) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<double>(i % 13) - 6;
  return Tensor::from_vector(v, {n}, dtype);
}

}  // namespace

TEST_CASE("NCCL collectives on a group of one give the identities") {
  auto world = parallel::mpi_world({.timeout_s = 60});
  REQUIRE(world->size() == 1);
  parallel::NcclCommunicator nccl(*world, 0, "world");
  CHECK(std::string(nccl.backend()) == "nccl");
  const Device gpu = Device::cuda(0);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF64}) {
    INFO(dtype_name(dtype));
    const int64_t n = 1000;
    const Tensor host = ramp(n, dtype);
    const std::vector<double> want = host.to_vector();
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      Tensor t = host.to(gpu);
      nccl.all_reduce(t, op);
      CHECK(t.to(Device::cpu()).to_vector() == want);
    }
    Tensor out = Tensor::zeros({n}, dtype, gpu);
    nccl.all_gather(host.to(gpu), out);
    CHECK(out.to(Device::cpu()).to_vector() == want);
    Tensor shard = Tensor::zeros({n}, dtype, gpu);
    nccl.reduce_scatter(host.to(gpu), shard, ReduceOp::kSum);
    CHECK(shard.to(Device::cpu()).to_vector() == want);
    Tensor b = host.to(gpu);
    nccl.broadcast(b, 0);
    CHECK(b.to(Device::cpu()).to_vector() == want);
    Tensor a2a = Tensor::zeros({n}, dtype, gpu);
    nccl.all_to_all(host.to(gpu), a2a);
    CHECK(a2a.to(Device::cpu()).to_vector() == want);
    Tensor a2av = Tensor::zeros({n}, dtype, gpu);
    const std::vector<int64_t> counts{n};
    nccl.all_to_all_v(host.to(gpu), counts, a2av, counts);
    CHECK(a2av.to(Device::cpu()).to_vector() == want);
    const std::vector<int64_t> none{0};
    nccl.all_to_all_v(Tensor::zeros({0}, dtype, gpu), none, Tensor::zeros({0}, dtype, gpu), none);
  }
  nccl.barrier();
  try {
    nccl.all_reduce(ramp(4, DType::kF32));
    FAIL("a CPU tensor was accepted");
  } catch (const Error& e) {
    CHECK_THAT(e.message(), Catch::Contains("[all_reduce]"));
  }
}
