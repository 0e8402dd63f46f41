#!/bin/bash
# How `mammoth train` learns its process layout when Open MPI's mpirun did not start it, and
# that one --save-dir serves one job:
#   1. Two processes started together with a PMI launcher's variables (as MPICH's or Intel
#      MPI's mpiexec sets them) and no OMPI_* variables: MPI joins each into a world of one, so
#      each must refuse, naming the variable, instead of training alone.
#   2. Slurm's srun variables likewise (a rank above 0 alone is evidence too).
#   3. Launcher variables that say one process (SLURM_NTASKS=1) train normally.
#   4. A second job on a --save-dir in use is refused naming the holder; once the first job is
#      killed (SIGKILL: no clean-up runs), a new job takes the directory.
set -uo pipefail
mammoth="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}/launch"
rm -rf "$tmp" && mkdir -p "$tmp/texts"
fail() { echo "FAIL: $*" >&2; exit 1; }
# The launchers' variables must come only from this script.
unset $(env | sed -n 's/^\(OMPI_[A-Z_]*\|PMI_[A-Z_]*\|PMIX_[A-Z_]*\|SLURM_[A-Z_]*\)=.*/\1/p')
# An Open MPI singleton needs no daemon.
export OMPI_MCA_ess_singleton_isolated=1

for i in $(seq 1 60); do
  echo "The quick brown fox jumps over the lazy dog, line $i. Pack my box with five dozen jugs."
done >"$tmp/texts/a.txt"
"$mammoth" data --out "$tmp/data" --vocab-size 300 --val-fraction 0.1 "$tmp/texts/a.txt" \
  >"$tmp/data.log" 2>&1 || { cat "$tmp/data.log"; fail "mammoth data"; }
train=(train --data "$tmp/data/train_000000.bin" --val-data "$tmp/data/val_000000.bin"
  --model gpt2-tiny --seq-len 16 --micro-batch 2 --eval-every 0 --threads 1 --device cpu)

# Expects a refusal: exit 1, the message, and no training step.
refused() {
  local log="$1" pattern="$2" rc="$3"
  cat "$log"
  [[ $rc -eq 1 ]] || fail "$log: expected exit 1, got $rc"
  grep -q -- "$pattern" "$log" || fail "$log: no message matching '$pattern'"
  if grep -q "^step " "$log"; then fail "$log: trained although it was refused"; fi
}

# 1. A two-process PMI launch, both processes at once.
for r in 0 1; do
  PMI_SIZE=2 PMI_RANK=$r "$mammoth" "${train[@]}" --steps 2 --save-dir "$tmp/pmi$r" \
    >"$tmp/pmi$r.log" 2>&1 &
  pids[$r]=$!
done
for r in 0 1; do
  wait "${pids[$r]}"
  refused "$tmp/pmi$r.log" "several processes were started (PMI_SIZE=2" $?
done
grep -q "MPI joined this one into a world of 1" "$tmp/pmi0.log" || fail "no world-of-1 reason"

# 2. Slurm: the step's task count, and a rank above 0 on its own.
SLURM_STEP_NUM_TASKS=4 SLURM_NTASKS=4 SLURM_PROCID=0 "$mammoth" "${train[@]}" --steps 2 \
  >"$tmp/slurm.log" 2>&1
refused "$tmp/slurm.log" "SLURM_STEP_NUM_TASKS=4, set by Slurm (srun)" $?
SLURM_PROCID=3 "$mammoth" "${train[@]}" --steps 2 >"$tmp/slurm_rank.log" 2>&1
refused "$tmp/slurm_rank.log" "SLURM_PROCID=3" $?

# 3. A launcher that started one process: a world of one, trained.
SLURM_NTASKS=1 SLURM_PROCID=0 "$mammoth" "${train[@]}" --steps 2 >"$tmp/one.log" 2>&1 ||
  { cat "$tmp/one.log"; fail "SLURM_NTASKS=1 should train in one process"; }
grep -q "^step     2/2" "$tmp/one.log" || { cat "$tmp/one.log"; fail "SLURM_NTASKS=1: no step 2"; }

# 4. One job per --save-dir. The first runs long enough to be seen holding the directory.
save="$tmp/run"
"$mammoth" "${train[@]}" --steps 100000 --log-every 1 --save-dir "$save" >"$tmp/first.log" 2>&1 &
first=$!
for _ in $(seq 1 300); do
  grep -q "^step " "$tmp/first.log" && break
  kill -0 "$first" 2>/dev/null || { cat "$tmp/first.log"; fail "the first job ended early"; }
  sleep 0.1
done
grep -q "^step " "$tmp/first.log" || { cat "$tmp/first.log"; fail "the first job never trained"; }
"$mammoth" "${train[@]}" --steps 2 --save-dir "$save" >"$tmp/second.log" 2>&1
refused "$tmp/second.log" "--save-dir $save is in use by another job (pid $first on " $?
kill -9 "$first"
wait "$first" 2>/dev/null
"$mammoth" "${train[@]}" --steps 2 --save-dir "$save" >"$tmp/third.log" 2>&1 ||
  { cat "$tmp/third.log"; fail "the directory stayed locked after its job was killed"; }
grep -q "^step     2/2" "$tmp/third.log" || { cat "$tmp/third.log"; fail "third job: no step 2"; }
echo "PASS"
