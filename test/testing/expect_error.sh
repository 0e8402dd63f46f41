# Sourced by the `mammoth train` shell tests (train_sh_test puts it beside curves.py):
#   expect_error PATTERN command...
# runs the command, which must fail, and its output must contain PATTERN (a fixed string).
# The output goes to $work/err.log (the caller's work directory) and is shown when it does not
# match.
expect_error() {
  local pattern="$1"
  shift
  if "$@" >"$work/err.log" 2>&1; then
    echo "expected a failure: $*" >&2
    exit 1
  fi
  grep -q -- "$pattern" "$work/err.log" || {
    cat "$work/err.log" >&2
    echo "expected '$pattern' in the error" >&2
    exit 1
  }
}
