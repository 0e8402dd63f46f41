#!/bin/bash
# Installs what is missing, builds everything and runs the whole test suite.
#
#   bash tools/test.sh                      # all of //... (what .ci/run does)
#   bash tools/test.sh //engine/... -c dbg  # some packages; options go to `bazel test`
#
# Runs tools/setup.sh, then `bazel test` with the venv's Python as $MAMMOTH_PYTHON and the
# shared disk cache (in .bazelrc). Tests tagged "gpu" are built but not run (CI has no GPU;
# tools/gpu_check.sh runs them on a lent one) and are counted separately. The last line is
#   N passed, M failed
# counted per test target from Bazel's summary; a test that did not build or did not report
# counts as failed, and so does a failure to build a non-test target (once). The exit status is
# non-zero when M > 0.
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

# Per-target results from the summary, e.g. "//base:foo_test   (cached) PASSED in 0.1s".
sed -E -n 's/^(\/\/[^ ]+)[[:space:]]+(\(cached\) )?(PASSED|FLAKY|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|INCOMPLETE|REMOTE FAILURE|SKIPPED)( .*)?$/\1 \3/p' \
  "$log_dir/bazel.log" | tr ' ' '\t' | sort -u -k1,1 >"$log_dir/results"

passed=0
failed=0
skipped=0
failed_names=()
while IFS= read -r target; do
  [[ -n "$target" ]] || continue
  status="$(awk -F'\t' -v t="$target" '$1 == t { print $2; exit }' "$log_dir/results")"
  case "$status" in
    PASSED | FLAKY) passed=$((passed + 1)) ;;
    SKIPPED) skipped=$((skipped + 1)) ;;
    "")
      failed=$((failed + 1))
      failed_names+=("$target (no result: did not build or was not analysed)")
      ;;
    *)
      failed=$((failed + 1))
      failed_names+=("$target ($status)")
      ;;
  esac
done <<<"$expected"

# Exit 1 with every test passing means something other than a test failed to build.
if [[ $bazel_rc -ne 0 && $bazel_rc -ne 3 && $failed -eq 0 ]]; then
  failed=$((failed + 1))
  failed_names+=("bazel exited with status $bazel_rc (a package failed to load or a target failed to build; see above)")
fi

echo
echo "[test] bazel test took ${elapsed}s (exit status $bazel_rc)"
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
