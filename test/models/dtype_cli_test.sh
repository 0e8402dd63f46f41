#!/bin/bash
# `mammoth generate --dtype bf16|f16` on 16-bit Hugging Face directories that transformers
# wrote: the parameters stay 16-bit in memory (the allocator's peak falls against --dtype f32),
# the greedy continuation equals transformers' on the same weights widened to float32, and a
# dtype we cannot hold, or --dtype on train (f32 master weights), is refused by name.
set -euo pipefail
mammoth="$1"
python_sh="$2"
reference="$3"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/dtype_cli.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"
prompt=5,17,42,99
n=12

peak_mb() { sed -n 's/.*peak memory: \([0-9.]*\) MB (allocator).*/\1/p' "$1"; }
tokens() { sed -n 's/.*"tokens":\[\([0-9,]*\)\].*/\1/p' "$1"; }

for case in llama:bf16 gpt2:bf16 llama:f16; do
  family="${case%%:*}"
  dtype="${case##*:}"
  dir="$work/$family-$dtype"
  "$python_sh" "$reference" make "$dir" "$family" "$dtype"
  expected="$("$python_sh" "$reference" greedy "$dir" "$prompt" "$n")"
  for ours in f32 "$dtype"; do
    "$mammoth" generate --model "$dir" --prompt-tokens "$prompt" --max-new-tokens "$n" \
      --temperature 0 --threads 1 --dtype "$ours" >"$work/out" 2>"$work/err"
    got="$(tokens "$work/out")"
    echo "$family $dtype file, --dtype $ours: ours $got, transformers $expected," \
      "peak $(peak_mb "$work/err") MB"
    [[ "$got" == "$expected" ]] || { echo "FAIL: greedy ids differ"; cat "$work/err"; exit 1; }
    grep -q "in $ours (" "$work/err" || { echo "FAIL: parameters not $ours"; exit 1; }
    cp "$work/err" "$work/err.$ours"
  done
  f32="$(peak_mb "$work/err.f32")"
  half="$(peak_mb "$work/err.$dtype")"
  # Weights dominate these models (6 layers, no long sequence): 16-bit storage must save at
  # least a third of the peak (half the weights, less one layer's widened f32 copy).
  awk -v a="$half" -v b="$f32" 'BEGIN { exit !(a < 0.67 * b) }' ||
    { echo "FAIL: --dtype $dtype peak $half MB is not below 0.67 x f32's $f32 MB"; exit 1; }
done

# ViT (eval --images): the class token and position table widen too; on bf16-valued weights
# f32 and bf16 storage compute the same loss (only summation order may differ).
"$python_sh" "$reference" make "$work/vit" vit bf16
"$mammoth" data --synthetic-images 32 --image-size 32 --out "$work/images" >/dev/null 2>&1
for ours in f32 bf16; do
  "$mammoth" eval --model "$work/vit" --images "$work/images/images.bin" --threads 1 \
    --dtype "$ours" >"$work/vit.$ours" 2>"$work/err"
done
loss() { sed -n 's/.*"loss":\([-0-9.e]*\).*/\1/p' "$1"; }
echo "vit bf16 file: loss $(loss "$work/vit.f32") (--dtype f32), $(loss "$work/vit.bf16") (bf16)"
awk -v a="$(loss "$work/vit.f32")" -v b="$(loss "$work/vit.bf16")" \
  'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 1e-6 * a) }' ||
  { echo "FAIL: ViT losses differ"; exit 1; }

if "$mammoth" generate --model "$work/llama-bf16" --prompt-tokens 1 --dtype f64 2>"$work/err"; then
  echo "FAIL: --dtype f64 accepted"; exit 1
fi
grep -q -- "--dtype must be f32, bf16 or f16, got 'f64'" "$work/err"
# Training keeps f32 master weights: --dtype there is refused, not ignored.
if "$mammoth" train --steps 1 --dtype bf16 --threads 1 >"$work/out" 2>"$work/err"; then
  echo "FAIL: train --dtype bf16 accepted"; exit 1
fi
grep -q -- "\[train\] --dtype is for ckpt export, eval and generate" "$work/err"
echo "PASS"
