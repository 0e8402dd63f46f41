#!/bin/bash
# `mammoth train --model vit-tiny --images ...`: a generated, learnable image set (a square of
# each class's colour on noise, half PNG and half JPEG, written by image_tool with libpng and
# libjpeg-turbo) reaches >= 90% validation accuracy, in the log and the metrics file; a run
# resumed from its step-20 checkpoint gives the uninterrupted run's losses bitwise; dp 2, tp 2,
# sp 2 (Ulysses, ring), tp 2 split_gather and pp 2 match one process, and tp and pp checkpoints
# resume on one process; an image shard trains too; a corrupt or non-image file is refused naming it, and
# flags classification does not read are refused by name.
set -euo pipefail
mammoth="$1"
mpirun="$2"
image_tool="$3"
python_sh="$4"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_vit_images.XXXXXX")"
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/classify_checks.sh"

"$image_tool" folder "$work/images" 4 40 32 7
ls "$work/images/class_0" | grep -q '\.png$' || fail "no PNG files written"
ls "$work/images/class_0" | grep -q '\.jpg$' || fail "no JPEG files written"
# 160 images, 32 held out: 2 validation batches of 16 cover them all.
common=(--model vit-tiny --images "$work/images" --steps 40 --micro-batch 16 --lr 2e-3
  --warmup 5 --eval-every 20 --eval-batches 2 --val-fraction 0.2 --log-every 10 --threads 1)

"$mammoth" train "${common[@]}" --metrics "$work/full.jsonl" --save-every 20 \
  --save-dir "$work/ck" 2>"$work/full.log" || { cat "$work/full.log"; fail "training failed"; }
cat "$work/full.log"
grep -q "classes: 0 = class_0, 1 = class_1, 2 = class_2, 3 = class_3" "$work/full.log" ||
  fail "the class mapping is not printed"
grep -q '"class_0","class_1","class_2","class_3"' "$work/ck/labels.json" ||
  fail "labels.json does not hold the class names"
python3 - "$work/full.jsonl" "$work/full.log" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
acc = [r["val_accuracy"] for r in rows if "val_accuracy" in r]
assert [r["step"] for r in rows if "val_accuracy" in r] == [20, 40], rows
assert acc[-1] >= 0.9, f"validation accuracy {acc[-1]} < 0.9"
m = re.search(r"accuracy ([0-9.]+)", open(sys.argv[2]).read().split("[train] done:")[1])
assert m and abs(float(m.group(1)) - acc[-1]) < 1e-4, "the log's accuracy is not the metrics'"
print(f"validation accuracy {acc}")
PY

# Resume from the step-20 checkpoint: steps 21..40 bitwise those of the uninterrupted run.
resume_at "$work/ck" 20
"$mammoth" train "${common[@]}" --metrics "$work/resumed.jsonl" --save-dir "$work/ck_resume" \
  --resume 2>"$work/resumed.log" || { cat "$work/resumed.log"; fail "resume failed"; }
grep -q "resumed from $work/ck_resume/step_00000020 at step 20" "$work/resumed.log" ||
  fail "did not resume at step 20"
same_tail "$work/full.jsonl" "$work/resumed.jsonl" 21 40
# Another image set is not what the checkpoint continues.
"$image_tool" folder "$work/other" 4 30 32 8
if "$mammoth" train "${common[@]}" --images "$work/other" --save-dir "$work/ck_resume" --resume \
  2>"$work/other.log"; then fail "resumed on other images"; fi
grep -q "resume: the checkpoint was written with data" "$work/other.log" ||
  { cat "$work/other.log"; fail "resume on other images not refused by name"; }

# HF export of the trained classifier (mammoth ckpt export): transformers'
# ViTForImageClassification loads it and gives mammoth eval's loss on an image shard.
"$mammoth" data --synthetic-images 48 --image-classes 4 --image-size 32 --out "$work/evalset" \
  2>/dev/null
"$mammoth" ckpt export "$work/ck/step_00000040" --out "$work/hf" >/dev/null
"$mammoth" eval --model "$work/hf" --images "$work/evalset/images.bin" --threads 1 \
  2>/dev/null >"$work/eval.json"
bash "$python_sh" - "$work" <<'PY'
import json, sys
import numpy as np, torch
from transformers import ViTForImageClassification
work = sys.argv[1]
raw = open(f"{work}/evalset/images.bin", "rb").read()
h = np.frombuffer(raw[:1024], dtype="<i4")
n, c, hh, ww = (int(x) for x in h[2:6])
labels = np.frombuffer(raw[1024:1024 + 4 * n], dtype="<i4").astype(np.int64)
px = np.frombuffer(raw[1024 + 4 * n:], dtype=np.uint8).reshape(n, c, hh, ww)
x = torch.from_numpy((px.astype(np.float32) / 255.0 - 0.5) / 0.5)
model = ViTForImageClassification.from_pretrained(f"{work}/hf").eval()
with torch.no_grad():
    loss = torch.nn.functional.cross_entropy(model(pixel_values=x).logits,
                                             torch.from_numpy(labels)).item()
ours = json.load(open(f"{work}/eval.json"))["loss"]
rel = abs(loss - ours) / abs(ours)
print(f"HF export: transformers loss {loss:.6f}, mammoth eval {ours:.6f}, rel {rel:.2e}")
assert rel < 1e-5, rel
PY

# dp 2: each rank reads half of every global batch of 16; the curve is one process's.
one=(--model vit-tiny --images "$work/images" --steps 10 --micro-batch 8 --grad-accum 2 --lr 2e-3
  --warmup 2 --eval-every 0 --log-every 1 --threads 1)
"$mammoth" train "${one[@]}" --metrics "$work/dp1.jsonl" 2>/dev/null
bash "$mpirun" -np 2 "$mammoth" train "${one[@]}" --micro-batch 8 --grad-accum 1 \
  --metrics "$work/dp2.jsonl" 2>"$work/dp2.log" || { cat "$work/dp2.log"; fail "dp 2 failed"; }
same_curve "$work/dp1.jsonl" "$work/dp2.jsonl" 10
# ZeRO 1, 2 and 3 over the same dp 2, and a ZeRO-3 checkpoint resumed on one process.
zero_stages 10 5 "${one[@]}"

# tp 2, sp 2 (Ulysses, ring) and tp 2 with split_gather: ViT's policy form trains; the curve and
# the validation accuracy are one process's. A tp 2 checkpoint resumes under tp 2 bitwise and
# on one process within the layouts' rounding.
"$mammoth" train "${one[@]}" --eval-every 5 --eval-batches 1 --metrics "$work/one_eval.jsonl" \
  2>/dev/null
for layout in "--tp 2" "--sp 2 --sp-mode ulysses" "--sp 2 --sp-mode ring" \
  "--tp 2 --sp-mode split_gather"; do
  name=$(echo "$layout" | tr -d ' -')
  # shellcheck disable=SC2086
  bash "$mpirun" -np 2 "$mammoth" train "${one[@]}" $layout --eval-every 5 --eval-batches 1 \
    --save-every 5 --save-dir "$work/ck_$name" --metrics "$work/$name.jsonl" \
    2>"$work/$name.log" || { cat "$work/$name.log"; fail "$layout failed"; }
  same_curve "$work/one_eval.jsonl" "$work/$name.jsonl" 10
  python3 - "$work/one_eval.jsonl" "$work/$name.jsonl" <<'PY'
import json, sys
acc = [[r["val_accuracy"] for r in map(json.loads, open(f)) if "val_accuracy" in r]
       for f in sys.argv[1:]]
assert len(acc[0]) == 2 and acc[0] == acc[1], acc
PY
done
grep -q "tp / --sp: checkpoints carry no hf/ directory" "$work/tp2.log" ||
  { cat "$work/tp2.log"; fail "the missing hf/ directory under tp is not said"; }
resume_at "$work/ck_tp2" 5
bash "$mpirun" -np 2 "$mammoth" train "${one[@]}" --tp 2 --eval-every 5 --eval-batches 1 \
  --save-dir "$work/ck_tp2_resume" --resume --metrics "$work/tp2_resumed.jsonl" \
  2>"$work/tp2_resumed.log" || { cat "$work/tp2_resumed.log"; fail "tp 2 resume failed"; }
same_tail "$work/tp2.jsonl" "$work/tp2_resumed.jsonl" 6 10
# The tp 2 run's own step-5 checkpoint again (the resumed run above wrote its step 10 beside it).
mv "$work/ck_tp2_resume" "$work/ck_tp2_resumed_by_tp2"
resume_at "$work/ck_tp2" 5
"$mammoth" train "${one[@]}" --eval-every 5 --eval-batches 1 --save-dir "$work/ck_tp2_resume" \
  --resume --metrics "$work/tp2_on_one.jsonl" 2>"$work/tp2_on_one.log" ||
  { cat "$work/tp2_on_one.log"; fail "a tp 2 checkpoint did not resume on one process"; }
close_tail "$work/one_eval.jsonl" "$work/tp2_on_one.jsonl" 6 10

# pp 2: ViT's stages (a micro-batch is its pixels and labels in one row); the curve is one
# process's, and its step-10 checkpoint (each stage writes its own) resumes on one process.
bash "$mpirun" -np 2 "$mammoth" train "${one[@]}" --pp 2 --save-every 5 --save-dir "$work/ck_pp2" \
  --metrics "$work/pp2.jsonl" 2>"$work/pp2.log" || { cat "$work/pp2.log"; fail "pp 2 failed"; }
grep -q "pipeline stages (balanced): layers 0-0, 1-1" "$work/pp2.log" ||
  { cat "$work/pp2.log"; fail "not two pipeline stages"; }
same_curve "$work/dp1.jsonl" "$work/pp2.jsonl" 10
resume_at "$work/ck_pp2" 5
"$mammoth" train "${one[@]}" --save-dir "$work/ck_pp2_resume" --resume \
  --metrics "$work/pp2_on_one.jsonl" 2>"$work/pp2_on_one.log" ||
  { cat "$work/pp2_on_one.log"; fail "a pp 2 checkpoint did not resume on one process"; }
close_tail "$work/dp1.jsonl" "$work/pp2_on_one.jsonl" 6 10
# The sharded form has no stages yet: refused by name.
if bash "$mpirun" -np 4 "$mammoth" train "${one[@]}" --pp 2 --tp 2 >"$work/pptp.log" 2>&1; then
  fail "accepted --pp 2 --tp 2"
fi
grep -q "ViT classification with --pp and --tp / --sp" "$work/pptp.log" ||
  { cat "$work/pptp.log"; fail "--pp 2 --tp 2 not refused by name"; }

# An image shard (mammoth data --synthetic-images) trains through the same path.
"$mammoth" data --synthetic-images 64 --image-classes 4 --image-size 32 --out "$work/shard" \
  2>/dev/null
"$mammoth" train --model vit-tiny --images "$work/shard/images.bin" --steps 2 --micro-batch 8 \
  --eval-every 2 --eval-batches 1 --threads 1 2>"$work/shard.log" ||
  { cat "$work/shard.log"; fail "training on a shard failed"; }
grep -q "image shard $work/shard/images.bin: 64 images 3x32x32, 4 classes" "$work/shard.log" ||
  { cat "$work/shard.log"; fail "the shard was not read"; }

# Refused by name.
echo "not an image" >"$work/images/class_2/img_5.png"
refused "class_2/img_5.png is not a readable PNG file" --model vit-tiny --images "$work/images"
head -c 200 "$work/images/class_1/img_1.jpg" >"$work/images/class_1/img_3.jpg"
rm "$work/images/class_2/img_5.png"
refused "class_1/img_3.jpg is not a valid JPEG file" --model vit-tiny --images "$work/images"
rm "$work/images/class_1/img_3.jpg"
echo notes >"$work/images/class_3/notes.txt"
refused "class_3/notes.txt is not an image file" --model vit-tiny --images "$work/images"
rm "$work/images/class_3/notes.txt"
refused "is a ViT: it trains image classification, give --images" --model vit-tiny
refused "--images trains ViT image classification; --model gpt2-tiny is a gpt2 model" \
  --model gpt2-tiny --images "$work/images"
refused "--seq-len does not apply to --images" --model vit-tiny --images "$work/images" \
  --seq-len 16
refused "--data does not apply to classification" --model vit-tiny --images "$work/images" \
  --data "$work/x.bin"
refused "--train-file needs --task classify" --model gpt2-tiny --train-file "$work/x.jsonl"
echo PASS
