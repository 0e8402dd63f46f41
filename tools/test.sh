#!/bin/bash
# Installs what is missing, builds everything and runs the whole test suite.
#
#   bash tools/test.sh                      # all of //... (what .ci/run does)
#   bash tools/test.sh //engine/... -c dbg  # some packages; options go to `bazel test`
#
# Runs tools/setup.sh, then `bazel test` with the venv's Python as $MAMMOTH_PYTHON and the
# shared disk cache (in .bazelrc). Tests tagged "gpu" are built but not run (CI has no GPU;
# tools/gpu_check.sh runs them on a lent one) and are counted separately.
#
# Then the AVX2 pass: the tests tagged "isa" (the parity and training tests) run again with
# --test_env=MAMMOTH_ISA=avx2, so the kernels' AVX2 family (what an AVX2-only CPU runs) is
# held to the same tolerances as the CPU's best (kernels/cpu/isa_env.h). Bazel keeps those
# results apart from the first pass's; they count as "//pkg:name [avx2]". The pass needs a CPU
# with AVX2, FMA and F16C (it is left out, and says so, without them); MAMMOTH_TEST_AVX2=0
# leaves it out too.
#
# With the whole suite, the sanitizer passes follow (every cc_test under ASan + UBSan, the
# threaded ones under TSan; "[asan]", "[tsan]"; MAMMOTH_TEST_SANITIZE=0 leaves them out), then
# the fuzz pass (tools/fuzz.sh; MAMMOTH_TEST_FUZZ=0).
#
# The last line is
#   N passed, M failed
# counted per test target (and per pass) from Bazel's summary; a test that did not build or did
# not report counts as failed, and so does a failure to build a non-test target (once per
# pass). The exit status is non-zero when M > 0.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash tools/setup.sh || {
  echo "[test] tools/setup.sh failed"
  echo "0 passed, 1 failed"
  exit 1
}

MAMMOTH_VENV="${MAMMOTH_VENV:-$HOME/.cache/mammoth/venv}"
export MAMMOTH_PYTHON="$MAMMOTH_VENV/bin/python"

# Positional //patterns select targets; everything else is passed to `bazel test`.
patterns=()
bazel_args=()
for arg in "$@"; do
  case "$arg" in
    //* | @*) patterns+=("$arg") ;;
    *) bazel_args+=("$arg") ;;
  esac
done
[[ ${#patterns[@]} -gt 0 ]] || patterns=("//...")
universe="$(printf ' + %s' "${patterns[@]}")"
universe="${universe:3}"

log_dir="$(mktemp -d /tmp/mammoth-test.XXXXXX)"
trap 'rm -rf "$log_dir"' EXIT

# Tags are matched as whole list elements ("[gpu, manual]"), so "nogpu" is not "gpu".
tag_re() { printf "'(^\\\\[|, )%s(,|\\\\]\$)'" "$1"; }
query() {
  bazel query --keep_going --noshow_progress "$1" 2>"$log_dir/query.err" | sort -u
}
all_tests="$(query "tests($universe)")"
gpu_tests="$(query "attr(tags, $(tag_re gpu), tests($universe))")"
manual_tests="$(query "attr(tags, $(tag_re manual), tests($universe))")"
expected="$(comm -23 <(echo "$all_tests") <(sort -u <(echo "$gpu_tests"; echo "$manual_tests")) |
  sed '/^$/d')"
num_gpu="$(echo "$gpu_tests" | sed '/^$/d' | wc -l)"
num_expected="$(echo "$expected" | sed '/^$/d' | wc -l)"
echo "[test] $num_expected tests to run in ${patterns[*]}; $num_gpu need a GPU"

progress=()
[[ -t 1 ]] || progress=(--curses=no --color=no --show_progress_rate_limit=15)

start=$SECONDS
bazel test "${patterns[@]}" \
  --keep_going \
  --test_tag_filters=-gpu \
  --test_env=MAMMOTH_PYTHON="$MAMMOTH_PYTHON" \
  --test_summary=short \
  "${progress[@]}" \
  "${bazel_args[@]}" 2>&1 | tee "$log_dir/bazel.log"
bazel_rc=${PIPESTATUS[0]}
elapsed=$((SECONDS - start))

passed=0
failed=0
skipped=0
failed_names=()

# count LOG EXPECTED RC SUFFIX: adds one pass's per-target results to the totals. The summary
# lines read e.g. "//base:foo_test   (cached) PASSED in 0.1s".
count() {
  local log="$1" expected="$2" rc="$3" suffix="$4" target status pass_failed=0
  sed -E -n 's/^(\/\/[^ ]+)[[:space:]]+(\(cached\) )?(PASSED|FLAKY|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|INCOMPLETE|REMOTE FAILURE|SKIPPED)( .*)?$/\1 \3/p' \
    "$log" | tr ' ' '\t' | sort -u -k1,1 >"$log_dir/results"
  while IFS= read -r target; do
    [[ -n "$target" ]] || continue
    status="$(awk -F'\t' -v t="$target" '$1 == t { print $2; exit }' "$log_dir/results")"
    case "$status" in
      PASSED | FLAKY) passed=$((passed + 1)) ;;
      SKIPPED) skipped=$((skipped + 1)) ;;
      "")
        pass_failed=$((pass_failed + 1))
        failed_names+=("$target$suffix (no result: did not build or was not analysed)")
        ;;
      *)
        pass_failed=$((pass_failed + 1))
        failed_names+=("$target$suffix ($status)")
        ;;
    esac
  done <<<"$expected"
  # Exit 1 with every test passing means something other than a test failed to build.
  if [[ $rc -ne 0 && $rc -ne 3 && $pass_failed -eq 0 ]]; then
    pass_failed=1
    failed_names+=("bazel${suffix:+$suffix pass} exited with status $rc (a package failed to load or a target failed to build; see above)")
  fi
  failed=$((failed + pass_failed))
}

count "$log_dir/bazel.log" "$expected" "$bazel_rc" ""

# The AVX2 pass over the "isa" tests (see the top). The tests are named explicitly, so only
# they build and run; results and timing come from their own log.
isa_tests="$(comm -12 <(echo "$expected") <(query "attr(tags, $(tag_re isa), tests($universe))") |
  sed '/^$/d')"
num_isa="$(echo "$isa_tests" | sed '/^$/d' | wc -l)"
cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
avx2_note=""
avx2_elapsed=0
if [[ $num_isa -eq 0 ]]; then
  avx2_note="no tests tagged isa in ${patterns[*]}"
elif [[ "${MAMMOTH_TEST_AVX2:-1}" == "0" ]]; then
  avx2_note="MAMMOTH_TEST_AVX2=0: $num_isa tests tagged isa not run with MAMMOTH_ISA=avx2"
elif [[ "$cpu_flags" != *" avx2 "* || "$cpu_flags" != *" fma "* || "$cpu_flags" != *" f16c "* ]]; then
  avx2_note="this CPU lacks AVX2, FMA or F16C: $num_isa tests tagged isa not run with MAMMOTH_ISA=avx2"
else
  echo
  echo "[test] AVX2 pass: $num_isa tests tagged isa again with MAMMOTH_ISA=avx2"
  avx2_start=$SECONDS
  # shellcheck disable=SC2046 # one target per word
  bazel test $(echo "$isa_tests") \
    --keep_going \
    --test_tag_filters=-gpu \
    --test_env=MAMMOTH_PYTHON="$MAMMOTH_PYTHON" \
    --test_env=MAMMOTH_ISA=avx2 \
    --test_summary=short \
    "${progress[@]}" \
    "${bazel_args[@]}" 2>&1 | tee "$log_dir/bazel_avx2.log"
  avx2_rc=${PIPESTATUS[0]}
  avx2_elapsed=$((SECONDS - avx2_start))
  count "$log_dir/bazel_avx2.log" "$isa_tests" "$avx2_rc" " [avx2]"
  avx2_note="$num_isa tests tagged isa ran again with MAMMOTH_ISA=avx2 in ${avx2_elapsed}s (exit status $avx2_rc)"
fi

# The sanitizer passes (whole suite only; MAMMOTH_TEST_SANITIZE=0 leaves them out): every unit
# test (cc_test) again under AddressSanitizer + UndefinedBehaviorSanitizer (--config=asan,
# .bazelrc), counted as "//pkg:name [asan]", and the tests tagged "tsan" (thread pool, io_uring
# engine, chunk manager) under ThreadSanitizer, as "[tsan]". The multi-process tests are left
# out (Open MPI itself reports under both).
sanitize_note="not run (a subset of the suite was asked for)"
sanitize_pass() {  # CONFIG TESTS
  local config="$1" tests="$2"
  echo
  echo "[test] $config pass: $(echo "$tests" | sed '/^$/d' | wc -l) tests under --config=$config"
  # shellcheck disable=SC2046 # one target per word
  bazel test $(echo "$tests") --config="$config" \
    --keep_going \
    --test_tag_filters=-gpu \
    --test_env=MAMMOTH_PYTHON="$MAMMOTH_PYTHON" \
    --test_summary=short \
    "${progress[@]}" \
    "${bazel_args[@]}" 2>&1 | tee "$log_dir/bazel_$config.log"
  local rc=${PIPESTATUS[0]}
  count "$log_dir/bazel_$config.log" "$tests" "$rc" " [$config]"
}
if [[ "${patterns[*]}" == "//..." ]]; then
  if [[ "${MAMMOTH_TEST_SANITIZE:-1}" == "0" ]]; then
    sanitize_note="MAMMOTH_TEST_SANITIZE=0: not run"
  else
    sanitize_start=$SECONDS
    unit_tests="$(comm -12 <(echo "$expected") <(query "kind(cc_test, $universe)") | sed '/^$/d')"
    tsan_tests="$(comm -12 <(echo "$expected") <(query "attr(tags, $(tag_re tsan), tests($universe))") |
      sed '/^$/d')"
    sanitize_pass asan "$unit_tests"
    sanitize_pass tsan "$tsan_tests"
    sanitize_note="$(echo "$unit_tests" | wc -l) unit tests under asan, $(echo "$tsan_tests" | wc -l) under tsan in $((SECONDS - sanitize_start))s"
  fi
fi

# The fuzz pass: every libFuzzer target of tools/fuzz.sh (our file parsers under ASan + UBSan,
# built by clang outside Bazel) for a bounded time, each counted as "fuzz:<target>". Only with
# the whole suite; MAMMOTH_TEST_FUZZ=0 leaves it out, MAMMOTH_FUZZ_SECONDS sets the time each.
fuzz_note="not run (a subset of the suite was asked for)"
if [[ "${patterns[*]}" == "//..." ]]; then
  if [[ "${MAMMOTH_TEST_FUZZ:-1}" == "0" ]]; then
    fuzz_note="MAMMOTH_TEST_FUZZ=0: not run"
  else
    echo
    echo "[test] fuzz pass: tools/fuzz.sh --seconds ${MAMMOTH_FUZZ_SECONDS:-15}"
    fuzz_start=$SECONDS
    bash tools/fuzz.sh --seconds "${MAMMOTH_FUZZ_SECONDS:-15}" 2>&1 | tee "$log_dir/fuzz.log"
    fuzz_rc=${PIPESTATUS[0]}
    fuzz_count=0
    while read -r _ target rest; do
      fuzz_count=$((fuzz_count + 1))
      if [[ "$rest" == *"  ok" ]]; then
        passed=$((passed + 1))
      else
        failed=$((failed + 1))
        failed_names+=("fuzz:$target (${rest##*  })")
      fi
    done < <(grep -E '^fuzz [a-z_]+ +execs ' "$log_dir/fuzz.log")
    if [[ $fuzz_count -eq 0 ]]; then
      failed=$((failed + 1))
      failed_names+=("fuzz pass: tools/fuzz.sh ran no target (exit $fuzz_rc; see above)")
    fi
    fuzz_note="$fuzz_count targets in $((SECONDS - fuzz_start))s (exit status $fuzz_rc)"
  fi
fi

echo
echo "[test] bazel test took ${elapsed}s (exit status $bazel_rc)"
echo "[test] AVX2 pass: $avx2_note"
echo "[test] sanitizer passes: $sanitize_note"
echo "[test] fuzz pass: $fuzz_note"
if [[ -s "$log_dir/query.err" ]] && grep -q ERROR "$log_dir/query.err"; then
  echo "[test] bazel query reported errors:"
  grep ERROR "$log_dir/query.err" | head -20
fi
for name in "${failed_names[@]}"; do echo "[test] FAILED: $name"; done
[[ $skipped -eq 0 ]] || echo "skipped: $skipped (incompatible with this configuration)"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "needs GPU: $num_gpu (not run here: tools/gpu_check.sh runs them)"
else
  echo "needs GPU: $num_gpu (not run: no CUDA device)"
fi
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
