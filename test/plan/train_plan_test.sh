#!/bin/bash
# `mammoth train` runs plans: --plan FILE (layout flags beside it refused, unknown keys refused);
# the planner's top 3 plans for np 2 and np 4 (`mammoth plan --runnable-only --out`) each train
# for a few steps; --plan auto on 1, 2 and 4 ranks picks, prints and runs a plan, and its
# metrics lines carry the predicted step time and peak memory beside the measured ones.
set -euo pipefail
mammoth="$1"
mpirun="$2"
py="${MAMMOTH_PYTHON:-/usr/bin/python3}"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_plan.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache once
fail() { echo "FAIL: $*"; exit 1; }
common=(--steps 2 --log-every 1 --eval-every 0 --warmup 1 --threads 1)
run() {  # run NP LOG ARGS...
  local np="$1" log="$2"
  shift 2
  if [[ "$np" == 1 ]]; then
    "$mammoth" train "${common[@]}" "$@" >"$log" 2>&1
  else
    bash "$mpirun" -np "$np" "$mammoth" train "${common[@]}" "$@" >"$log" 2>&1
  fi
}

# --plan FILE: the file gives the layout; the run says which plan it runs.
echo '{"tp": 2, "micro_batch": 2, "seq_len": 32, "recompute_blocks": 1}' >"$work/tp2.json"
run 2 "$work/file.log" --plan "$work/tp2.json" || { cat "$work/file.log"; fail "--plan FILE"; }
grep -q "\[train\] plan: dp1 pp1 tp2 sp1 (tp-sp-dp-pp) mb2x1 seq 32 zero0 offload none recompute 1 fp32" \
  "$work/file.log" || { cat "$work/file.log"; fail "--plan FILE: no plan line"; }
if run 2 "$work/both.log" --plan "$work/tp2.json" --zero 1; then fail "--zero beside --plan ran"; fi
grep -q "\-\-zero is set by --plan" "$work/both.log" || { cat "$work/both.log"; fail "no refusal"; }
echo '{"tp": 2, "zero_stage": 1}' >"$work/bad.json"
if run 2 "$work/bad.log" --plan "$work/bad.json"; then fail "an unknown plan key ran"; fi
grep -q "unknown key 'zero_stage'" "$work/bad.log" || { cat "$work/bad.log"; fail "no key named"; }

# The planner's top 3 plans for 2 and 4 ranks: each is valid and trains.
for np in 2 4; do
  "$mammoth" plan --model gpt2-tiny --cluster h200_node --world "$np" --global-batch 8 \
    --seq-len 32 --amp fp32 --device cpu --runnable-only --top 3 --out "$work/plans$np.json" \
    >"$work/plan$np.log" 2>&1 || { cat "$work/plan$np.log"; fail "plan --world $np"; }
  "$py" - "$work/plans$np.json" "$work/np$np" <<'PY'
import json, sys
plans = json.load(open(sys.argv[1]))["plans"]
assert len(plans) == 3, f"expected 3 plans, got {len(plans)}"
for i, p in enumerate(plans):
    json.dump(p["plan"], open(f"{sys.argv[2]}_{i}.json", "w"))
PY
  for i in 0 1 2; do
    run "$np" "$work/top$np-$i.log" --plan "$work/np${np}_$i.json" ||
      { cat "$work/top$np-$i.log"; fail "plan #$((i + 1)) for np $np did not train"; }
    grep -a "\[train\] plan: " "$work/top$np-$i.log"
    grep -q "\[train\] done: steps 0..2" "$work/top$np-$i.log" || fail "np $np plan $i: no end line"
  done
done

# --plan auto on 1, 2 and 4 ranks: the ranked plans are printed, one runs, and the metrics hold
# predicted and measured step time and peak memory.
for np in 1 2 4; do
  run "$np" "$work/auto$np.log" --plan auto --cluster h200_node --global-batch 8 --seq-len 32 \
    --metrics "$work/auto$np.jsonl" || { cat "$work/auto$np.log"; fail "--plan auto on $np"; }
  for want in "--plan auto on h200_node, $np rank(s):" "#1 dp" "binds:" "\[train\] plan: " \
    "\[train\] predicted step time " "\[train\] rank 0 memory: predicted peak"; do
    grep -q -- "$want" "$work/auto$np.log" || { cat "$work/auto$np.log"; fail "np $np: no '$want'"; }
  done
  # The search plans for the model train builds (the embedded corpus's vocabulary, not the
  # registered one): its first plan's step time is train's own prediction.
  "$py" - "$work/auto$np.log" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
first = re.search(r"#1 dp.*\n\s+step ([0-9.e+-]+) (ms|us|s),", text)
own = re.search(r"\[train\] predicted step time ([0-9.e+-]+) s", text)
assert first and own, "no #1 step or predicted step time line"
searched = float(first.group(1)) * {"s": 1, "ms": 1e-3, "us": 1e-6}[first.group(2)]
assert abs(searched / float(own.group(1)) - 1) < 0.01, (searched, own.group(1))
PY
  "$py" - "$work/auto$np.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) == 2, lines
for m in lines:
    for key in ["step_s", "predicted_step_s", "peak_mem_bytes", "predicted_peak_mem_bytes"]:
        assert key in m and m[key] > 0, (key, m)
print("metrics:", {k: lines[-1][k] for k in ["step_s", "predicted_step_s", "peak_mem_bytes",
                                              "predicted_peak_mem_bytes"]})
PY
done
# Without --cluster, --plan auto calibrates this machine first (every rank takes part) and
# predicts on it.
run 2 "$work/calibrated.log" --plan auto --global-batch 8 --seq-len 32 \
  --metrics "$work/calibrated.jsonl" || { cat "$work/calibrated.log"; fail "--plan auto, calibrated"; }
for want in "calibrating this machine" "--plan auto on " "\[train\] predicted step time "; do
  grep -q -- "$want" "$work/calibrated.log" || { cat "$work/calibrated.log"; fail "no '$want'"; }
done
grep -a "predicted step time" "$work/calibrated.log"
grep -q '"predicted_step_s"' "$work/calibrated.jsonl" || fail "calibrated: no predicted_step_s"
echo "PASS"
