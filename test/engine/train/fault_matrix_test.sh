#!/bin/bash
# The fault matrix (base/fault.h): every kind x phase x layout, generated.
#   kinds    exit0 exit1 kill stop term throw stall
#   phases   forward backward send optimizer checkpoint
#   layouts  dp (--dp 2), tp (--tp 2), pp (--pp 2), zero3 (--dp 2 --zero 3); 2 ranks each,
#            global batch 4, so one process resumes every layout's checkpoint (--grad-accum 2)
# Usage: fault_matrix_test.sh MAMMOTH MPIRUN [LAYOUT...] (default: all four; Bazel runs one
# layout per target). The faulty rank alternates over kind, phase and layout, so every
# kind x phase pair fails on rank 0 under two layouts and on rank 1 under the other two.
# The fault fires at step 3 (checkpoint: step 4, the second save of --save-every 2).
#
# Where a phase occurs (the rule each cell checks):
#   forward, optimizer, checkpoint   every layout (checkpoints are sharded at 2 ranks)
#   backward                         dp, zero3: a bucket's reduction; tp: the all-reduce of an
#                                    input gradient; pp: a stage's backward (its gradient
#                                    recv and send)
#   send                             pp only. Under dp, tp and zero3 no rank sends point to
#                                    point: the cell asserts the fault never fires, the run
#                                    exits 0 and its final checkpoint (step 6) resumes.
# A cell whose fault fires must end within the communication deadline plus a margin, leave
# no process behind, leave its last complete checkpoint loadable (resumed on one process),
# and, by kind:
#   exit0, exit1, kill, throw  non-zero, a message naming the faulty rank (mpirun's or ours);
#                              the last checkpoint is step 2
#   stall, stop                non-zero at the peer's deadline; `mammoth flight` names the rank
#                              that fell behind and the operation and group its peer waits in
#                              for it (at forward, the layout's own: dp's all_reduce, tp's,
#                              pp's send/recv, ZeRO-3's all_gather); the last checkpoint is step 2 (a lead stopped in the
#                              checkpoint phase may commit step 4, whose shards all exist,
#                              when mpirun's SIGCONT resumes it before its SIGKILL)
#   term                       every rank saves and stops at the fault's step (exit 130); that
#                              step's checkpoint is the last one
# Cells run four at a time (they mostly wait on deadlines and on mpirun).
set -uo pipefail
mammoth="$1"
mpirun="$2"
shift 2
layouts=("$@")
[[ ${#layouts[@]} -gt 0 ]] || layouts=(dp tp pp zero3)
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/fault_matrix.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"
timeout_s=4
jobs_at_once=4
common=(--steps 6 --seq-len 32 --micro-batch 2 --threads 1 --log-every 1 --eval-every 0
  --comm-timeout "$timeout_s" --save-every 2)
kinds=(exit0 exit1 kill stop term throw stall)
phases=(forward backward send optimizer checkpoint)

layout_args() {
  case "$1" in
    dp) echo "--dp 2" ;;
    tp) echo "--tp 2 --grad-accum 2" ;;
    pp) echo "--pp 2 --grad-accum 2" ;;
    zero3) echo "--dp 2 --zero 3" ;;
    *)
      echo "unknown layout '$1' (dp, tp, pp, zero3)" >&2
      exit 2
      ;;
  esac
}

# cell N KIND RANK STEP PHASE LAYOUT: runs one cell, writes its report to $work/cellN.out and
# one line per failed check to $work/cellN.fail.
cell() {
  local n="$1" kind="$2" rank="$3" step="$4" phase="$5" layout="$6"
  local name="$kind@$rank:$step:$phase $layout"
  local dir="$work/cell$n" log="$work/cell$n.log" out="$work/cell$n.out"
  local failed="$work/cell$n.fail"
  : >"$failed"
  fail() { echo "FAIL($name): $*" | tee -a "$failed"; }
  local fires=1
  [[ "$phase" != send || "$layout" == pp ]] || fires=0
  local want_ckpt=step_00000002
  if [[ $fires -eq 0 ]]; then
    want_ckpt=step_00000006
  elif [[ "$kind" == term ]]; then
    want_ckpt="$(printf 'step_%08d' "$step")"
  elif [[ "$kind" == stop && "$phase" == checkpoint && "$rank" == 0 ]]; then
    # The lead, stopped after writing its shard, is resumed by mpirun's SIGCONT before its
    # SIGKILL; every shard was written, so it may commit step 4 first.
    want_ckpt="step_00000002|step_00000004"
  fi
  local args start end rc
  read -ra args <<<"$(layout_args "$layout")"
  start=$(date +%s%N)
  MAMMOTH_FAULT="$kind@$rank:$step:$phase" timeout 90 bash "$mpirun" -np 2 "$mammoth" train \
    "${common[@]}" --save-dir "$dir" "${args[@]}" >"$log" 2>&1
  rc=$?
  end=$(date +%s%N)
  local took_ms=$(((end - start) / 1000000))
  {
    echo "---- $name: exit $rc after ${took_ms} ms"
    grep -av '^\[model\]\|^step \|^ *$\|ORTE_ERROR_LOG\|^----\|^\[data\]' "$log" |
      grep -av '^\[train\] \(device\|plan\|model\|batch\|per rank\|predicted\|optimizer\|tok\)' |
      head -8
    if [[ $fires -eq 0 ]]; then
      [[ $rc -eq 0 ]] || fail "exited $rc; $phase does not occur under $layout, so the run must complete"
      ! grep -q '^\[fault\]' "$log" || fail "the fault fired, but $phase does not occur under $layout"
    else
      grep -q "\[fault\] rank $rank, step $step, $phase: injecting $kind" "$log" ||
        fail "the fault did not fire"
      if [[ "$kind" == term ]]; then
        [[ $rc -eq 130 ]] || fail "exited $rc, not 130 (stopped by a signal, checkpoint saved)"
      else
        [[ $rc -ne 0 ]] || fail "exited 0"
      fi
      ((took_ms < (timeout_s + 25) * 1000)) || fail "took ${took_ms} ms (deadline ${timeout_s} s)"
      # The rank is named by something other than the injection line itself.
      local report="" name_re
      if [[ -d "$dir/flight" ]]; then
        report="$("$mammoth" flight "$dir/flight" 2>&1)"
        echo "$report" | sed 's/^/    /'
      fi
      grep -v '^\[fault\]' "$log" >"$log.named"
      echo "$report" >>"$log.named"
      case "$kind" in
        exit0) name_re="process rank $rank " ;;
        exit1) name_re="\[\[[0-9]+,[0-9]+\],$rank\]" ;;
        kill) name_re="process rank $rank .*signal 9" ;;
        throw) name_re="error on rank $rank of 2" ;;
        stall | stop) name_re="fell behind: rank\(s\) $rank($| )" ;;
        term) name_re="saving and stopping at step $step" ;;
      esac
      grep -Eq "$name_re" "$log.named" || fail "no message matching /$name_re/"
      if [[ "$kind" == stall || "$kind" == stop ]]; then
        # What the rank that waited was in: the operation it could not finish, on which group,
        # for the stalled rank.
        local g="on group '[a-z]+ \[0,1\]'" op="#[0-9]+ [a-z_]+\(.*\)"
        if [[ "$phase" == forward ]]; then
          # Stuck at the step's start: the peer's first blocking operation of that step.
          case "$layout" in
            dp) g="on group 'dp \[0,1\]'" op="#[0-9]+ all_reduce\(avg, .*\)" ;;
            tp) g="on group 'tp \[0,1\]'" op="#[0-9]+ all_reduce\(sum, .*\)" ;;
            pp) g="on group 'pp \[0,1\]'" op="#[0-9]+ (send|recv)\(.*\)" ;;
            zero3) g="on group 'dp \[0,1\]'" op="#[0-9]+ all_gather\(.*\)" ;;
          esac
        fi
        local op_re="waits in $op .*$g for world rank $rank|rank $rank left no record $g: rank\(s\) $((1 - rank)) wait in $op|rank $rank reached $op $g"
        grep -Eq "$op_re" <<<"$report" ||
          fail "the flight report names no operation and group waiting for rank $rank"
      fi
    fi
    sleep 0.5
    if pgrep -f -- "--save-dir $dir( |$)" >/dev/null; then
      fail "processes left behind: $(pgrep -af -- "--save-dir $dir( |$)")"
      pkill -9 -f -- "--save-dir $dir( |$)"
    fi
    local latest
    latest="$(cat "$dir/latest" 2>/dev/null)"
    [[ "$latest" =~ ^($want_ckpt)$ ]] || fail "latest checkpoint is '$latest', not $want_ckpt"
    if ! "$mammoth" train "${common[@]}" --steps 7 --grad-accum 2 --save-dir "$dir" --resume \
      --save-every 0 >"$log.resume" 2>&1; then
      fail "the last checkpoint does not resume on one process"
      grep -v '^\[model\]' "$log.resume" | tail -5
    elif ! grep -q "resumed from $dir/$latest" "$log.resume"; then
      fail "resume did not start from $latest"
    fi
  } >"$out" 2>&1
}

# The tokenized default corpus is written once, before cells share it.
"$mammoth" train --steps 1 --seq-len 32 --micro-batch 2 --threads 1 --eval-every 0 \
  >"$work/warmup.log" 2>&1 || {
  cat "$work/warmup.log"
  exit 1
}

start=$(date +%s)
n=0
for li in "${!layouts[@]}"; do
  layout="${layouts[$li]}"
  layout_args "$layout" >/dev/null || exit 2
  case "$layout" in dp) lk=0 ;; tp) lk=1 ;; pp) lk=2 ;; zero3) lk=3 ;; esac
  for ki in "${!kinds[@]}"; do
    for pi in "${!phases[@]}"; do
      phase="${phases[$pi]}"
      step=3
      [[ "$phase" != checkpoint ]] || step=4
      n=$((n + 1))
      while (($(jobs -rp | wc -l) >= jobs_at_once)); do wait -n; done
      cell "$n" "${kinds[$ki]}" $(((ki + pi + lk) % 2)) "$step" "$phase" "$layout" &
    done
  done
done
wait
failures=0
for ((k = 1; k <= n; k++)); do
  cat "$work/cell$k.out"
  [[ -s "$work/cell$k.fail" ]] && failures=$((failures + 1))
done
echo "$n cells (${layouts[*]}) in $(($(date +%s) - start)) s"
if [[ $failures -ne 0 ]]; then
  echo "$failures of $n cell(s) failed:"
  cat "$work"/cell*.fail
  exit 1
fi
echo "all $n fault cells passed"
