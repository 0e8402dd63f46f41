// A job in which rank 1 stalls (sleeps) while the others enter an operation with a short
// deadline: the deadline must abort the whole job with a message naming the rank, group and
// operation. Driven by comm_timeout_test.sh, which checks the exit code, message and time.
//   comm_stall --op all_reduce|barrier|recv|split --timeout 2 [--sleep 60]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "engine/tensor.h"
#include "parallel/comm/mpi_communicator.h"
#include "parallel/mesh.h"

int main(int argc, char** argv) {
  using namespace mammoth;
  std::string op = "all_reduce";
  double timeout = 2, sleep_s = 60;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--op")) op = argv[i + 1];
    if (!std::strcmp(argv[i], "--timeout")) timeout = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--sleep")) sleep_s = std::atof(argv[i + 1]);
  }
  auto world = parallel::mpi_world(parallel::CommOptions{.timeout_s = timeout});
  // Everyone passes one healthy collective first, so the stall below is the only problem.
  engine::Tensor x = engine::Tensor::ones({1000}, DType::kF32);
  world->all_reduce(x);
  std::printf("[comm_stall] rank %d: warm-up all_reduce gave %g\n", world->rank(),
              x.to_vector()[0]);
  std::fflush(stdout);
  // For --op mesh every rank builds a dp=2 mesh first; the stall then hits the dp group.
  std::unique_ptr<parallel::DeviceMesh> mesh;
  if (op == "mesh") {
    mesh = std::make_unique<parallel::DeviceMesh>(
        std::move(world), parallel::MeshShape{.dp = 2},
        parallel::MeshOptions{.comm = {.timeout_s = timeout}});
  }
  const int rank = parallel::mpi_runtime().world_rank();
  if (rank == 1) {
    std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
    std::printf("[comm_stall] rank 1 woke up; the job should have been aborted by now\n");
    return 0;
  }
  if (op == "all_reduce") {
    world->all_reduce(x);
  } else if (op == "barrier") {
    world->barrier();
  } else if (op == "recv") {
    world->recv(x, 1, 7);
  } else if (op == "mesh") {
    mesh->group(parallel::Axis::kDp).all_reduce(x, parallel::ReduceOp::kAvg);
  } else {
    std::fprintf(stderr, "[comm_stall] unknown --op %s\n", op.c_str());
    return 2;
  }
  std::printf("[comm_stall] rank %d: %s returned although rank 1 stalled\n", rank, op.c_str());
  return 0;
}
