#!/bin/bash
# BERT learns masked-LM under `mammoth train` and `mammoth eval` scores it with the same rule:
# bert-tiny trained on a repetitive stream, its checkpoint exported as a Hugging Face directory
# (config.json carries the special tokens, mask_token_id 4), has a masked-LM eval loss on
# held-out data far below the untrained model's (~ln 512); on the embedded corpus the BPE
# vocabulary gains [MASK] (train) and the export names it; a model without a [MASK] token is
# refused.
set -euo pipefail
mammoth="$1"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_mlm_eval.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"
py="${MAMMOTH_PYTHON:-/usr/bin/python3}"

# test/testing/token_data.h's stream shifted past bert-tiny's special ids 0-4; validation is
# the stream's continuation.
"$py" - "$work" <<'PY'
import struct, sys
def shard(path, first, n):
    tokens = [(i * 7 + i // 31) % 48 + 5 for i in range(first, first + n)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *tokens))
shard(f"{sys.argv[1]}/train.bin", 0, 12000)
shard(f"{sys.argv[1]}/val.bin", 12000, 4000)
PY

# 300 steps of 32 windows of 32 tokens (5 predictions each): past the unigram plateau (ln 48),
# into using the context.
"$mammoth" train --model bert-tiny --data "$work/train.bin" --val-data "$work/val.bin" \
  --steps 300 --micro-batch 32 --seq-len 32 --lr 3e-3 --warmup 30 --schedule constant \
  --weight-decay 0 --eval-every 100 --eval-batches 4 --log-every 100 --threads 1 \
  --save-dir "$work/run" --metrics "$work/m.jsonl"
"$mammoth" ckpt export "$work/run" --out "$work/model"
grep -q '"mask_token_id": 4' "$work/model/config.json"
eval_args=(--tokens "$work/val.bin" --seq-len 32 --batch 16 --threads 1)
trained="$("$mammoth" eval --model "$work/model" "${eval_args[@]}")"
fresh="$("$mammoth" eval --model bert-tiny "${eval_args[@]}")"
# --batch does not change the figure; neither does an explicit --mask-token equal to the model's.
trained_b="$("$mammoth" eval --model "$work/model" "${eval_args[@]}" --batch 5 --mask-token 4)"

# The embedded corpus: BPE ids plus [MASK] appended; <|endoftext|> is [SEP].
"$mammoth" train --model bert-tiny --steps 2 --micro-batch 2 --seq-len 16 --eval-every 0 \
  --log-every 100 --threads 1 --save-dir "$work/corpus"
"$mammoth" ckpt export "$work/corpus" --out "$work/corpus_model"

# A BERT directory whose config and tokenizer name no [MASK]: refused, naming the fix.
mkdir "$work/nomask"
"$py" - "$work/model/config.json" "$work/nomask/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for k in ["unk_token_id", "cls_token_id", "sep_token_id", "mask_token_id"]:
    c.pop(k)
json.dump(c, open(sys.argv[2], "w"))
PY
cp "$work/model/model.safetensors" "$work/nomask/"
if "$mammoth" eval --model "$work/nomask" "${eval_args[@]}" 2>"$work/err"; then
  echo "expected an error for a model without [MASK]"; exit 1
fi
grep -q "defines no \[MASK\] token" "$work/err"
grep -q -- "--mask-token" "$work/err"
# ... unless the directory's vocab.txt names it.
for i in $(seq 0 511); do
  case $i in 0) echo "[PAD]" ;; 1) echo "[UNK]" ;; 2) echo "[CLS]" ;; 3) echo "[SEP]" ;;
    4) echo "[MASK]" ;; *) echo "tok$i" ;; esac
done >"$work/nomask/vocab.txt"
from_vocab="$("$mammoth" eval --model "$work/nomask" "${eval_args[@]}")"

"$py" - "$trained" "$fresh" "$trained_b" "$from_vocab" "$work" <<'PY'
import json, math, sys
trained, fresh, trained_b, from_vocab = map(json.loads, sys.argv[1:5])
work = sys.argv[5]
print("trained", trained, "fresh", fresh)
# round(0.15 * 32) = 5 chosen positions in each of the 125 sequences of 32.
assert trained["tokens"] == fresh["tokens"] == 125 * 5, (trained, fresh)
assert abs(fresh["loss"] - math.log(512)) < 0.5, fresh
# Far below the untrained model, and below what token frequencies alone give (the stream's 48
# ids are near uniform: ln 48 = 3.87), so the model predicts a masked token from its context.
assert trained["loss"] < fresh["loss"] - 2, (trained, fresh)
assert trained["loss"] < math.log(48) - 0.2, trained
assert abs(trained_b["loss"] - trained["loss"]) < 1e-5, (trained_b, trained)
# vocab.txt names the same special tokens: the same masks, the same figure.
assert abs(from_vocab["loss"] - trained["loss"]) < 1e-5, (from_vocab, trained)
# The validation loss train reports is the same objective, and it fell.
val = [json.loads(l)["val_loss"] for l in open(f"{work}/m.jsonl") if "val_loss" in l]
print("validation", val)
assert len(val) == 3 and val[-1] < val[0], val
c = json.load(open(f"{work}/corpus_model/config.json"))
print("embedded corpus:", {k: c[k] for k in c if k.endswith("token_id") or k == "vocab_size"})
assert c["mask_token_id"] == c["vocab_size"] - 1 and c["sep_token_id"] == c["vocab_size"] - 2, c
assert "pad_token_id" not in c
print("ok")
PY
