#!/bin/bash
# `mammoth train` and `mammoth eval` on Hugging Face directories: the first stderr lines say
# where the weights came from; a directory with no weights or with a missing shard fails before
# any step, naming the file; --fresh-init trains one from --seed; a sharded export (index +
# 2 shards, split here by hand) evaluates to the same loss as the single file.
set -euo pipefail
mammoth="$1"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/weights_cli.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"
py="${MAMMOTH_PYTHON:-/usr/bin/python3}"

for i in $(seq 1 300); do echo "the cat sat on the mat and the dog ran to the cat $i"; done >"$work/t.txt"
"$mammoth" data --out "$work/tok" --vocab-size 300 --quiet "$work/t.txt"
tokens="$work/tok/train_000000.bin"
train=(train --data "$work/tok" --steps 2 --seq-len 16 --micro-batch 2 --log-every 1
  --eval-every 0 --threads 1 --warmup 1)
evaluate=(eval --tokens "$tokens" --seq-len 16 --max-sequences 8)

# A trained gpt2-tiny exported as a HF directory (config.json + model.safetensors).
"$mammoth" "${train[@]}" --model gpt2-tiny --save-every 2 --save-dir "$work/ckpt" 2>"$work/err"
grep -q "\[model\] gpt2-tiny: weights: fresh initialisation (seed 1337)" "$work/err"
"$mammoth" ckpt export "$work/ckpt" --out "$work/hf" >/dev/null

# No weights: eval and train refuse, naming what they looked for; nothing is trained.
mkdir "$work/bare"
cp "$work/hf/config.json" "$work/bare/"
if "$mammoth" "${evaluate[@]}" --model "$work/bare" 2>"$work/err"; then
  echo "expected eval of a directory without weights to fail"; exit 1
fi
grep -q "has no weights: neither model.safetensors nor model.safetensors.index.json" "$work/err"
grep -q -- "--fresh-init" "$work/err"
if "$mammoth" "${train[@]}" --model "$work/bare" --metrics "$work/bare.jsonl" \
  --save-every 1 --save-dir "$work/bare_ckpt" >"$work/out" 2>"$work/err"; then
  echo "expected train of a directory without weights to fail"; exit 1
fi
grep -q "has no weights" "$work/err"
[[ ! -s "$work/bare.jsonl" && ! -e "$work/bare_ckpt/latest" ]] || {
  echo "a step ran without weights"; exit 1
}
"$mammoth" "${train[@]}" --model "$work/bare" --fresh-init --seed 7 --metrics "$work/fresh.jsonl" \
  2>"$work/err" >/dev/null
grep -q "weights: fresh initialisation (seed 7)" "$work/err"
[[ -s "$work/fresh.jsonl" ]]

# The same weights as 2 shards + model.safetensors.index.json (safetensors layout by hand).
mkdir "$work/sharded"
cp "$work/hf/config.json" "$work/sharded/"
"$py" - "$work/hf/model.safetensors" "$work/sharded" <<'PY'
import json, os, struct, sys
src, out = sys.argv[1], sys.argv[2]
raw = open(src, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
data = raw[8 + n:]
names = sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])
shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
          "model-00002-of-00002.safetensors": names[len(names) // 2:]}
weight_map = {}
for shard, part in shards.items():
    h, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for k in part:
        b, e = header[k]["data_offsets"]
        h[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"],
                "data_offsets": [off, off + e - b]}
        blobs.append(data[b:e])
        off += e - b
        weight_map[k] = shard
    hb = json.dumps(h).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(os.path.join(out, shard), "wb") as f:
        f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": len(data)}, "weight_map": weight_map}, f)
PY
single="$("$mammoth" "${evaluate[@]}" --model "$work/hf" 2>"$work/err")"
grep -q "weights: $work/hf/model.safetensors (" "$work/err"
sharded="$("$mammoth" "${evaluate[@]}" --model "$work/sharded" 2>"$work/err")"
grep -q "weights: $work/sharded/model.safetensors.index.json (2 shards, " "$work/err"
# --weights takes an index too.
via_flag="$("$mammoth" "${evaluate[@]}" --model gpt2-tiny \
  --weights "$work/sharded/model.safetensors.index.json" 2>/dev/null)"
echo "single $single sharded $sharded via --weights $via_flag"
[[ "$single" == "$sharded" && "$single" == "$via_flag" ]]

# A missing shard: both commands fail naming it, and no step runs.
rm "$work/sharded/model-00002-of-00002.safetensors"
if "$mammoth" "${evaluate[@]}" --model "$work/sharded" 2>"$work/err"; then
  echo "expected eval with a missing shard to fail"; exit 1
fi
grep -q "model-00002-of-00002.safetensors' does not exist" "$work/err"
if "$mammoth" "${train[@]}" --model "$work/sharded" --metrics "$work/missing.jsonl" \
  2>"$work/err" >/dev/null; then
  echo "expected train with a missing shard to fail"; exit 1
fi
grep -q "model-00002-of-00002.safetensors' does not exist" "$work/err"
[[ ! -s "$work/missing.jsonl" ]]
echo ok
