#!/bin/bash
# Runs an MPI program on N local ranks for a Bazel sh_test: mpirun.sh -np N binary [args...]
#
# Every MPI test goes through here so the launch flags live in one place:
#   --allow-run-as-root  CI and the dev machine run as root;
#   --oversubscribe      tests ask for more ranks than the machine has cores;
#   btl self,vader       shared memory between local ranks; no network probing;
#   a short TMPDIR       Open MPI puts Unix sockets there, and Bazel's test tmpdir is longer
#                        than a socket path may be.
# The test fails if mpirun fails, i.e. if any rank exits non-zero or aborts.
set -euo pipefail

usage() {
  echo "usage: mpirun.sh -np N binary [args...]" >&2
  exit 2
}

[[ $# -ge 3 && "$1" == "-np" ]] || usage
np="$2"
shift 2
[[ "$np" =~ ^[0-9]+$ && "$np" -ge 1 ]] || usage
binary="$1"
shift
if [[ ! -x "$binary" ]]; then
  echo "[mpirun.sh] not an executable: $binary (cwd $(pwd))" >&2
  exit 2
fi

mpi_tmp="$(mktemp -d /tmp/mammoth-mpi.XXXXXX)"
trap 'rm -rf "$mpi_tmp"' EXIT

export TMPDIR="$mpi_tmp"
# Keep Open MPI quiet about the missing high-speed interconnects on a laptop or CI box.
export OMPI_MCA_btl="self,vader"
export OMPI_MCA_pml="ob1"
export OMPI_MCA_osc="pt2pt"
export OMPI_MCA_btl_vader_single_copy_mechanism="none"
export OMPI_MCA_rmaps_base_oversubscribe="1"

echo "[mpirun.sh] mpirun -np $np $binary $*"
exec mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" "$binary" "$@"
