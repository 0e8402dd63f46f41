#!/bin/bash
# The GPU check (DESIGN.md "GPU checks"): build here, run on a lent GPU machine.
#
#   bash tools/gpu_check.sh pack   # here (Bazel, CUDA toolkit, no GPU needed): builds the CUDA
#                                  # kernel test, the NCCL communicator test, the chunked-offload
#                                  # test, the training-loop test and the GPU benchmark, packs them
#                                  # with the non-CUDA shared libraries they load (Open MPI's
#                                  # plugins too) into gpu_pack/ (ignored)
#   bash tools/gpu_check.sh run    # on the GPU machine (CUDA 13 toolkit + driver, PyTorch, no
#                                  # Bazel, no MPI): every CUDA-vs-CPU kernel test, the NCCL
#                                  # backend on a group of one, chunked offload paging between
#                                  # GPU and pinned host memory, gpt2-tiny/llama-tiny training
#                                  # on the GPU against the CPU, then the benchmark table beside
#                                  # PyTorch; writes gpu_pack/out/summary.md (and copies
#                                  # gpu_pack/out to $OUT when that is set). ~3-4 minutes.
#
# A lent machine's command (the device tool): carry gpu_pack, run
#   bash tools/gpu_check.sh run
# with a limit of at least 580 s: the steps' own timeouts (150 + 45 + 90 + 90 + 160 s) add up
# to 535 s, so a hung step still leaves the summary to come back.
# `run` exits non-zero when a test fails or nothing could be measured.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PACK=gpu_pack
TEST_BIN=bazel-bin/test/kernels/cuda/cuda_kernels_test_bin
BENCH_BIN=bazel-bin/tools/bench/gpu/gpu_bench
NCCL_BIN=bazel-bin/test/parallel/nccl_communicator_test
OFFLOAD_BIN=bazel-bin/test/engine/offload/offload_cuda_test
TRAIN_BIN=bazel-bin/test/engine/train/train_cuda_test
# Open MPI's components (dlopened at MPI_Init). The test runs as an MPI singleton with
# ess_singleton_isolated (no orted), so these plugins and the libraries they link are all the
# MPI it needs; OMPI_MCA_mca_base_component_path points Open MPI at the packed copy.
# Network fabrics, OpenSHMEM and MPI-IO components are left out (they pull in ~20 MB of
# InfiniBand/UCX/libfabric libraries a one-process run never loads).
MPI_PLUGIN_DIR=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
MPI_PLUGIN_SKIP_RE='(ucx|ofi|openib|psm|verbs|usnic|portals|sshmem|spml|scoll|memheap|mtl|uct|_io_|fcoll|fbtl|_fs_|sharedfp|treematch|monitoring|vprotocol|_cuda)'
# Never packed: the GPU machine's own CUDA toolkit and driver provide these.
CUDA_LIBS_RE='^(libcuda|libcudart|libcublas|libcublasLt|libnccl|libcudnn[a-z_]*|libnvidia-[a-z-]*|libnvrtc|libnvJitLink)\.so'
# glibc's pieces go to their own folder: used only if the GPU machine's glibc is too old.
GLIBC_RE='^(ld-linux-x86-64|libc|libm|libpthread|libdl|librt|libresolv|libutil)\.so'

die() {
  echo "[gpu_check] $*" >&2
  exit 1
}

pack() {
  command -v bazel >/dev/null || die "pack needs bazel (run it on the build machine)"
  [[ -x /usr/local/cuda/bin/nvcc || -n "${MAMMOTH_CUDA_PATH:-}" ]] ||
    die "pack needs the CUDA toolkit (nvcc) to build the CUDA backend"
  bazel build //test/kernels/cuda:cuda_kernels_test_bin //tools/bench/gpu:gpu_bench \
    //test/parallel:nccl_communicator_test //test/engine/offload:offload_cuda_test \
    //test/engine/train:train_cuda_test ||
    die "bazel build failed"
  [[ -d "$MPI_PLUGIN_DIR" ]] || die "no Open MPI plugins at $MPI_PLUGIN_DIR"
  rm -rf "$PACK"
  mkdir -p "$PACK/bin" "$PACK/lib" "$PACK/glibc" "$PACK/mpi"
  local plugin
  for plugin in "$MPI_PLUGIN_DIR"/*.so; do
    [[ "$(basename "$plugin")" =~ $MPI_PLUGIN_SKIP_RE ]] || cp -L "$plugin" "$PACK/mpi/"
  done
  for bin in "$TEST_BIN" "$BENCH_BIN" "$NCCL_BIN" "$OFFLOAD_BIN" "$TRAIN_BIN" "$PACK"/mpi/*.so; do
    [[ -e "$bin" ]] || die "missing $bin after the build"
    if [[ "$bin" != "$PACK"/mpi/* ]]; then
      # A CPU-only build would pack binaries that can only say "no CUDA backend".
      [[ "$(readelf -S "$bin")" == *.nv_fatbin* ]] || die "$bin has no device code (CUDA disabled?)"
      cp "$bin" "$PACK/bin/"
      chmod u+w "$PACK/bin/$(basename "$bin")"
      strip --strip-unneeded "$PACK/bin/$(basename "$bin")"
    fi
    # "libfoo.so.1 => /path/libfoo.so.1 (0x...)" and the loader's "/lib64/ld-linux-x86-64.so.2 (0x...)"
    ldd "$bin" | awk '/=>/ { print $1, $3; next } /ld-linux/ { print "ld-linux-x86-64.so.2", $1 }' |
      while read -r name path; do
        [[ -n "$path" && -e "$path" ]] || continue
        if [[ "$name" =~ $CUDA_LIBS_RE ]]; then continue; fi
        if [[ "$name" =~ $GLIBC_RE ]]; then
          cp -L "$path" "$PACK/glibc/$name"
        else
          cp -L "$path" "$PACK/lib/$name"
        fi
      done
  done
  cp tools/bench/gpu/gpu_bench.py "$PACK/"
  {
    echo "commit $(git rev-parse HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (dirty)')"
    echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
    echo "nvcc $(/usr/local/cuda/bin/nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
    echo "glibc $(ldd --version | head -1 | awk '{print $NF}')"
    (cd "$PACK" && find . -type f -printf '%s %p\n' | sort -k2)
  } >"$PACK/MANIFEST"
  # Keep gpu_pack out of git even where .gitignore lacks it.
  if [[ -d .git ]] && ! git check-ignore -q "$PACK/MANIFEST" 2>/dev/null; then
    echo "/$PACK/" >>.git/info/exclude
  fi
  # The binaries are mostly device code (two architectures' fatbins): gzip shrinks them ~5x,
  # which keeps the pack well under what the device tool carries; `run` unpacks them.
  gzip -6 "$PACK"/bin/*
  local size_mb
  size_mb=$(du -sm "$PACK" | cut -f1)
  echo "[gpu_check] packed $PACK/ (${size_mb} MiB):"
  sed 's/^/  /' "$PACK/MANIFEST"
  [[ $size_mb -lt 64 ]] || echo "[gpu_check] warning: $PACK is ${size_mb} MiB; the device tool carries at most 64 MiB"
}

# find_lib_dir LIB [MORE...]: the first CUDA library directory holding all of them; as a last
# resort, where the CUDA 13 wheels of a pip-installed PyTorch keep LIB (each wheel its own dir).
find_lib_dir() {
  local d lib ok py
  for d in "${CUDA_HOME:-}/lib64" /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 \
    /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
    ok=1
    for lib in "$@"; do [[ -e "$d/$lib" ]] || ok=0; done
    [[ $ok -eq 1 ]] && { echo "$d"; return 0; }
  done
  py=$(python3 -c 'import nvidia, os; print(os.path.dirname(nvidia.__path__[0]))' 2>/dev/null) || true
  if [[ -n "$py" ]]; then
    d=$(dirname "$(find "$py" -name "$1" 2>/dev/null | head -1)" 2>/dev/null)
    [[ -n "$d" && -e "$d/$1" ]] && { echo "$d"; return 0; }
  fi
  return 1
}

# Results of run_test, by log name: exit status and the line for the summary.
declare -A RC LINE

# run_test KEY TITLE SECONDS BINARY TAG [VAR=VALUE...]: runs a packed Catch2 test through
# run()'s $launcher with the given environment and a private TEST_TMPDIR, logs to $out/KEY.log,
# echoes its TAG-prefixed lines ("[TAG] ...") and tail, and sets RC[KEY] and LINE[KEY].
run_test() {
  local key="$1" title="$2" limit="$3" bin="$4" tag="$5"
  shift 5
  echo "[gpu_check] $title"
  local t0=$SECONDS tmp="$PWD/$out/${key}_tmp" log="$out/$key.log"
  mkdir -p "$tmp"
  env TEST_TMPDIR="$tmp" "$@" timeout "$limit" "$launcher" "$PACK/bin/$bin" >"$log" 2>&1
  local rc=$?
  rm -rf "$tmp"
  [[ -n "$tag" ]] && grep -E "^\[$tag\]" "$log"
  tail -25 "$log"
  local line
  line=$(grep -E "^(All tests passed|test cases:)" "$log" | tail -1)
  [[ $rc -eq 124 ]] && line="TIMED OUT after $limit s"
  [[ -n "$line" ]] || line="exit status $rc (see $key.log)"
  RC[$key]=$rc
  LINE[$key]="$line ($((SECONDS - t0)) s)"
}

run() {
  [[ -d "$PACK/bin" ]] || die "no $PACK/ here: run 'bash tools/gpu_check.sh pack' on the build machine and carry $PACK"
  local out="$PACK/out"
  rm -rf "$out"
  mkdir -p "$out"
  local packed
  for packed in "$PACK"/bin/*.gz; do
    [[ -e "$packed" ]] || continue
    gzip -dc "$packed" >"${packed%.gz}" && chmod +x "${packed%.gz}" || die "cannot unpack $packed"
  done
  local cuda_dir libpath
  cuda_dir=$(find_lib_dir libcudart.so.13 libcublasLt.so.13) || die "no libcudart.so.13 / libcublasLt.so.13 found (set CUDA_HOME)"
  libpath="$PWD/$PACK/lib:$cuda_dir"
  # Prefer the machine's own glibc; fall back to the packed one (with its loader) if ours is newer.
  local launcher="$out/launch.sh"
  printf '#!/bin/bash\nexport LD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\nexec "$@"\n' \
    "$libpath" >"$launcher"
  chmod +x "$launcher"
  "$launcher" "$PACK/bin/gpu_bench" --probe >/dev/null 2>&1
  if [[ $? -ne 2 ]]; then
    echo "[gpu_check] the system loader cannot start the binaries; using the packed glibc"
    printf '#!/bin/bash\nexec "%s/%s/glibc/ld-linux-x86-64.so.2" --library-path "%s/%s/glibc:%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"\n' \
      "$PWD" "$PACK" "$PWD" "$PACK" "$libpath" >"$launcher"
    "$launcher" "$PACK/bin/gpu_bench" --probe >/dev/null 2>&1
    [[ $? -eq 2 ]] || die "cannot start $PACK/bin/gpu_bench with either loader"
  fi
  local bench_wrapper="$out/gpu_bench"
  printf '#!/bin/bash\nexec "%s" "%s/%s/bin/gpu_bench" "$@"\n' "$PWD/$launcher" "$PWD" "$PACK" >"$bench_wrapper"
  chmod +x "$bench_wrapper"

  local gpu
  gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
  echo "[gpu_check] GPU: ${gpu:-unknown (no nvidia-smi)}; CUDA libraries: $cuda_dir"

  run_test kernel_tests "(1) CUDA-vs-CPU kernel tests" 150 cuda_kernels_test_bin ""

  # NCCL is never packed (218 MB): the machine's own, from the CUDA directories or PyTorch's wheel.
  local nccl_dir
  nccl_dir=$(find_lib_dir libnccl.so.2)
  if [[ -z "$nccl_dir" ]]; then
    RC[nccl_test]=0
    LINE[nccl_test]="not run: no libnccl.so.2 on this machine (CUDA directories, PyTorch's nvidia wheels)"
  else
    run_test nccl_test "(1b) NCCL communicator on a group of one (MPI singleton)" 45 \
      nccl_communicator_test "" OMPI_MCA_ess_singleton_isolated=1 \
      OMPI_MCA_mca_base_component_path="$PWD/$PACK/mpi" LD_LIBRARY_PATH="$nccl_dir"
    LINE[nccl_test]="${LINE[nccl_test]}, NCCL from $nccl_dir"
  fi
  # Chunked offload with a CUDA device tier: a model 4x the device budget, offload none/host/nvme.
  run_test offload_test "(1c) chunked offload: paging between GPU and pinned host memory" 90 \
    offload_cuda_test offload_cuda
  # The training loop on the GPU against the CPU: fp32 parity, dropout masks, checkpoints that
  # cross devices, bf16 autocast (gpt2-tiny, llama-tiny).
  run_test train_test "(1d) training loop: gpt2-tiny / llama-tiny on the GPU against the CPU" 90 \
    train_cuda_test train_cuda

  echo "[gpu_check] (2) benchmarks beside PyTorch"
  t0=$SECONDS
  timeout 160 python3 "$PACK/gpu_bench.py" --bench "$bench_wrapper" --json "$out/bench.json" \
    --markdown "$out/bench.md" 2>&1 | tee "$out/bench.log"
  local bench_rc=${PIPESTATUS[0]}
  local bench_s=$((SECONDS - t0))

  {
    echo "## GPU check $(date -u +%Y-%m-%d)"
    echo
    echo "- machine: ${gpu:-unknown}"
    echo "- build: $(sed -n 1p "$PACK/MANIFEST")"
    echo "- command: bash tools/gpu_check.sh run"
    echo "- kernel tests: ${LINE[kernel_tests]}"
    echo "- NCCL communicator test: ${LINE[nccl_test]}"
    echo "- chunked offload test (GPU <-> pinned host): ${LINE[offload_test]}"
    grep -E "^\[offload_cuda\]" "$out/offload_test.log" 2>/dev/null | sed 's/^/  - /'
    echo "- training loop test (GPU vs CPU, gpt2-tiny / llama-tiny): ${LINE[train_test]}"
    grep -E "^\[train_cuda\]" "$out/train_test.log" 2>/dev/null | sed 's/^/  - /'
    echo "- benchmarks (${bench_s} s, exit $bench_rc):"
    echo
    [[ -s "$out/bench.md" ]] && cat "$out/bench.md"
  } >"$out/summary.md"
  echo
  cat "$out/summary.md"
  if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
    cp -r "$out/." "$OUT/"
  fi
  local key
  for key in "${!RC[@]}"; do
    [[ ${RC[$key]} -eq 0 ]] || return 1
  done
  [[ $bench_rc -eq 0 ]]
}

case "${1:-}" in
  pack) pack ;;
  run) run ;;
  *)
    echo "usage: bash tools/gpu_check.sh pack|run" >&2
    exit 2
    ;;
esac
