#!/bin/bash
# `mammoth eval` for the non-causal families: ViT classification loss on a labelled image
# shard and BERT masked-LM loss on a token file. The figure must not depend on --batch, must be
# near ln(classes) / ln(vocab) for a freshly initialised model, and bad inputs are clear errors.
set -euo pipefail
mammoth="$1"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/eval_task.XXXXXX")"
trap 'rm -rf "$work"' EXIT

"$mammoth" data --out "$work/img" --synthetic-images 40 --image-classes 10 --image-size 32 --quiet
vit_a="$("$mammoth" eval --model vit-tiny --images "$work/img/images.bin" --batch 16)"
vit_b="$("$mammoth" eval --model vit-tiny --images "$work/img/images.bin" --batch 3)"

# Tokens below bert-tiny's vocabulary of 512: a tokenizer of at most 300 ids.
for i in $(seq 1 400); do echo "the cat sat on the mat and the dog ran to the cat $i"; done >"$work/t.txt"
"$mammoth" data --out "$work/tok" --vocab-size 300 --quiet "$work/t.txt"
bert_a="$("$mammoth" eval --model bert-tiny --tokens "$work/tok/train_000000.bin" --seq-len 32 \
  --mask-token 5 --batch 4)"
bert_b="$("$mammoth" eval --model bert-tiny --tokens "$work/tok/train_000000.bin" --seq-len 32 \
  --mask-token 5 --batch 9)"

if "$mammoth" eval --model gpt2-tiny --images "$work/img/images.bin" 2>"$work/err"; then
  echo "expected an error for a non-ViT model"; exit 1
fi
grep -q "needs a ViT --model" "$work/err"
head -c 2000 "$work/img/images.bin" >"$work/short.bin"
if "$mammoth" eval --model vit-tiny --images "$work/short.bin" 2>"$work/err"; then
  echo "expected an error for a truncated shard"; exit 1
fi
grep -q "truncated" "$work/err"

"${MAMMOTH_PYTHON:-/usr/bin/python3}" - "$vit_a" "$vit_b" "$bert_a" "$bert_b" <<'PY'
import json, math, sys
vit_a, vit_b, bert_a, bert_b = map(json.loads, sys.argv[1:])
print(vit_a, vit_b, bert_a, bert_b)
assert vit_a["images"] == vit_b["images"] == 40
assert abs(vit_a["loss"] - vit_b["loss"]) < 1e-5
assert abs(vit_a["loss"] - math.log(10)) < 0.3, vit_a
assert bert_a["tokens"] == bert_b["tokens"] > 0
assert abs(bert_a["loss"] - bert_b["loss"]) < 1e-5
assert abs(bert_a["loss"] - math.log(512)) < 0.5, bert_a
print("ok")
PY
