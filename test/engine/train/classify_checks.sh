# Shell checks the classification training tests share (sourced; $mammoth and $work set).

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# accuracy_at_least METRICS MIN: the last val_accuracy in the --metrics file is >= MIN.
accuracy_at_least() {
  python3 - "$1" "$2" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
acc = [r["val_accuracy"] for r in rows if "val_accuracy" in r]
assert acc and acc[-1] >= float(sys.argv[2]), f"validation accuracy {acc} < {sys.argv[2]}"
print(f"validation accuracy at steps {[r['step'] for r in rows if 'val_accuracy' in r]}: {acc}")
PY
}

# resume_at CK STEP: copies checkpoint directory CK to CK_resume with `latest` at STEP only.
resume_at() {
  cp -r "$1" "$1_resume"
  find "$1_resume" -maxdepth 1 -name 'step_*' ! -name "$(printf 'step_%08d' "$2")" \
    -exec rm -rf {} +
  printf 'step_%08d\n' "$2" >"$1_resume/latest"
}

# same_tail FULL RESUMED FIRST LAST: steps FIRST..LAST of RESUMED equal FULL's bitwise.
same_tail() {
  python3 - "$@" <<'PY'
import json, os, sys
full = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
res = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
first, last = int(sys.argv[3]), int(sys.argv[4])
assert sorted(res) == list(range(first, last + 1)), sorted(res)
for s in res:
    for k in ("loss", "grad_norm", "val_accuracy"):
        assert res[s].get(k) == full[s].get(k), f"step {s} {k}: {res[s].get(k)} != {full[s].get(k)}"
print(f"resumed steps {first}..{last}: bitwise equal")
PY
}

# same_curve A B STEPS: two --metrics files hold STEPS losses within 1e-5 of each other.
same_curve() {
  python3 - "$@" <<'PY'
import json, os, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == int(sys.argv[3]), (len(a), len(b))
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"{os.path.basename(sys.argv[2])} vs {os.path.basename(sys.argv[1])}: largest relative loss difference {worst:.3g}")
assert worst < 1e-5, worst
PY
}

# close_tail ONE RESUMED FIRST LAST: RESUMED holds steps FIRST..LAST, each loss within 1e-5
# (relative) of ONE's at that step (a checkpoint of another layout resumed on one process).
close_tail() {
  python3 - "$@" <<'PY'
import json, os, sys
one = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
res = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2]))}
first, last = int(sys.argv[3]), int(sys.argv[4])
assert sorted(res) == list(range(first, last + 1)), sorted(res)
worst = max(abs(res[s] - one[s]) / one[s] for s in res)
print(f"{os.path.basename(sys.argv[2])}: steps {first}..{last}, largest relative loss "
      f"difference {worst:.3g} from {os.path.basename(sys.argv[1])}")
assert worst < 1e-5, worst
PY
}

# zero_stages STEPS EVERY ARGS...: one process trained ARGS into $work/dp1.jsonl (its global
# batch as two micro-batches); dp 2 with one micro-batch per rank at ZeRO 1, 2 and 3 gives the
# same curve over STEPS steps, and the ZeRO-3 run's step-EVERY checkpoint (each rank writes its
# shards) resumes on one process.
zero_stages() {
  local steps="$1" every="$2" z
  shift 2
  for z in 1 2 3; do
    bash "$mpirun" -np 2 "$mammoth" train "$@" --grad-accum 1 --zero "$z" --save-every "$every" \
      --save-dir "$work/ck_zero$z" --metrics "$work/zero$z.jsonl" 2>"$work/zero$z.log" ||
      { cat "$work/zero$z.log"; fail "dp 2 --zero $z failed"; }
    same_curve "$work/dp1.jsonl" "$work/zero$z.jsonl" "$steps"
  done
  resume_at "$work/ck_zero3" "$every"
  "$mammoth" train "$@" --save-dir "$work/ck_zero3_resume" --resume \
    --metrics "$work/zero3_on_one.jsonl" 2>"$work/zero3_on_one.log" ||
    { cat "$work/zero3_on_one.log"; fail "a ZeRO-3 checkpoint did not resume on one process"; }
  close_tail "$work/dp1.jsonl" "$work/zero3_on_one.jsonl" $((every + 1)) "$steps"
}

# refused PATTERN ARGS...: `mammoth train --steps 1 ARGS` fails and its error says PATTERN.
refused() {
  local pattern="$1"
  shift
  if "$mammoth" train --steps 1 --threads 1 "$@" >"$work/err.log" 2>&1; then
    fail "accepted: $*"
  fi
  grep -q -- "$pattern" "$work/err.log" || { cat "$work/err.log"; fail "no '$pattern' for: $*"; }
}
