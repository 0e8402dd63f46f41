#!/usr/bin/env bash
# Builds and runs Mammoth's libFuzzer targets (test/fuzz/*_fuzz.cc) with AddressSanitizer and
# UndefinedBehaviorSanitizer. See docs/FUZZING.md.
#
#   bash tools/fuzz.sh                      # every target, 20 s each (the CI size)
#   bash tools/fuzz.sh --seconds 600 json   # one target for 10 minutes
#   bash tools/fuzz.sh --runs 10000000      # every target for 10M executions (offline)
#   bash tools/fuzz.sh --runs 10000000 --seconds 3600   # 10M executions or an hour each
#   bash tools/fuzz.sh --build-only
#
# Needs Debian 12's clang-16, libfuzzer-16-dev and libclang-rt-16-dev (CLANGXX overrides the
# compiler). Our Bazel toolchain is gcc, so this script compiles the few library sources each
# target needs itself, into $FUZZ_OUT (default /tmp/mammoth_fuzz): objects, binaries, the
# growing corpus (corpus/<target>, seeded from test/fuzz/corpus/<target>) and crash inputs
# (artifacts/<target>/). Prints one summary line per target and exits non-zero when any target
# crashed, reported a sanitizer error, leaked, timed out or failed to build.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
CLANGXX=${CLANGXX:-clang++-16}
OUT=${FUZZ_OUT:-/tmp/mammoth_fuzz}
SECONDS_PER_TARGET=20
RUNS=""
BUILD_ONLY=0
SECONDS_SET=0
JOBS=${FUZZ_BUILD_JOBS:-2}
# Seconds one input may take before libFuzzer calls it a hang. A run beside other work at a
# lower priority may be starved that long; raise it there (a real hang still exceeds it).
UNIT_TIMEOUT=${FUZZ_UNIT_TIMEOUT:-10}
TARGETS=()

usage() {
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) SECONDS_PER_TARGET=$2; SECONDS_SET=1; shift 2 ;;
    --seconds=*) SECONDS_PER_TARGET=${1#*=}; SECONDS_SET=1; shift ;;
    --runs) RUNS=$2; shift 2 ;;
    --runs=*) RUNS=${1#*=}; shift ;;
    --build-only) BUILD_ONLY=1; shift ;;
    -h|--help) usage 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; usage 2 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done

# Library sources per target (the target's own file is test/fuzz/<name>_fuzz.cc).
declare -A SOURCES=(
  [safetensors]="engine/io/safetensors.cc base/json.cc base/dtype.cc base/error.cc"
  [json]="base/json.cc base/error.cc"
  [token_shard]="engine/data/token_shard.cc engine/data/indexed_dataset.cc engine/data/mapped_file.cc base/error.cc"
  [indexed_dataset]="engine/data/indexed_dataset.cc engine/data/mapped_file.cc base/error.cc"
  [image_shard]="engine/data/image_shard.cc engine/data/mapped_file.cc base/error.cc"
  [bpe]="engine/data/bpe.cc engine/data/unicode_class.cc engine/data/mapped_file.cc base/json.cc base/thread_pool.cc base/error.cc"
  [chat_template]="engine/data/chat_template.cc base/json.cc base/error.cc"
  [checkpoint]="engine/train/checkpoint.cc engine/io/tensor_io.cc engine/io/safetensors.cc engine/tensor.cc engine/autograd.cc engine/nn/module.cc memory/allocator.cc engine/profile/profile.cc kernels/registry.cc base/crc32c.cc base/json.cc base/dtype.cc base/error.cc"
  [request]="serve/request.cc engine/data/chat_template.cc base/json.cc base/error.cc"
  [wordpiece]="engine/data/wordpiece.cc engine/data/unicode_class.cc base/json.cc base/error.cc"
  [tokenizer]="engine/data/tokenizer.cc engine/data/bpe.cc engine/data/unicode_class.cc engine/data/mapped_file.cc base/json.cc base/thread_pool.cc base/error.cc"
)
# Largest input libFuzzer generates per target (shards need their 1024-byte header and more).
declare -A MAX_LEN=(
  [safetensors]=4096 [json]=4096 [token_shard]=4096 [indexed_dataset]=4096
  [image_shard]=8192 [bpe]=8192 [tokenizer]=8192 [chat_template]=4096 [checkpoint]=32768
  [request]=4096 [wordpiece]=4096
)
ALL_TARGETS=(safetensors json token_shard indexed_dataset image_shard bpe tokenizer chat_template
             checkpoint request wordpiece)
[[ ${#TARGETS[@]} -eq 0 ]] && TARGETS=("${ALL_TARGETS[@]}")
for t in "${TARGETS[@]}"; do
  [[ -n "${SOURCES[$t]:-}" ]] || { echo "fuzz.sh: unknown target '$t' (have: ${ALL_TARGETS[*]})" >&2; exit 2; }
done

command -v "$CLANGXX" >/dev/null || {
  echo "fuzz.sh: $CLANGXX not found; apt-get install -y clang-16 libfuzzer-16-dev libclang-rt-16-dev" >&2
  exit 2
}

FLAGS=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
       -fno-sanitize-recover=undefined -I. -pthread)
# Objects are compiled without the fuzzer's main (fuzzer-no-link), linked once per target.
OBJ_FLAGS=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined
           -fno-sanitize-recover=undefined -I. -pthread)
mkdir -p "$OUT/obj" "$OUT/bin"

# An object is rebuilt when its source or any header in the tree is newer (cheap and safe).
newest_header=$(find base engine serve test/fuzz -name '*.h' -o -name '*.inc' | xargs ls -t | head -1)
compile() {  # src -> prints the object path
  local src=$1 obj="$OUT/obj/${1//\//_}.o"
  if [[ ! -f "$obj" || "$src" -nt "$obj" || "$newest_header" -nt "$obj" || "$0" -nt "$obj" ]]; then
    "$CLANGXX" "${OBJ_FLAGS[@]}" -c "$src" -o "$obj.tmp" && mv "$obj.tmp" "$obj"
  fi
}

build_start=$(date +%s)
declare -A NEED=()
for t in "${TARGETS[@]}"; do
  for s in ${SOURCES[$t]} "test/fuzz/${t}_fuzz.cc"; do NEED[$s]=1; done
done
# Compile JOBS sources at a time.
pids=()
failed=0
for s in "${!NEED[@]}"; do
  compile "$s" & pids+=($!)
  if [[ ${#pids[@]} -ge $JOBS ]]; then wait "${pids[0]}" || failed=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[[ $failed -eq 0 ]] || { echo "fuzz.sh: compile failed" >&2; exit 1; }
for t in "${TARGETS[@]}"; do
  objs=()
  for s in ${SOURCES[$t]} "test/fuzz/${t}_fuzz.cc"; do objs+=("$OUT/obj/${s//\//_}.o"); done
  "$CLANGXX" "${FLAGS[@]}" "${objs[@]}" -o "$OUT/bin/${t}_fuzz"
done
echo "fuzz.sh: built ${TARGETS[*]} into $OUT/bin in $(( $(date +%s) - build_start )) s"
[[ $BUILD_ONLY -eq 1 ]] && exit 0

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

status=0
run_start=$(date +%s)
for t in "${TARGETS[@]}"; do
  corpus="$OUT/corpus/$t"
  artifacts="$OUT/artifacts/$t/"
  log="$OUT/$t.log"
  mkdir -p "$corpus" "$artifacts"
  args=(-max_len="${MAX_LEN[$t]}" -timeout="$UNIT_TIMEOUT" -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$artifacts")
  # --runs alone: run to N executions; with --seconds too: whichever limit comes first.
  [[ -n "$RUNS" ]] && args+=(-runs="$RUNS")
  [[ -z "$RUNS" || $SECONDS_SET -eq 1 ]] && args+=(-max_total_time="$SECONDS_PER_TARGET")
  seeds="test/fuzz/corpus/$t"
  touch "$log.start"
  t0=$(date +%s)
  rc=0
  "$OUT/bin/${t}_fuzz" "${args[@]}" "$corpus" "$seeds" >"$log" 2>&1 || rc=$?
  secs=$(( $(date +%s) - t0 ))
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' <<<"$last" | awk '{print $2}')
  ft=$(grep -o 'ft: [0-9]*' <<<"$last" | awk '{print $2}')
  # libFuzzer saves any unit over 10 s as slow-unit-*, even when the run ends well. A fuzzer at
  # nice 19 is often starved that long, so each one is rerun alone: only a unit that is still
  # slow (5 s or more) is a finding.
  crashes=0
  slow=""
  while IFS= read -r a; do
    [[ -n "$a" ]] || continue
    if [[ "$(basename "$a")" == slow-unit-* ]]; then
      a0=$(date +%s%N)
      "$OUT/bin/${t}_fuzz" "$a" >/dev/null 2>&1 || true
      ms=$(( ($(date +%s%N) - a0) / 1000000 ))
      if [[ $ms -ge 5000 ]]; then crashes=$((crashes + 1)); fi
      slow+=" $(basename "$a") (${ms} ms alone)"
    else
      crashes=$((crashes + 1))
    fi
  done < <(find "$artifacts" -type f -newer "$log.start" 2>/dev/null)
  verdict=ok
  if [[ $rc -ne 0 || $crashes -gt 0 ]]; then
    verdict="FAILED (exit $rc; see $log)"
    status=1
  fi
  # SIGINT (how a long run is stopped by hand): not a finding, but not a finished run either.
  if [[ $crashes -eq 0 ]] && grep -q 'libFuzzer: run interrupted' "$log"; then
    verdict="interrupted (SIGINT; no finding)"
  fi
  printf 'fuzz %-16s execs %-10s cov %-6s ft %-6s corpus %-5s new_crashes %s  %ss  %s\n' \
    "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "$(ls "$corpus" | wc -l)" "$crashes" "$secs" "$verdict"
  [[ -n "$slow" ]] && echo "    slow units:$slow"
  if [[ $rc -ne 0 ]]; then
    grep -E 'ERROR: |runtime error:|SUMMARY:|invariant failed|Test unit written' "$log" | head -5 | sed 's/^/    /'
  fi
done
echo "fuzz.sh: ran ${#TARGETS[@]} targets in $(( $(date +%s) - run_start )) s; exit $status"
exit $status
