#!/bin/bash
# `mammoth launch --np 4 --elastic`: rank 2 of dp 4 is SIGKILLed at step 5 (MAMMOTH_FAULT,
# which the launcher passes to the first attempt only), after the step-4 checkpoint.
#   1. the job restarts once, at 3 ranks (dp 3, grad-accum 4: the global batch of 12 kept),
#      from step_00000004, says why, exits 0; its metrics after the restart equal, field by
#      field (timings aside), those of `train --resume` run by hand at dp 3 from a copy of
#      that checkpoint;
#   2. --min-ranks above what is left (after a rank exits 1, named with its status), and
#      --max-restarts 0, stop with mpirun's status, said by name;
#   3. an elastic command without --save-dir, or with a --plan file, is refused by name.
set -euo pipefail
mammoth="$(realpath "$1")"
mpirun_sh="$(realpath "$2")"
py="${MAMMOTH_PYTHON:-/usr/bin/python3}"
work="$(mktemp -d /tmp/elastic.XXXXXX)"  # short: Open MPI's socket paths live under TMPDIR
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache
export TMPDIR="$work"
train=(train --steps 7 --seq-len 32 --micro-batch 1 --threads 1 --log-every 1 --eval-every 0
  --comm-timeout 20 --save-every 2 --keep-last 10)
launch=(launch --np 4 --btl self,vader --elastic --max-restarts 2)

# 1. killed at step 5, restarted at 3 ranks.
MAMMOTH_FAULT=kill@2:5 "$mammoth" "${launch[@]}" --min-ranks 3 -- "${train[@]}" --dp 4 \
  --grad-accum 3 --save-dir "$work/a" --metrics "$work/a.jsonl" >"$work/a.log" 2>&1 ||
  { cat "$work/a.log"; fail "the elastic run did not finish"; }
grep -a "^\[launch\]\|^\[fault\]\|resumed from" "$work/a.log"
grep -q "^\[launch\] --elastic restart 1 of 2: rank 2 on localhost exited on signal 9 (Killed); 3 ranks left: dp 3 x tp 1 x pp 1 x sp 1, grad-accum 4 (the global batch kept), resuming from $work/a/step_00000004 (MAMMOTH_FAULT not passed on)$" \
  "$work/a.log" || fail "no restart line naming rank 2, 3 ranks and the checkpoint"
[[ "$(grep -c "^\[launch\] --elastic restart" "$work/a.log")" == 1 ]] ||
  fail "restarted more than once (the fault fired again?)"
grep -q "^\[launch\] 3 ranks on 1 host: mpirun .*-H localhost:3 -np 3 .* --dp 3 .*--grad-accum 4 .*--resume$" \
  "$work/a.log" || fail "the restart's mpirun line is not dp 3, grad-accum 4, --resume"
grep -q "^\[train\] resumed from $work/a/step_00000004 at step 4" "$work/a.log" ||
  fail "the restart did not resume from step 4"

# The same checkpoint, resumed by hand at that size.
mkdir "$work/b"
cp -r "$work/a/step_00000004" "$work/b/"
echo step_00000004 >"$work/b/latest"
"$mpirun_sh" -np 3 "$mammoth" "${train[@]}" --dp 3 --grad-accum 4 --save-dir "$work/b" \
  --resume --metrics "$work/b.jsonl" >"$work/b.log" 2>&1 ||
  { cat "$work/b.log"; fail "the hand resume failed"; }
"$py" - "$work/a.jsonl" "$work/b.jsonl" <<'PY'
import json, sys
timing = {"tokens_per_s", "step_s", "cpu_s", "peak_mem_bytes", "predicted_peak_mem_bytes"}
def rows(path):
    return [{k: v for k, v in json.loads(l).items() if k not in timing} for l in open(path)]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert [r["step"] for r in a] == list(range(1, 8)), [r["step"] for r in a]
assert [r["step"] for r in b] == [5, 6, 7], [r["step"] for r in b]
for x, y in zip(a[4:], b):
    assert x == y, f"elastic {x} != by hand {y}"
print("steps 5-7 equal the hand resume:", [round(r["loss"], 6) for r in b])
PY

# 2. what is left is too small, or no restart is allowed.
rc=0
MAMMOTH_FAULT=exit1@1:3 "$mammoth" "${launch[@]}" --min-ranks 4 -- "${train[@]}" --dp 4 \
  --grad-accum 3 --save-dir "$work/c" >"$work/c.log" 2>&1 || rc=$?
[[ $rc == 1 ]] || { cat "$work/c.log"; fail "--min-ranks 4: exit $rc, not the rank's 1"; }
grep -q "^\[launch\] rank 1 on localhost exited with status 1$" "$work/c.log" ||
  { cat "$work/c.log"; fail "the rank that exited 1 is not named"; }
grep -q "3 ranks left; the largest layout that keeps the global batch 12 at micro-batch 1 is dp 3 x 1 = 3 ranks, fewer than --min-ranks 4; not restarting" \
  "$work/c.log" || { cat "$work/c.log"; fail "--min-ranks not named"; }
MAMMOTH_FAULT=exit1@3:2 "$mammoth" launch --np 4 --btl self,vader --elastic --max-restarts 0 \
  -- "${train[@]}" --grad-accum 3 --save-dir "$work/d" >"$work/d.log" 2>&1 &&
  fail "--max-restarts 0 restarted"
grep -q "^\[launch\] --elastic: 0 restarts (--max-restarts) used; giving up" "$work/d.log" ||
  { cat "$work/d.log"; fail "--max-restarts not named"; }

# 3. refusals before anything starts.
"$mammoth" launch --np 2 --elastic -- train --dp 2 >"$work/e.log" 2>&1 && fail "no --save-dir ran"
grep -q "give it --save-dir DIR" "$work/e.log" || { cat "$work/e.log"; fail "--save-dir not named"; }
"$mammoth" launch --np 2 --elastic -- train --plan p.json --save-dir x >"$work/f.log" 2>&1 &&
  fail "--plan ran"
grep -q "it cannot rewrite a --plan file" "$work/f.log" || { cat "$work/f.log"; fail "--plan"; }
echo PASS
