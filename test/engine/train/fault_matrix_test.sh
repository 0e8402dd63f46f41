#!/bin/bash
# The fault matrix (base/fault.h): a rank stalls, is stopped, exits 1 or 0, is killed, raises,
# or is sent SIGTERM, at a chosen step and phase, under dp, tp, pp and ZeRO-3 (2 ranks each,
# global batch 4, so one process resumes every layout's checkpoint with --grad-accum 2).
# Every cell must end within the communication deadline plus a margin, non-zero, with a
# message naming the faulty rank (ours, the flight recorder's or mpirun's), leave no process
# behind, and leave its last complete checkpoint loadable (resumed on one process).
set -uo pipefail
mammoth="$1"
mpirun="$2"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/fault_matrix.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"
timeout_s=4
common=(--steps 6 --seq-len 32 --micro-batch 2 --threads 1 --log-every 1 --eval-every 0
  --comm-timeout "$timeout_s" --save-every 2)
failures=0
cells=0
fail() {
  echo "FAIL($cell): $*"
  failures=$((failures + 1))
}

# cell KIND RANK STEP PHASE WANT_CKPT NAME_REGEX LAYOUT...
cell() {
  local kind="$1" rank="$2" step="$3" phase="$4" want_ckpt="$5" name_re="$6"
  shift 6
  cell="$kind@$rank:$step:$phase ${*}"
  cells=$((cells + 1))
  local dir="$work/cell$cells" log="$work/cell$cells.log"
  local start end rc
  start=$(date +%s%N)
  MAMMOTH_FAULT="$kind@$rank:$step:$phase" timeout 120 bash "$mpirun" -np 2 "$mammoth" train \
    "${common[@]}" --save-dir "$dir" "$@" >"$log" 2>&1
  rc=$?
  end=$(date +%s%N)
  local took_ms=$(((end - start) / 1000000))
  echo "---- $cell: exit $rc after ${took_ms} ms"
  grep -v '^\[model\]\|^step \|^ *$' "$log" | grep -v 'ORTE_ERROR_LOG' | head -12
  [[ $rc -ne 0 ]] || fail "exited 0"
  ((took_ms < (timeout_s + 25) * 1000)) || fail "took ${took_ms} ms (deadline ${timeout_s} s)"
  grep -q "\[fault\] rank $rank, step $step, $phase: injecting $kind" "$log" ||
    fail "the fault did not fire"
  # The rank is named by something other than the injection line itself.
  local report=""
  if [[ -d "$dir/flight" ]]; then
    report="$("$mammoth" flight "$dir/flight" 2>&1)"
    echo "$report" | sed 's/^/    /'
  fi
  { grep -v '^\[fault\]' "$log"; echo "$report"; } >"$log.named"
  if ! grep -Eq "$name_re" "$log.named"; then
    fail "no message matching /$name_re/ names rank $rank"
  fi
  sleep 0.5
  if pgrep -f -- "--save-dir $dir( |$)" >/dev/null; then
    fail "processes left behind: $(pgrep -af -- "--save-dir $dir")"
    pkill -9 -f -- "--save-dir $dir"
  fi
  local latest
  latest="$(cat "$dir/latest" 2>/dev/null)"
  [[ "$latest" == "$want_ckpt" ]] || fail "latest checkpoint is '$latest', not $want_ckpt"
  if ! "$mammoth" train "${common[@]}" --steps 7 --grad-accum 2 --save-dir "$dir" --resume \
    --save-every 0 \
    >"$log.resume" 2>&1; then
    fail "the last checkpoint does not resume on one process"
    grep -v '^\[model\]' "$log.resume" | tail -5
  elif ! grep -q "resumed from $dir/$want_ckpt" "$log.resume"; then
    fail "resume did not start from $want_ckpt"
  fi
}

# A rank stuck in compute: the others' deadline aborts the job; the flight record names it.
cell stall 1 3 forward step_00000002 'fell behind: rank\(s\) 1($| )' --dp 2
cell stall 1 3 forward step_00000002 'fell behind: rank\(s\) 1($| )' --pp 2 --grad-accum 2
# Stopped (SIGSTOP) before its update: it cannot notice, the others' deadline ends the job.
cell stop 1 3 optimizer step_00000002 'fell behind: rank\(s\) 1($| )' --tp 2 --grad-accum 2
# Exits 1 inside a bucket's reduction under ZeRO-3: mpirun names the process.
cell exit1 1 3 backward step_00000002 '\[\[[0-9]+,[0-9]+\],1\]' --dp 2 --zero 3
# SIGKILLed in a pipeline send.
cell kill 0 3 send step_00000002 'process rank 0 .*signal 9' --pp 2 --grad-accum 2
# An error raised on rank 0 aborts the job at once (not at the peer's deadline).
cell throw 0 3 forward step_00000002 'error on rank 0 of 2' --tp 2 --grad-accum 2
# Exits 0 after writing its shard of step 4's checkpoint, before the commit: step 2 stays.
cell exit0 1 4 checkpoint step_00000002 'process rank 1 ' --dp 2 --zero 3
# SIGTERM on one rank: every rank stops at the same step and the checkpoint is complete.
cell term 1 3 forward step_00000003 'saving and stopping at step 3' --pp 2 --grad-accum 2

if [[ $failures -ne 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all fault cells passed"
