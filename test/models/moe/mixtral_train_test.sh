#!/bin/bash
# `mammoth train --model mixtral-tiny`:
#   1. the loss falls, and every metrics line carries the per-layer expert load (tokens per
#      expert summing to tokens x top_k, no drops when dropless) and the router losses;
#   2. the load-balancing loss balances the experts: over the last 10 of 60 steps the busiest
#      expert's load relative to the mean is lower with --moe-aux-loss-coef 0.1 than with 0;
#   3. --moe-capacity-factor 1 drops tokens and says how many;
#   4. plain data parallelism (--dp 2) gives one process's loss curve (the router losses are
#      per micro-batch, as transformers computes them, so this compares the same micro-batches);
#   5. layouts the family does not support yet are refused by name.
set -euo pipefail
mammoth="$1"
mpirun="$2"
py="${MAMMOTH_PYTHON:-/usr/bin/python3}"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/mixtral_train.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache
fail() { echo "FAIL: $*" >&2; exit 1; }
common=(--model mixtral-tiny --steps 60 --log-every 20 --eval-every 0 --warmup 2 --threads 1
  --seq-len 32 --micro-batch 4 --lr 1e-2)

for coef in 0 0.1; do
  "$mammoth" train "${common[@]}" --moe-aux-loss-coef "$coef" --metrics "$work/m$coef.jsonl" \
    >"$work/train$coef.log" 2>&1 || { cat "$work/train$coef.log"; fail "coef $coef: train failed"; }
done
"$mammoth" train "${common[@]}" --steps 3 --moe-capacity-factor 1 --metrics "$work/cap.jsonl" \
  >"$work/cap.log" 2>&1 || { cat "$work/cap.log"; fail "capacity run failed"; }

dp=(--model mixtral-tiny --steps 4 --log-every 100 --eval-every 0 --warmup 1 --threads 1
  --seq-len 32)
"$mammoth" train "${dp[@]}" --micro-batch 2 --grad-accum 2 --metrics "$work/one.jsonl" \
  >"$work/one.log" 2>&1 || { cat "$work/one.log"; fail "one-process run failed"; }
bash "$mpirun" -np 2 "$mammoth" train "${dp[@]}" --micro-batch 2 --dp 2 \
  --metrics "$work/dp2.jsonl" >"$work/dp2.log" 2>&1 || { cat "$work/dp2.log"; fail "dp 2 failed"; }

"$py" - "$work" <<'PYEOF'
import json, sys
work = sys.argv[1]
def lines(name):
    return [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
def imbalance(r):  # the busiest expert's load over the mean, worst layer
    return max(max(l["tokens"]) / (sum(l["tokens"]) / len(l["tokens"])) for l in r["moe_load"])
tokens = 4 * 32 * 2  # micro-batch x seq-len x top_k
result = {}
for coef in ("0", "0.1"):
    m = lines("m" + coef)
    assert len(m) == 60, len(m)
    for r in m:
        assert len(r["moe_load"]) == 2, r
        for l in r["moe_load"]:
            assert len(l["tokens"]) == 4 and sum(l["tokens"]) == tokens and l["dropped"] == 0, l
        assert r["moe_aux_loss"] >= 1.0 - 1e-6, r  # E * sum f_e P_e >= 1 (equality: balanced)
    first = sum(r["loss"] for r in m[:5]) / 5
    last = sum(r["loss"] for r in m[-5:]) / 5
    assert last < first - 1.5, (coef, first, last)
    result[coef] = sum(imbalance(r) for r in m[-10:]) / 10
print("imbalance (busiest / mean) over the last 10 steps:", result)
assert result["0.1"] < 0.85 * result["0"], result
cap = lines("cap")
# capacity ceil(1 * 128 * 2 / 4) = 64 pairs per expert: whatever exceeds it is dropped
for r in cap:
    for l in r["moe_load"]:
        assert l["dropped"] == sum(max(0, t - 64) for t in l["tokens"]), l
assert any(l["dropped"] > 0 for r in cap for l in r["moe_load"]), cap
print("capacity 1: dropped", [[l["dropped"] for l in r["moe_load"]] for r in cap])
one, dp2 = lines("one"), lines("dp2")
assert len(one) == len(dp2) == 4, (len(one), len(dp2))
worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(one, dp2))
print(f"dp 2 vs one process: worst loss relative difference {worst:.2e}")
assert worst < 1e-5, [(a["loss"], b["loss"]) for a, b in zip(one, dp2)]
PYEOF

# Refused by name.
for flags in "--recompute-blocks 1" "--offload host" "--lora-rank 4"; do
  rc=0
  # shellcheck disable=SC2086
  "$mammoth" train --model mixtral-tiny --steps 1 --seq-len 32 $flags >"$work/refuse.log" 2>&1 || rc=$?
  [[ $rc -ne 0 ]] || fail "$flags: accepted"
  grep -q "mixtral" "$work/refuse.log" || { cat "$work/refuse.log"; fail "$flags: not refused by name"; }
done
echo PASS
