# shellcheck shell=bash
# What the `mammoth train` tests of mixtral under a parallel layout share. Sourced with the
# test's arguments and a name: `source moe_train_lib.sh MAMMOTH MPIRUN NAME` sets mammoth and
# mpirun (the binaries), py (a Python with torch and transformers), work (a scratch directory,
# removed on exit, also $HOME: the embedded corpus is tokenized into $HOME/.cache) and
# `common`, the flags of every run: 4 steps, evaluated at the last.
mammoth="$1"
mpirun="$2"
py="${MAMMOTH_PYTHON:-/usr/bin/python3}"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/$3.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"
common=(--steps 4 --log-every 100 --eval-every 4 --eval-batches 2 --warmup 1 --threads 1 --seq-len 32
  --micro-batch 2 --moe-aux-loss-coef 0.02)

fail() { echo "FAIL: $*" >&2; exit 1; }

# craft_router NAME ROWS: a mixtral-tiny-shaped checkpoint written by transformers at
# $work/NAME, top-1, whose gate rows make the router logits of the normed hidden state x:
# ROWS is a Python list with one entry per expert, (channel, sign) giving sign * x[channel],
# or None for a zero row (that expert never wins). Needs the tokenizer of mixtral-tiny's runs
# (add_tokenizer) before it trains.
craft_router() {
  "$py" - "$work" "$1" "$2" <<'PYEOF'
import ast, sys, torch, transformers
work, name, rows = sys.argv[1], sys.argv[2], ast.literal_eval(sys.argv[3])
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
}

# add_tokenizer DIR: the tokenizer mixtral-tiny's runs trained (so a crafted directory reads
# the same corpus).
add_tokenizer() {
  local tok="$HOME/.cache/mammoth/default-corpus-v1-bpe1024"
  [[ -f "$tok/vocab.json" ]] || fail "no tokenizer at $tok"
  cp "$tok/vocab.json" "$tok/merges.txt" "$1/"
}

# run_pair NAME MODEL RANKS ACCUM FLAGS...: one process with --grad-accum ACCUM (metrics
# $work/NAME.one.jsonl), then RANKS ranks with FLAGS ($work/NAME.par.jsonl, log NAME.par.log).
run_pair() {
  local name="$1" model="$2" n="$3" accum="$4"
  shift 4
  "$mammoth" train --model "$model" "${common[@]}" --grad-accum "$accum" \
    --metrics "$work/$name.one.jsonl" >"$work/$name.one.log" 2>&1 ||
    { cat "$work/$name.one.log"; fail "$name: one process failed"; }
  bash "$mpirun" -np "$n" "$mammoth" train --model "$model" "${common[@]}" "$@" \
    --metrics "$work/$name.par.jsonl" >"$work/$name.par.log" 2>&1 ||
    { cat "$work/$name.par.log"; fail "$name: $* failed"; }
}

# expect_layout NAME WORD: the parallel run's plan line names WORD ("ep2", "tp2").
expect_layout() {
  grep -q "plan: .*$2" "$work/$1.par.log" || { cat "$work/$1.par.log"; fail "$1: no $2 in the plan"; }
}

# compare_runs TOL EMPTY NAME...: each NAME's parallel run has one process's 4 losses and last
# validation loss to TOL relative, and its gradient norms to 1e-5; EMPTY, a Python dict
# {name: [experts]}, lists the experts that must get no tokens at step 1 in both runs. Runs
# named in $no_eval (pipeline stages: no periodic evaluation) must have no validation loss.
no_eval=""
compare_runs() {
  "$py" - "$work" "$no_eval" "$@" <<'PYEOF'
import ast, json, sys
work, no_eval = sys.argv[1], sys.argv[2].split()
tol, empty, names = float(sys.argv[3]), ast.literal_eval(sys.argv[4]), sys.argv[5:]
def lines(name):
    return [json.loads(l) for l in open(f"{work}/{name}.jsonl")]
for name in names:
    one, par = lines(name + ".one"), lines(name + ".par")
    assert len(one) == len(par) == 4, (name, len(one), len(par))
    worst = max(abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(one, par))
    print(f"{name}: worst loss relative difference {worst:.2e} over 4 steps",
          [round(r["loss"], 6) for r in par])
    assert worst <= tol, [(a["loss"], b["loss"]) for a, b in zip(one, par)]
    # The global gradient norm (clipped at 1, so it shapes the curve) over every shard and
    # expert once; the reductions sum in another order, hence 1e-5.
    gn = max(abs(a["grad_norm"] - b["grad_norm"]) / a["grad_norm"] for a, b in zip(one, par))
    assert gn <= 1e-5, [(a["grad_norm"], b["grad_norm"]) for a, b in zip(one, par)]
    # Evaluation runs the exchanges and collectives too (every rank evaluates the same batches).
    if name in no_eval:
        assert "val_loss" not in par[-1], (name, par[-1])
    else:
        v1, v2 = one[-1]["val_loss"], par[-1]["val_loss"]
        assert abs(v1 - v2) <= tol * abs(v1), (name, v1, v2)
    for e in empty.get(name, []):
        for r in (one[0], par[0]):
            for l in r["moe_load"]:
                assert l["tokens"][e] == 0, (name, e, l)
    if name in empty:
        print(f"{name}: step 1 expert load", [l["tokens"] for l in par[0]["moe_load"]])
PYEOF
}

# resume_one NAME ACCUM TOL: the checkpoint of step 2 in $work/NAME.ck (of NAME's parallel run)
# resumed by one process with --grad-accum ACCUM continues that run's steps 3-4 to TOL.
resume_one() {
  local name="$1" accum="$2" tol="$3"
  echo step_00000002 >"$work/$name.ck/latest"
  rm -rf "$work/$name.ck/step_00000004"
  "$mammoth" train --model mixtral-tiny "${common[@]}" --grad-accum "$accum" \
    --save-dir "$work/$name.ck" --resume --metrics "$work/$name.resumed.jsonl" \
    >"$work/$name.resumed.log" 2>&1 || { cat "$work/$name.resumed.log"; fail "$name: resume failed"; }
  grep -q "resumed from" "$work/$name.resumed.log" || fail "$name: did not resume"
  "$py" - "$work" "$name" "$tol" <<'PYEOF'
import json, sys
work, name, tol = sys.argv[1], sys.argv[2], float(sys.argv[3])
def losses(f):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{work}/{f}.jsonl"))}
resumed, run = losses(f"{name}.resumed"), losses(f"{name}.par")
assert sorted(resumed) == [3, 4], sorted(resumed)
worst = max(abs(resumed[k] - run[k]) / abs(run[k]) for k in resumed)
print(f"{name}: checkpoint resumed by one process, steps 3-4 rel difference {worst:.2e}")
assert worst <= tol, (resumed, run)
PYEOF
}

# refuse RANKS MESSAGE FLAGS...: `mammoth train FLAGS` on RANKS ranks fails naming MESSAGE.
refuse() {
  local n="$1" message="$2" rc=0
  shift 2
  bash "$mpirun" -np "$n" "$mammoth" train --steps 1 --seq-len 32 "$@" >"$work/refuse.log" 2>&1 || rc=$?
  [[ $rc -ne 0 ]] || fail "$*: accepted"
  grep -q -- "$message" "$work/refuse.log" || { cat "$work/refuse.log"; fail "$*: not refused by name"; }
}
