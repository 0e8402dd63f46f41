#!/bin/bash
# `mammoth train --model bert-tiny --task classify --train-file ...`: a generated, learnable text
# task (label = whether the word "good" occurs, as names pos / neg) tokenized with a WordPiece
# vocab.txt reaches >= 90% validation accuracy; our WordPiece ids equal transformers'
# BertTokenizer's on the same vocabulary; a run resumed from its step-20 checkpoint gives the
# uninterrupted run's losses bitwise; a checkpoint's hf/ directory loads in transformers'
# BertForSequenceClassification with the same validation loss; dp 2, tp 2 and tp 2 split_gather
# and sp 2 (Ulysses, ring) match one process, so does pp 2, tp and pp checkpoints resume on one
# process, pp x tp is refused; rows given as ids (TSV, integer labels) train too; bad columns, labels and ids are
# refused by name.
set -euo pipefail
mammoth="$1"
mpirun="$2"
wordpiece_tool="$3"
python_sh="$4"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_bert_classify.XXXXXX")"
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/classify_checks.sh"
refused_bert() {  # refused for a bert-tiny --task classify run
  local pattern="$1"
  shift
  refused "$pattern" --model bert-tiny --task classify "$@"
}

# bert-tiny's special ids: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4.
mkdir -p "$work/vocab"
python3 - "$work" <<'PY'
import json, random, sys
work = sys.argv[1]
words = ["the", "a", "movie", "film", "was", "is", "good", "bad", "plot", "actor", "play",
         "##ing", "##ed", "##s", "story", "long", "short", "very", "not", "and", "it", "!", ",",
         ".", "?", "fun", "##ny", "dull", "scene", "music"]
vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
open(f"{work}/vocab/vocab.txt", "w").write("\n".join(vocab) + "\n")
json.dump({"do_lower_case": True, "tokenizer_class": "BertTokenizer"},
          open(f"{work}/vocab/tokenizer_config.json", "w"))
plain = ["the", "a", "movie", "film", "was", "is", "bad", "plot", "actor", "playing", "played",
         "plays", "story", "long", "short", "very", "not", "and", "it", "funny", "dull", "scene",
         "music", "fun", "Movie", "FILM", "zebra"]
rng = random.Random(5)
def rows(n):
    out = []
    for i in range(n):
        ws = [rng.choice(plain) for _ in range(rng.randint(4, 10))]
        pos = i % 2 == 0
        if pos:
            ws.insert(rng.randint(0, len(ws)), rng.choice(["good", "Good", "GOOD"]))
        text = " ".join(ws) + rng.choice(["!", ".", " ?", ",ok"])
        out.append({"text": text, "label": "pos" if pos else "neg"})
    return out
with open(f"{work}/train.jsonl", "w") as f:
    for r in rows(240):
        f.write(json.dumps(r) + "\n")
with open(f"{work}/texts.txt", "w") as f:
    for r in rows(40):
        f.write(r["text"] + "\n")
    f.write("Hello, WORLD!! playing\tthe   long-story...\n")
    f.write("x" * 120 + " unaffable " + "\x07" + "fun\n")
PY

# Our WordPiece against transformers' BertTokenizer on the same vocab.txt.
"$wordpiece_tool" "$work/vocab" <"$work/texts.txt" >"$work/ours.txt"
bash "$python_sh" - "$work" <<'PY'
import sys
from transformers import BertTokenizer
work = sys.argv[1]
tok = BertTokenizer(f"{work}/vocab/vocab.txt", do_lower_case=True)
texts = open(f"{work}/texts.txt").read().split("\n")[:-1]
ours = open(f"{work}/ours.txt").read().split("\n")[:-1]
assert len(texts) == len(ours), (len(texts), len(ours))
for t, o in zip(texts, ours):
    ref = tok.encode(t, add_special_tokens=False)
    got = [int(x) for x in o.split()]
    assert got == ref, f"{t!r}: ours {got}, BertTokenizer {ref}"
print(f"WordPiece: {len(texts)} texts encode as BertTokenizer encodes them")
PY

common=(--model bert-tiny --task classify --train-file "$work/train.jsonl" --tokenizer "$work/vocab"
  --seq-len 16 --steps 40 --micro-batch 16 --lr 2e-3 --warmup 5 --eval-every 20 --eval-batches 3
  --val-fraction 0.2 --log-every 10 --threads 1)
"$mammoth" train "${common[@]}" --metrics "$work/full.jsonl" --save-every 20 \
  --save-dir "$work/ck" 2>"$work/full.log" || { cat "$work/full.log"; fail "training failed"; }
cat "$work/full.log"
grep -q "classes: 0 = neg, 1 = pos" "$work/full.log" || fail "the label mapping is not printed"
grep -q '\["neg","pos"\]' "$work/ck/labels.json" || fail "labels.json does not hold the labels"
accuracy_at_least "$work/full.jsonl" 0.9

resume_at "$work/ck" 20
"$mammoth" train "${common[@]}" --metrics "$work/resumed.jsonl" --save-dir "$work/ck_resume" \
  --resume 2>"$work/resumed.log" || { cat "$work/resumed.log"; fail "resume failed"; }
same_tail "$work/full.jsonl" "$work/resumed.jsonl" 21 40

# Each checkpoint's hf/ directory: transformers' BertForSequenceClassification loads it and,
# on --val-file's rows encoded by BertTokenizer (truncated and padded to 16), gives the loss the
# run's last evaluation measured on the same rows (3 batches of 16 in file order).
head -192 "$work/train.jsonl" >"$work/train192.jsonl"
tail -48 "$work/train.jsonl" >"$work/val48.jsonl"
"$mammoth" train "${common[@]}" --train-file "$work/train192.jsonl" --val-file "$work/val48.jsonl" \
  --metrics "$work/hfrun.jsonl" --save-dir "$work/ck_hf" 2>/dev/null
# `ckpt export` writes the same directory from the checkpoint alone (what --zero 3 runs use).
"$mammoth" ckpt export "$work/ck_hf" --out "$work/exported" >"$work/export.log" 2>&1 ||
  { cat "$work/export.log"; fail "ckpt export of a classifier checkpoint failed"; }
bash "$python_sh" - "$work" <<'PY'
import json, sys
import torch
from transformers import BertForSequenceClassification, BertTokenizer
work = sys.argv[1]
rows = [json.loads(l) for l in open(f"{work}/val48.jsonl")]
tok = BertTokenizer(f"{work}/vocab/vocab.txt", do_lower_case=True)
enc = tok([r["text"] for r in rows], truncation=True, max_length=16, padding="max_length",
          return_tensors="pt")
labels = torch.tensor([["neg", "pos"].index(r["label"]) for r in rows])
ours = [json.loads(l) for l in open(f"{work}/hfrun.jsonl")][-1]["val_loss"]
for where in ("ck_hf/step_00000040/hf", "exported"):
    model, info = BertForSequenceClassification.from_pretrained(f"{work}/{where}",
                                                                output_loading_info=True)
    assert not any(info.values()), (where, info)  # no missing, unexpected or mismatched keys
    assert model.config.id2label == {0: "neg", 1: "pos"}, (where, model.config.id2label)
    assert model.config.label2id == {"neg": 0, "pos": 1}, (where, model.config.label2id)
    with torch.no_grad():
        logits = model.eval()(input_ids=enc["input_ids"],
                              attention_mask=enc["attention_mask"]).logits
    loss = torch.nn.functional.cross_entropy(logits, labels).item()
    rel = abs(loss - ours) / abs(ours)
    print(f"{where}: transformers loss {loss:.6f}, mammoth validation {ours:.6f}, rel {rel:.2e}")
    assert rel < 1e-5, rel
PY

# dp 2: each rank reads half of every global batch of 16; the curve is one process's.
one=(--model bert-tiny --task classify --train-file "$work/train.jsonl" --tokenizer "$work/vocab"
  --seq-len 16 --steps 8 --micro-batch 8 --grad-accum 2 --lr 2e-3 --warmup 2 --eval-every 0
  --log-every 1 --threads 1)
"$mammoth" train "${one[@]}" --metrics "$work/dp1.jsonl" 2>/dev/null
bash "$mpirun" -np 2 "$mammoth" train "${one[@]}" --grad-accum 1 --metrics "$work/dp2.jsonl" \
  2>"$work/dp2.log" || { cat "$work/dp2.log"; fail "dp 2 failed"; }
same_curve "$work/dp1.jsonl" "$work/dp2.jsonl" 8
# ZeRO 1, 2 and 3 over the same dp 2, and a ZeRO-3 checkpoint resumed on one process.
zero_stages 8 4 "${one[@]}"
# tp 2, with and without split_gather, and sp 2 under Ulysses and ring (padded rows masked as
# keys in each): the curve and the validation accuracy are one process's; a tp 2 checkpoint
# resumes on one process.
ev=(--eval-every 4 --eval-batches 1 --val-fraction 0.2)
"$mammoth" train "${one[@]}" "${ev[@]}" --metrics "$work/one_ev.jsonl" 2>/dev/null
for layout in "--tp 2" "--tp 2 --sp-mode split_gather" "--sp 2 --sp-mode ulysses" \
  "--sp 2 --sp-mode ring"; do
  name=$(echo "$layout" | tr -d ' -')
  shape="tp2"
  [[ "$layout" == --sp* ]] && shape="tp1 sp2"
  # shellcheck disable=SC2086
  bash "$mpirun" -np 2 "$mammoth" train "${one[@]}" "${ev[@]}" $layout --save-every 4 \
    --save-dir "$work/ck_$name" --metrics "$work/$name.jsonl" 2>"$work/$name.log" ||
    { cat "$work/$name.log"; fail "$layout failed"; }
  grep -q "plan: dp1 pp1 $shape" "$work/$name.log" || { cat "$work/$name.log"; fail "not $shape"; }
  same_curve "$work/one_ev.jsonl" "$work/$name.jsonl" 8
  python3 - "$work/one_ev.jsonl" "$work/$name.jsonl" <<'PY'
import json, sys
acc = [[r["val_accuracy"] for r in map(json.loads, open(f)) if "val_accuracy" in r]
       for f in sys.argv[1:]]
assert len(acc[0]) == 2 and acc[0] == acc[1], acc
PY
done
resume_at "$work/ck_tp2" 4
"$mammoth" train "${one[@]}" "${ev[@]}" --save-dir "$work/ck_tp2_resume" --resume \
  --metrics "$work/tp2_on_one.jsonl" 2>"$work/tp2_on_one.log" ||
  { cat "$work/tp2_on_one.log"; fail "a tp 2 checkpoint did not resume on one process"; }
close_tail "$work/one_ev.jsonl" "$work/tp2_on_one.jsonl" 5 8
# pp 2: BERT's stages (a micro-batch row holds the ids, their attention mask and the label);
# the curve is one process's, a pp 2 checkpoint resumes on one process, pp x tp is refused.
bash "$mpirun" -np 2 "$mammoth" train "${one[@]}" --pp 2 --save-every 4 --save-dir "$work/ck_pp2" \
  --metrics "$work/pp2.jsonl" 2>"$work/pp2.log" || { cat "$work/pp2.log"; fail "pp 2 failed"; }
grep -q "pipeline stages (balanced): layers 0-0, 1-1" "$work/pp2.log" ||
  { cat "$work/pp2.log"; fail "not two pipeline stages"; }
same_curve "$work/dp1.jsonl" "$work/pp2.jsonl" 8
resume_at "$work/ck_pp2" 4
"$mammoth" train "${one[@]}" --save-dir "$work/ck_pp2_resume" --resume \
  --metrics "$work/pp2_on_one.jsonl" 2>"$work/pp2_on_one.log" ||
  { cat "$work/pp2_on_one.log"; fail "a pp 2 checkpoint did not resume on one process"; }
close_tail "$work/dp1.jsonl" "$work/pp2_on_one.jsonl" 5 8
if bash "$mpirun" -np 4 "$mammoth" train "${one[@]}" --pp 2 --tp 2 >"$work/pptp.log" 2>&1; then
  fail "accepted --pp 2 --tp 2"
fi
grep -q "BERT classification with --pp and --tp / --sp" "$work/pptp.log" ||
  { cat "$work/pptp.log"; fail "--pp 2 --tp 2 not refused by name"; }

# Rows of ids (TSV, integer labels), with a separate validation file.
printf 'label\tids\n' >"$work/ids.tsv"
for i in $(seq 1 40); do printf '%d\t2 %d 9 3\n' $((i % 2)) $((10 + i % 2)) >>"$work/ids.tsv"; done
head -9 "$work/ids.tsv" >"$work/ids_val.tsv"
"$mammoth" train --model bert-tiny --task classify --train-file "$work/ids.tsv" \
  --val-file "$work/ids_val.tsv" --seq-len 8 --steps 30 --micro-batch 8 --lr 3e-3 --warmup 3 \
  --eval-every 30 --eval-batches 1 --threads 1 2>"$work/ids.log" ||
  { cat "$work/ids.log"; fail "ids rows failed"; }
grep -q "accuracy 1.0000" "$work/ids.log" || { cat "$work/ids.log"; fail "ids task not learnt"; }

echo '{"text": "good", "label": "pos", "weight": 2}' >"$work/bad.jsonl"
refused_bert 'unknown key "weight"' --train-file "$work/bad.jsonl" --tokenizer "$work/vocab"
echo '{"text": "good"}' >"$work/bad.jsonl"
refused_bert 'line 1: no "label"' --train-file "$work/bad.jsonl" --tokenizer "$work/vocab"
printf 'sentence\tlabel\nx\t1\n' >"$work/bad.tsv"
refused_bert "unknown column 'sentence'" --train-file "$work/bad.tsv"
refused_bert "gives text, but there is no WordPiece vocabulary" --train-file "$work/train.jsonl"
printf 'ids\tlabel\n2 0 3\t1\n2 5 3\t0\n' >"$work/bad.tsv"
refused_bert "id 0 is the padding id inside the row" --train-file "$work/bad.tsv"
printf 'ids\tlabel\n2 999 3\t1\n2 5 3\t0\n' >"$work/bad.tsv"
refused_bert "id 999 is outside the model's 512-token vocabulary" --train-file "$work/bad.tsv"
printf 'label\tids\n7\t2 5 3\n' >"$work/val.tsv"
refused_bert "label '7' is not one of the training file's classes" --train-file "$work/ids.tsv" \
  --val-file "$work/val.tsv"
refused_bert "--task classify needs --train-file"
refused_bert "--task classify is BERT's" --train-file "$work/ids.tsv" --images "$work"
printf 'text\tlabel\ncaf\xe9\t1\n' >"$work/bad.tsv"  # Latin-1, not UTF-8
refused_bert "byte 3 is not valid UTF-8" --train-file "$work/bad.tsv" --tokenizer "$work/vocab"
echo PASS
