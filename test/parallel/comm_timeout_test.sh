#!/bin/bash
# One rank of a 2-rank job stalls; the other's operation has a 2 s deadline. The job must exit
# non-zero well within the stall (60 s), with a message naming rank, group and operation.
#   comm_timeout_test.sh <mpirun.sh> <comm_stall>
set -uo pipefail
mpirun_sh="$1"
stall="$2"
failures=0

check() {  # op, expected text of the operation in the message
  local op="$1" want="$2"
  local log start end rc
  log="$(mktemp)"
  start=$(date +%s%N)
  "$mpirun_sh" -np 2 "$stall" --op "$op" --timeout 2 --sleep 60 >"$log" 2>&1
  rc=$?
  end=$(date +%s%N)
  local took_ms=$(((end - start) / 1000000))
  echo "---- --op $op: exit $rc after ${took_ms} ms"
  grep -v '^\s*$' "$log" | head -20
  if [[ $rc -eq 0 ]]; then
    echo "FAIL($op): the job exited 0"; failures=$((failures + 1))
  fi
  if ((took_ms > 30000)); then
    echo "FAIL($op): took ${took_ms} ms, the deadline was 2 s"; failures=$((failures + 1))
  fi
  if ! grep -q "\[comm\] rank 0 (world rank 0): $want" "$log"; then
    echo "FAIL($op): no '[comm] rank 0 (world rank 0): $want' in the output"
    failures=$((failures + 1))
  fi
  if ! grep -q "did not complete within 2 s" "$log"; then
    echo "FAIL($op): the message does not state the deadline"; failures=$((failures + 1))
  fi
  if grep -q "returned although rank 1 stalled\|rank 1 woke up" "$log"; then
    echo "FAIL($op): an operation completed or rank 1 outlived the abort"
    failures=$((failures + 1))
  fi
  rm -f "$log"
}

check all_reduce "all_reduce(sum, f32, 1000 elements) on group 'world'"
check barrier "barrier() on group 'world'"
check recv "recv(from 1, f32, 1000 elements) on group 'world'"
check mesh "all_reduce(avg, f32, 1000 elements) on group 'dp'"

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all timeout checks passed"
