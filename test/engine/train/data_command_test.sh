#!/bin/bash
# `mammoth data` end to end: file, directory and glob inputs -> shards + vocab; reusing the
# written vocabulary reproduces the same shards; the shards train; bad inputs are clear errors.
set -euo pipefail
mammoth="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}/data_cmd"
rm -rf "$tmp" && mkdir -p "$tmp/texts/more"
fail() { echo "FAIL: $*" >&2; exit 1; }

# Three documents over three files; the text repeats so a small BPE finds merges.
for i in $(seq 1 40); do
  echo "The quick brown fox jumps over the lazy dog number $i. Über naïve café — 東京 $i."
done >"$tmp/texts/a.txt"
for i in $(seq 1 40); do echo "Pack my box with five dozen liquor jugs, round $i."; done \
  >"$tmp/texts/more/b.txt"
for i in $(seq 1 40); do echo "Sphinx of black quartz, judge my vow ($i)."; done \
  >"$tmp/texts/more/c.txt"

"$mammoth" data --out "$tmp/out1" --vocab-size 300 --val-fraction 0.1 --shard-size 1K \
  "$tmp/texts/a.txt" "$tmp/texts/more/*.txt" >"$tmp/log1" 2>&1 || { cat "$tmp/log1"; fail "data run 1"; }
cat "$tmp/log1"
grep -q "tokenized" "$tmp/log1" || fail "no progress line"
grep -q "3 documents" "$tmp/log1" || fail "expected 3 documents (a, b, c)"
for f in vocab.json merges.txt train_000000.bin val_000000.bin; do
  [[ -s "$tmp/out1/$f" ]] || fail "missing $f"
done
# --shard-size 1K must have split the training tokens into several files.
n_train=$(ls "$tmp/out1"/train_*.bin | wc -l)
(( n_train >= 2 )) || fail "expected several train shards, got $n_train"
# llm.c header: magic 20240520 as little-endian int32.
magic=$(od -An -t d4 -N 4 "$tmp/out1/train_000000.bin" | tr -d ' ')
[[ "$magic" == "20240520" ]] || fail "bad shard magic $magic"
# vocab.json has exactly --vocab-size entries (ids 0..299).
n_vocab=$(/usr/bin/python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))))' \
  "$tmp/out1/vocab.json")
[[ "$n_vocab" == "300" ]] || fail "vocab.json has $n_vocab entries, expected 300"

# Same inputs given as a directory (sorted: a.txt, more/ is skipped as not a regular file) and
# the files of more/, reusing the written vocabulary: identical shards.
cp "$tmp/out1/vocab.json" "$tmp/vocab.json"
cp "$tmp/out1/merges.txt" "$tmp/merges.txt"
"$mammoth" data --out "$tmp/out2" --vocab-json "$tmp/vocab.json" --merges "$tmp/merges.txt" \
  --val-fraction 0.1 --shard-size 1K --quiet "$tmp/texts" "$tmp/texts/more" >"$tmp/log2" 2>&1 \
  || { cat "$tmp/log2"; fail "data run 2"; }
if grep -q "tokenized" "$tmp/log2"; then fail "--quiet printed progress"; fi
for f in "$tmp/out1"/*.bin; do
  cmp "$f" "$tmp/out2/$(basename "$f")" || fail "$(basename "$f") differs with the reused vocab"
done
cmp "$tmp/out1/vocab.json" "$tmp/out2/vocab.json" || fail "vocab.json not copied unchanged"

# The shards train.
"$mammoth" train --data "$tmp/out1/train_*.bin" --val-data "$tmp/out1/val_*.bin" --steps 2 \
  --micro-batch 2 --seq-len 16 --eval-every 0 --threads 1 --warmup 1 >"$tmp/log3" 2>&1 \
  || { cat "$tmp/log3"; fail "train on the written shards"; }

# Errors name the problem.
expect_error() {
  local want="$1"; shift
  if "$mammoth" data "$@" >"$tmp/err" 2>&1; then fail "expected an error for: $*"; fi
  grep -q -- "$want" "$tmp/err" || { cat "$tmp/err"; fail "error lacks '$want'"; }
}
expect_error "matches no file" --out "$tmp/out3" "$tmp/nope/*.txt"
expect_error "--out DIR is required" "$tmp/texts/a.txt"
expect_error "--merges" --out "$tmp/out3" --vocab-json "$tmp/vocab.json" "$tmp/texts/a.txt"
expect_error "shard-size" --out "$tmp/out3" --shard-size 12X "$tmp/texts/a.txt"
echo "PASS"
