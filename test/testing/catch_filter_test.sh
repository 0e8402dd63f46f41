#!/bin/bash
# Every Catch2 binary links //test/testing:catch_main, whose --warn NoTests makes a test-case
# filter that matches nothing fail: the mpirun targets select cases by name, and Catch2 2.x
# would otherwise pass them when a case is renamed.
set -uo pipefail
probe="$1"
fail() { echo "FAIL: $*" >&2; exit 1; }
"$probe" "the probe's only case" || fail "the existing case did not pass"
"$probe" "a renamed case"
rc=$?
[[ $rc -ne 0 ]] || fail "a filter matching no test case passed"
"$probe" "the probe's only case" "a renamed case"
rc=$?
[[ $rc -ne 0 ]] || fail "a filter list with one unmatched name passed"
echo "PASS"
