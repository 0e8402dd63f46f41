// Smallest MPI program the test launcher runs: every rank contributes rank + 1 to an
// Allreduce and checks the sum, so a broken launcher or MPI install fails the test.
#include <mpi.h>

#include <cstdio>

namespace {

int check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    std::fprintf(stderr, "[mpi_hello] %s failed: %s\n", what, msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  check(MPI_Init(&argc, &argv), "MPI_Init");
  int rank = 0;
  int size = 0;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  const long mine = rank + 1;
  long sum = 0;
  check(MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  const long expected = static_cast<long>(size) * (size + 1) / 2;
  int ok = sum == expected ? 1 : 0;
  std::printf("[mpi_hello] rank %d of %d: sum %ld (expected %ld)\n", rank, size, sum, expected);
  check(MPI_Finalize(), "MPI_Finalize");
  if (!ok || size < 2) {
    std::fprintf(stderr, "[mpi_hello] rank %d: wrong sum or fewer than 2 ranks (size %d)\n", rank,
                 size);
    return 1;
  }
  return 0;
}
