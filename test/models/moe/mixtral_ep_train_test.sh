#!/bin/bash
# `mammoth train --ep` (expert parallelism, models/mixtral + parallel/expert_parallel) gives one
# process's loss curve:
#   1. --ep 2 on 2 ranks against one process running both micro-batches (--grad-accum 2);
#   2. --dp 4 --ep 2 --zero 2 (expert groups of 2, expert-dp 2, ZeRO 2 over both groups) on 4
#      ranks against --grad-accum 4;
#   3. the same with routers crafted (a checkpoint written by transformers) so that an expert,
#      or every expert of the second ep rank, gets no tokens: top-1 over gate rows giving the
#      logits (x0, -x0, x1, 0) or (x0, -x0, 0, 0) of the normed hidden state. The expert-load
#      metric shows that they did;
#   4. plain --dp 2 --zero 2 (ZeRO is admitted for mixtral with and without --ep);
#   5. the validation loss at step 4 (evaluation exchanges tokens too) is one process's;
#   6. --ep that does not divide the experts or --dp, or a model without experts, is refused.
# The loss each step equals one process's to <= 1e-6 relative, not bitwise: the gradients of the
# micro-batches are summed in another order (per rank, then by the reduction) than one
# process's accumulation.
set -euo pipefail
mammoth="$1"
mpirun="$2"
py="${MAMMOTH_PYTHON:-/usr/bin/python3}"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/mixtral_ep.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache
fail() { echo "FAIL: $*" >&2; exit 1; }
common=(--steps 4 --log-every 100 --eval-every 4 --eval-batches 2 --warmup 1 --threads 1 --seq-len 32
  --micro-batch 2 --moe-aux-loss-coef 0.02)

"$py" - "$work" <<'PYEOF'
import sys, torch, transformers
work = sys.argv[1]
for name, rows in (("no_expert3", [(0, 1.0), (0, -1.0), (1, 1.0), None]),
                   ("no_rank1", [(0, 1.0), (0, -1.0), None, None])):
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
            for e, r in enumerate(rows):
                if r is not None:
                    g[e, r[0]] = r[1]
    m.save_pretrained(f"{work}/{name}", safe_serialization=True)
PYEOF

run_pair() {  # NAME MODEL RANKS EXTRA...: one process with --grad-accum RANKS, then RANKS ranks
  local name="$1" model="$2" n="$3"
  shift 3
  "$mammoth" train --model "$model" "${common[@]}" --grad-accum "$n" \
    --metrics "$work/$name.one.jsonl" >"$work/$name.one.log" 2>&1 ||
    { cat "$work/$name.one.log"; fail "$name: one process failed"; }
  bash "$mpirun" -np "$n" "$mammoth" train --model "$model" "${common[@]}" "$@" \
    --metrics "$work/$name.ep.jsonl" >"$work/$name.ep.log" 2>&1 ||
    { cat "$work/$name.ep.log"; fail "$name: $* failed"; }
  if [[ " $* " == *" --ep "* ]]; then
    grep -q "ep2" "$work/$name.ep.log" || { cat "$work/$name.ep.log"; fail "$name: no ep in the layout"; }
  fi
}
run_pair random mixtral-tiny 2 --ep 2
# Each rank keeps AdamW states for its own experts only: 2 layers x 2 other experts x 3 weights
# x 2 states fewer tensors than one process.
states() { sed -n 's/.*optimizer states: [0-9]* bytes in \([0-9]*\) tensors.*/\1/p' "$1" | head -1; }
one_states="$(states "$work/random.one.log")" ep_states="$(states "$work/random.ep.log")"
[[ -n "$one_states" && "$ep_states" == "$((one_states - 24))" ]] ||
  fail "optimizer state tensors: one process $one_states, ep 2 rank 0 $ep_states (expected 24 fewer)"
# ... and the other ranks' expert weights are freed: less than the whole model per rank.
percent() { sed -n "s/.*per rank: parameters [0-9.]* MiB (\([0-9.]*\)% of the model's.*/\1/p" "$1" | head -1; }
[[ "$(percent "$work/random.one.log")" == "100.0" ]] || fail "one process holds $(percent "$work/random.one.log")%"
p="$(percent "$work/random.ep.log")"
[[ -n "$p" ]] && (( ${p%.*} < 100 )) || fail "--ep 2 rank 0 holds ${p}% of the parameters"
run_pair dp2_zero2 mixtral-tiny 2 --zero 2  # plain dp with ZeRO 2, now admitted for mixtral
run_pair random_zero2 mixtral-tiny 4 --dp 4 --ep 2 --zero 2 --save-dir "$work/ck" --save-every 2
# Its sharded checkpoint of step 2 (each expert written by its owners) resumed by one process
# without --ep must continue the same curve.
echo step_00000002 >"$work/ck/latest"
rm -rf "$work/ck/step_00000004"
"$mammoth" train --model mixtral-tiny "${common[@]}" --grad-accum 4 --save-dir "$work/ck" --resume \
  --metrics "$work/resumed.jsonl" >"$work/resumed.log" 2>&1 ||
  { cat "$work/resumed.log"; fail "resume of the ep checkpoint failed"; }
# The crafted directories read the corpus with the tokenizer mixtral-tiny's runs trained.
tok="$HOME/.cache/mammoth/default-corpus-v1-bpe1024"
[[ -f "$tok/vocab.json" ]] || fail "no tokenizer at $tok"
for d in no_expert3 no_rank1; do cp "$tok/vocab.json" "$tok/merges.txt" "$work/$d/"; done
run_pair no_expert3 "$work/no_expert3" 2 --ep 2
run_pair no_rank1 "$work/no_rank1" 4 --dp 4 --ep 2 --zero 2

"$py" - "$work" <<'PYEOF'
import json, sys
work = sys.argv[1]
def lines(name):
    return [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
empty = {"no_expert3": [3], "no_rank1": [2, 3]}
for name in ("random", "dp2_zero2", "random_zero2", "no_expert3", "no_rank1"):
    one, ep = lines(name + ".one"), lines(name + ".ep")
    assert len(one) == len(ep) == 4, (name, len(one), len(ep))
    worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(one, ep))
    print(f"{name}: worst loss relative difference {worst:.2e} over 4 steps",
          [round(r["loss"], 6) for r in ep])
    assert worst <= 1e-6, [(a["loss"], b["loss"]) for a, b in zip(one, ep)]
    # Evaluation runs the exchanges too (every rank evaluates the same batches).
    v1, v2 = one[-1]["val_loss"], ep[-1]["val_loss"]
    assert abs(v1 - v2) <= 1e-6 * abs(v1), (name, v1, v2)
    for e in empty.get(name, []):
        for r in (one[0], ep[0]):
            for l in r["moe_load"]:
                assert l["tokens"][e] == 0, (name, e, l)
    if name in empty:
        print(f"{name}: step 1 expert load", [l["tokens"] for l in ep[0]["moe_load"]])
resumed = {r["step"]: r["loss"] for r in lines("resumed")}
ep = {r["step"]: r["loss"] for r in lines("random_zero2.ep")}
assert sorted(resumed) == [3, 4], sorted(resumed)
worst = max(abs(resumed[k] - ep[k]) / abs(ep[k]) for k in resumed)
print(f"ep 2 x dp 2 checkpoint resumed by one process: steps 3-4 rel difference {worst:.2e}")
assert worst <= 1e-6, (resumed, ep)
PYEOF

# Refused by name.
refuse() {  # RANKS MESSAGE FLAGS...
  local n="$1" message="$2" rc=0
  shift 2
  bash "$mpirun" -np "$n" "$mammoth" train --steps 1 --seq-len 32 "$@" >"$work/refuse.log" 2>&1 || rc=$?
  [[ $rc -ne 0 ]] || fail "$*: accepted"
  grep -q -- "$message" "$work/refuse.log" || { cat "$work/refuse.log"; fail "$*: not refused by name"; }
}
refuse 3 "--ep 3 must divide mixtral-tiny's 4 experts" --model mixtral-tiny --ep 3
refuse 2 "--ep 4 must divide --dp 2" --model mixtral-tiny --ep 4
refuse 2 "needs a mixture-of-experts model" --model llama-tiny --ep 2
echo PASS
