#!/bin/bash
# `mammoth train` of mixtral under tensor parallelism (models/policies/mixtral_policy.cc: the
# attention split over tp, the experts whole on every tp rank) gives one process's loss curve:
#   1. --tp 2 on 2 ranks against one process;
#   2. --dp 2 --ep 2 --tp 2 --zero 2 on 4 ranks (each tp rank an expert rank of its own expert
#      group) against one process running both micro-batches (--grad-accum 2);
#   3. the same --dp 2 --ep 2 --tp 2 with routers crafted (a checkpoint written by
#      transformers, as in mixtral_ep_train_test.sh) so that expert 3 gets no tokens: top-1
#      over gate rows giving the logits (x0, -x0, x1, 0) of the normed hidden state;
#   4. a --tp 2 checkpoint of step 2, and one of --dp 2 --ep 2 --tp 2, resumed by one process
#      continue the same curve;
#   5. sequence parallelism is refused for mixtral by name.
# Losses and the validation loss match to <= 1e-5 relative: tp and the dp reduction sum in
# another order than one process. The expert-load metric (read from the sharded form under tp)
# must be one process's at step 1.
set -euo pipefail
# shellcheck source=test/models/moe/moe_train_lib.sh
source "${BASH_SOURCE[0]%/*}/moe_train_lib.sh" "$1" "$2" mixtral_tp

craft_router no_expert3 "[(0, 1.0), (0, -1.0), (1, 1.0), None]"

run_pair tp2 mixtral-tiny 2 1 --tp 2 --save-dir "$work/tp2.ck" --save-every 2
expect_layout tp2 tp2
run_pair ep_tp mixtral-tiny 4 2 --dp 2 --ep 2 --tp 2 --zero 2 --save-dir "$work/ep_tp.ck" \
  --save-every 2
expect_layout ep_tp "tp2 .*ep2"
add_tokenizer "$work/no_expert3"
run_pair no_expert3 "$work/no_expert3" 4 2 --dp 2 --ep 2 --tp 2
expect_layout no_expert3 "tp2 .*ep2"

compare_runs 1e-5 "{'no_expert3': [3]}" tp2 ep_tp no_expert3
resume_one tp2 1 1e-5
resume_one ep_tp 2 1e-5

# The router losses and the expert load of the first step (the same parameters and batch) are
# one process's: under tp they come from the sharded form, which ran the forward.
"$py" - "$work" <<'PYEOF'
import json, sys
work = sys.argv[1]
a, b = (json.loads(open(f"{work}/tp2.{run}.jsonl").readline()) for run in ("one", "par"))
assert abs(a["moe_aux_loss"] - b["moe_aux_loss"]) <= 1e-5 * a["moe_aux_loss"], (a, b)
assert abs(a["moe_z_loss"] - b["moe_z_loss"]) <= 1e-5 * a["moe_z_loss"], (a, b)
assert [l["tokens"] for l in a["moe_load"]] == [l["tokens"] for l in b["moe_load"]], (a, b)
print("tp2: step 1 router losses and expert load are one process's", a["moe_aux_loss"])
PYEOF

# Refused by name: the router losses average over every token of a sequence.
refuse 2 "mixtral (mixture of experts) does not run under sequence parallelism" \
  --model mixtral-tiny --tp 2 --sp-mode split_gather
echo PASS
