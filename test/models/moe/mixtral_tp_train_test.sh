#!/bin/bash
# `mammoth train` of mixtral under tensor parallelism (models/policies/mixtral_policy.cc: the
# attention split over tp, the experts whole on every tp rank) gives one process's loss curve:
#   1. --tp 2 on 2 ranks against one process;
#   2. --dp 2 --ep 2 --tp 2 --zero 2 on 4 ranks (each tp rank an expert rank of its own expert
#      group) against one process running both micro-batches (--grad-accum 2);
#   3. the same --dp 2 --ep 2 --tp 2 with routers crafted (a checkpoint written by
#      transformers, as in mixtral_ep_train_test.sh) so that expert 3 gets no tokens: top-1
#      over gate rows giving the logits (x0, -x0, x1, 0) of the normed hidden state;
#   4. a --tp 2 checkpoint of step 2 resumed by one process continues the same curve;
#   5. sequence parallelism is refused for mixtral by name.
# Losses and the validation loss match to <= 1e-5 relative: tp and the dp reduction sum in
# another order than one process. The expert-load metric (read from the sharded form under tp)
# must be one process's at step 1.
set -euo pipefail
mammoth="$1"
mpirun="$2"
py="${MAMMOTH_PYTHON:-/usr/bin/python3}"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/mixtral_tp.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache
fail() { echo "FAIL: $*" >&2; exit 1; }
common=(--steps 4 --log-every 100 --eval-every 4 --eval-batches 2 --warmup 1 --threads 1 --seq-len 32
  --micro-batch 2 --moe-aux-loss-coef 0.02)

"$py" - "$work" <<'PYEOF'
import sys, torch, transformers
work = sys.argv[1]
torch.manual_seed(0)
c = transformers.MixtralConfig(
    vocab_size=1024, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
    num_experts_per_tok=1, max_position_embeddings=128, rope_theta=10000.0,
    output_router_logits=True, router_aux_loss_coef=0.02, sliding_window=None,
    tie_word_embeddings=False)
m = transformers.MixtralForCausalLM(c)
with torch.no_grad():
    for layer in m.model.layers:
        g = layer.block_sparse_moe.gate.weight  # [experts, hidden]
        g.zero_()
        g[0, 0], g[1, 0], g[2, 1] = 1.0, -1.0, 1.0
m.save_pretrained(f"{work}/no_expert3", safe_serialization=True)
PYEOF

run_pair() {  # NAME MODEL RANKS ACCUM EXTRA...: one process with --grad-accum ACCUM, then RANKS ranks
  local name="$1" model="$2" n="$3" accum="$4"
  shift 4
  "$mammoth" train --model "$model" "${common[@]}" --grad-accum "$accum" \
    --metrics "$work/$name.one.jsonl" >"$work/$name.one.log" 2>&1 ||
    { cat "$work/$name.one.log"; fail "$name: one process failed"; }
  bash "$mpirun" -np "$n" "$mammoth" train --model "$model" "${common[@]}" "$@" \
    --metrics "$work/$name.tp.jsonl" >"$work/$name.tp.log" 2>&1 ||
    { cat "$work/$name.tp.log"; fail "$name: $* failed"; }
  grep -q "tp2" "$work/$name.tp.log" || { cat "$work/$name.tp.log"; fail "$name: no tp in the layout"; }
}
run_pair tp2 mixtral-tiny 2 1 --tp 2 --save-dir "$work/ck" --save-every 2
run_pair ep_tp mixtral-tiny 4 2 --dp 2 --ep 2 --tp 2 --zero 2
grep -q "ep2" "$work/ep_tp.tp.log" || { cat "$work/ep_tp.tp.log"; fail "ep_tp: no ep in the layout"; }

# The tp 2 checkpoint of step 2 resumed by one process.
echo step_00000002 >"$work/ck/latest"
rm -rf "$work/ck/step_00000004"
"$mammoth" train --model mixtral-tiny "${common[@]}" --save-dir "$work/ck" --resume \
  --metrics "$work/resumed.jsonl" >"$work/resumed.log" 2>&1 ||
  { cat "$work/resumed.log"; fail "resume of the tp checkpoint failed"; }
grep -q "resumed from" "$work/resumed.log" || { cat "$work/resumed.log"; fail "did not resume"; }

# The crafted directory reads the corpus with the tokenizer mixtral-tiny's runs trained.
tok="$HOME/.cache/mammoth/default-corpus-v1-bpe1024"
[[ -f "$tok/vocab.json" ]] || fail "no tokenizer at $tok"
cp "$tok/vocab.json" "$tok/merges.txt" "$work/no_expert3/"
run_pair no_expert3 "$work/no_expert3" 4 2 --dp 2 --ep 2 --tp 2

"$py" - "$work" <<'PYEOF'
import json, sys
work = sys.argv[1]
def lines(name):
    return [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
for name in ("tp2", "ep_tp", "no_expert3"):
    one, tp = lines(name + ".one"), lines(name + ".tp")
    assert len(one) == len(tp) == 4, (name, len(one), len(tp))
    worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(one, tp))
    print(f"{name}: worst loss relative difference {worst:.2e} over 4 steps",
          [round(r["loss"], 6) for r in tp])
    assert worst <= 1e-5, [(a["loss"], b["loss"]) for a, b in zip(one, tp)]
    v1, v2 = one[-1]["val_loss"], tp[-1]["val_loss"]
    assert abs(v1 - v2) <= 1e-5 * abs(v1), (name, v1, v2)
    if name == "tp2":
        # The router losses and the load of the first step (the same parameters and batch)
        # are one process's: under tp they come from the sharded form, which ran the forward.
        a, b = one[0], tp[0]
        assert abs(a["moe_aux_loss"] - b["moe_aux_loss"]) <= 1e-5 * a["moe_aux_loss"], (a, b)
        assert [l["tokens"] for l in a["moe_load"]] == [l["tokens"] for l in b["moe_load"]], (a, b)
    if name == "no_expert3":
        for r in (one[0], tp[0]):
            for l in r["moe_load"]:
                assert l["tokens"][3] == 0, (name, l)
        print(f"{name}: step 1 expert load", [l["tokens"] for l in tp[0]["moe_load"]])
resumed = {r["step"]: r["loss"] for r in lines("resumed")}
tp = {r["step"]: r["loss"] for r in lines("tp2.tp")}
assert sorted(resumed) == [3, 4], sorted(resumed)
worst = max(abs(resumed[k] - tp[k]) / abs(tp[k]) for k in resumed)
print(f"tp 2 checkpoint resumed by one process: steps 3-4 rel difference {worst:.2e}")
assert worst <= 1e-5, (resumed, tp)
PYEOF

# Refused by name: the router losses average over every token of a sequence.
refuse() {  # RANKS MESSAGE FLAGS...
  local n="$1" message="$2" rc=0
  shift 2
  bash "$mpirun" -np "$n" "$mammoth" train --steps 1 --seq-len 32 "$@" >"$work/refuse.log" 2>&1 || rc=$?
  [[ $rc -ne 0 ]] || fail "$*: accepted"
  grep -q -- "$message" "$work/refuse.log" || { cat "$work/refuse.log"; fail "$*: not refused by name"; }
}
refuse 2 "mixtral (mixture of experts) does not run under sequence parallelism" \
  --model mixtral-tiny --tp 2 --sp-mode split_gather
refuse 2 "mixtral (mixture of experts) does not run under --pp" --model mixtral-tiny --pp 2
echo PASS
