#!/bin/bash
# Mixtral under pipeline stages (`mammoth train --pp`): the stages carry the router sums with
# the hidden states, so the last stage adds the router losses of every layer as one process
# does (models/mixtral/mixtral.h).
#   1. --pp 2 on 2 ranks against one process with --grad-accum 2: losses and gradient norms,
#      and the expert load and load-balancing loss of each step's last micro-batch, gathered
#      over the stages into the metrics line;
#   2. --dp 2 --ep 2 --pp 2 --zero 2 on 4 ranks against --grad-accum 4, and its step-2
#      checkpoint resumed by one process;
#   3. the same layout with routers crafted (by transformers) so that expert 3 gets no tokens,
#      at ZeRO 2 and ZeRO 3;
#   4. --pp 2 --tp 2 (the tensor-parallel form's stages) against one process, and every axis at
#      once: --dp 2 --ep 2 --pp 2 --tp 2 --zero 3 on 8 ranks against --grad-accum 4;
#   5. --pp with --amp bf16 refused by name.
set -euo pipefail
# shellcheck source=test/models/moe/moe_train_lib.sh
source "${BASH_SOURCE[0]%/*}/moe_train_lib.sh" "$1" "$2" mixtral_pp

run_pair pp2 mixtral-tiny 2 2 --pp 2 --grad-accum 2
grep -q "pipeline stages (balanced): layers 0-0, 1-1" "$work/pp2.par.log" ||
  { cat "$work/pp2.par.log"; fail "pp2: not two pipeline stages"; }
"$py" - "$work" <<'PYEOF'
import json, sys
work = sys.argv[1]
one, par = ([json.loads(l) for l in open(f"{work}/pp2.{r}.jsonl")] for r in ("one", "par"))
# Steps 1-3: one process's last forward at step 4 is its evaluation (pp runs none).
for a, b in zip(one[:3], par[:3]):
    assert [l["tokens"] for l in a["moe_load"]] == [l["tokens"] for l in b["moe_load"]], (a, b)
    assert abs(a["moe_aux_loss"] - b["moe_aux_loss"]) <= 1e-6 * a["moe_aux_loss"], (a, b)
print("pp2: steps 1-3 expert load and load-balancing loss are one process's",
      [round(r["moe_aux_loss"], 6) for r in par[:3]])
PYEOF

craft_router no_expert3 "[(0, 1.0), (0, -1.0), (1, 1.0), None]"
add_tokenizer "$work/no_expert3"
layout=(--dp 2 --ep 2 --pp 2 --zero 2 --grad-accum 2)
run_pair ep2_pp2 mixtral-tiny 4 4 "${layout[@]}" --save-dir "$work/ep2_pp2.ck" --save-every 2
expect_layout ep2_pp2 "dp2 pp2 .* ep2"
run_pair no_expert3 "$work/no_expert3" 4 4 "${layout[@]}"
# ZeRO 3 over each stage's replicas, the experts gathered per grouped GEMM by their holders.
run_pair no_expert3_zero3 "$work/no_expert3" 4 4 --dp 2 --ep 2 --pp 2 --zero 3 --grad-accum 2
# pp 2 x tp 2: the tensor-parallel form's stages carry the router sums too.
run_pair pp2_tp2 mixtral-tiny 4 2 --pp 2 --tp 2 --grad-accum 2
expect_layout pp2_tp2 "dp1 pp2 tp2"
# Every axis in one mesh: dp 2 x ep 2 x pp 2 x tp 2 at ZeRO 3 on 8 ranks.
run_pair all_axes mixtral-tiny 8 4 --dp 2 --ep 2 --pp 2 --tp 2 --zero 3 --grad-accum 2
expect_layout all_axes "dp2 pp2 tp2 .* ep2"
no_eval="pp2 ep2_pp2 no_expert3 no_expert3_zero3 pp2_tp2 all_axes"
compare_runs 1e-6 "{'no_expert3': [3], 'no_expert3_zero3': [3]}" pp2 ep2_pp2 no_expert3 \
  no_expert3_zero3 pp2_tp2 all_axes
resume_one ep2_pp2 4 1e-6

refuse 2 "Mixtral's stages carry the router sums with the hidden states" --model mixtral-tiny \
  --pp 2 --amp bf16
echo PASS
