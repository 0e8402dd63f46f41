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
#   4. plain --dp 2 --zero 2 and --zero 3 (ZeRO is admitted for mixtral with and without --ep),
#      and --dp 4 --ep 2 --zero 3, also with rank 1's experts getting no tokens;
#   5. the validation loss at step 4 (evaluation exchanges tokens too) is one process's;
#   6. --ep that does not divide the experts or --dp, or a model without experts, is refused.
# The loss each step equals one process's to <= 1e-6 relative, not bitwise: the gradients of the
# micro-batches are summed in another order (per rank, then by the reduction) than one
# process's accumulation.
set -euo pipefail
# shellcheck source=test/models/moe/moe_train_lib.sh
source "${BASH_SOURCE[0]%/*}/moe_train_lib.sh" "$1" "$2" mixtral_ep

craft_router no_expert3 "[(0, 1.0), (0, -1.0), (1, 1.0), None]"
craft_router no_rank1 "[(0, 1.0), (0, -1.0), None, None]"

run_pair random mixtral-tiny 2 2 --ep 2
expect_layout random ep2
# Each rank keeps AdamW states for its own experts only: 2 layers x 2 other experts x 3 weights
# x 2 states fewer tensors than one process.
states() { sed -n 's/.*optimizer states: [0-9]* bytes in \([0-9]*\) tensors.*/\1/p' "$1" | head -1; }
one_states="$(states "$work/random.one.log")" ep_states="$(states "$work/random.par.log")"
[[ -n "$one_states" && "$ep_states" == "$((one_states - 24))" ]] ||
  fail "optimizer state tensors: one process $one_states, ep 2 rank 0 $ep_states (expected 24 fewer)"
# ... and the other ranks' expert weights are freed: less than the whole model per rank.
percent() { sed -n "s/.*per rank: parameters [0-9.]* MiB (\([0-9.]*\)% of the model's.*/\1/p" "$1" | head -1; }
[[ "$(percent "$work/random.one.log")" == "100.0" ]] || fail "one process holds $(percent "$work/random.one.log")%"
p="$(percent "$work/random.par.log")"
[[ -n "$p" ]] && (( ${p%.*} < 100 )) || fail "--ep 2 rank 0 holds ${p}% of the parameters"
run_pair dp2_zero2 mixtral-tiny 2 2 --zero 2  # plain dp with ZeRO 2, now admitted for mixtral
run_pair random_zero2 mixtral-tiny 4 4 --dp 4 --ep 2 --zero 2 --save-dir "$work/random_zero2.ck" \
  --save-every 2
expect_layout random_zero2 ep2
# ZeRO 3: parameters sharded and gathered per kernel, the shared ones over dp, the experts
# over the ranks holding them (each grouped GEMM gathers every local expert's weight, also
# those that got no tokens on this rank: the gathers are collective).
run_pair dp2_zero3 mixtral-tiny 2 2 --zero 3
run_pair random_zero3 mixtral-tiny 4 4 --dp 4 --ep 2 --zero 3 --save-dir "$work/random_zero3.ck" \
  --save-every 2
expect_layout random_zero3 ep2
# ... and holds less of the model per rank than ZeRO 2 (its shards and the gathered buckets).
z2="$(percent "$work/random_zero2.par.log")" z3="$(percent "$work/random_zero3.par.log")"
[[ -n "$z2" && -n "$z3" ]] && (( ${z3%.*} < ${z2%.*} )) ||
  fail "--ep 2 --zero 3 rank 0 holds ${z3}% of the parameters, ZeRO 2 ${z2}%"
for d in no_expert3 no_rank1; do add_tokenizer "$work/$d"; done
run_pair no_expert3 "$work/no_expert3" 2 2 --ep 2
expect_layout no_expert3 ep2
run_pair no_rank1 "$work/no_rank1" 4 4 --dp 4 --ep 2 --zero 2
expect_layout no_rank1 ep2
run_pair no_rank1_zero3 "$work/no_rank1" 4 4 --dp 4 --ep 2 --zero 3
expect_layout no_rank1_zero3 ep2

compare_runs 1e-6 "{'no_expert3': [3], 'no_rank1': [2, 3], 'no_rank1_zero3': [2, 3]}" \
  random dp2_zero2 random_zero2 dp2_zero3 random_zero3 no_expert3 no_rank1 no_rank1_zero3
# Its sharded checkpoint of step 2 (each expert written by its owners) resumed by one process
# without --ep must continue the same curve; so must a ZeRO-3 one (shards of every parameter).
resume_one random_zero2 4 1e-6
resume_one random_zero3 4 1e-6

# Refused by name.
refuse 3 "--ep 3 must divide mixtral-tiny's 4 experts" --model mixtral-tiny --ep 3
refuse 2 "--ep 4 must divide --dp 2" --model mixtral-tiny --ep 4
refuse 2 "needs a mixture-of-experts model" --model llama-tiny --ep 2
echo PASS
