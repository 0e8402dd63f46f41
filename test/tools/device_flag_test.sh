#!/bin/bash
# `--device` through the mammoth binary: on a machine without a usable CUDA device (CI),
# `--device cuda` is a clear error naming the reason (not a crash), `--device auto` falls back to
# the CPU and says so, `--device cpu` trains on the CPU, and a bad value is refused. eval and
# generate share the set-up. Where a CUDA device is usable, cuda and auto must report it instead.
set -uo pipefail
mammoth="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}/device_flag"
rm -rf "$tmp" && mkdir -p "$tmp/texts"
fail() { echo "FAIL: $*" >&2; exit 1; }

for i in $(seq 1 60); do
  echo "The quick brown fox jumps over the lazy dog, line $i. Pack my box with five dozen jugs."
done >"$tmp/texts/a.txt"
"$mammoth" data --out "$tmp/data" --vocab-size 300 --val-fraction 0.1 "$tmp/texts/a.txt" \
  >"$tmp/data.log" 2>&1 || { cat "$tmp/data.log"; fail "mammoth data"; }
train=(train --data "$tmp/data/train_000000.bin" --val-data "$tmp/data/val_000000.bin"
  --model gpt2-tiny --steps 2 --seq-len 16 --micro-batch 2 --eval-every 0 --threads 1)

# --device cuda
"$mammoth" "${train[@]}" --device cuda >"$tmp/cuda.log" 2>&1
rc=$?
cat "$tmp/cuda.log"
if grep -q "^\[train\] device: cuda:" "$tmp/cuda.log"; then
  cuda=1
  [[ $rc -eq 0 ]] || fail "--device cuda found a device but the run failed (exit $rc)"
else
  cuda=0
  # A mammoth::Error exits 1 with the message; a crash would be a signal (>= 128).
  [[ $rc -eq 1 ]] || fail "--device cuda without a device: expected exit 1, got $rc"
  grep -q "\[train\] --device cuda: no usable CUDA device: ..*" "$tmp/cuda.log" ||
    grep -q "\[train\] --device cuda: this build has no CUDA backend" "$tmp/cuda.log" ||
    fail "--device cuda: no clear error naming the reason"
  grep -q "^step " "$tmp/cuda.log" && fail "--device cuda without a device must not train"
fi

# --device auto (the default): the CPU, saying why, unless a device is usable.
"$mammoth" "${train[@]}" >"$tmp/auto.log" 2>&1 || { cat "$tmp/auto.log"; fail "--device auto"; }
cat "$tmp/auto.log"
if [[ $cuda -eq 1 ]]; then
  grep -q "^\[train\] device: cuda:[0-9]* (auto: CUDA device" "$tmp/auto.log" ||
    fail "--device auto did not pick the usable CUDA device"
else
  grep -q "^\[train\] device: cpu (auto: no CUDA device (..*))" "$tmp/auto.log" ||
    grep -q "^\[train\] device: cpu (auto: this build has no CUDA backend; CPU kernels ..*)" "$tmp/auto.log" ||
    fail "--device auto did not report falling back to the CPU with the reason"
fi
grep -q "^step     2/2" "$tmp/auto.log" || fail "--device auto did not train 2 steps"

# --device cpu
"$mammoth" "${train[@]}" --device cpu >"$tmp/cpu.log" 2>&1 || { cat "$tmp/cpu.log"; fail "--device cpu"; }
grep -q "^\[train\] device: cpu (--device cpu; CPU kernels [a-z0-9]* (..*))" "$tmp/cpu.log" ||
  fail "--device cpu not reported with the CPU kernels' ISA"
# The same run on the same device: the same losses as auto's when auto chose the CPU.
if [[ $cuda -eq 0 ]]; then
  diff <(grep -o "loss [0-9.]*" "$tmp/auto.log") <(grep -o "loss [0-9.]*" "$tmp/cpu.log") ||
    fail "--device auto (CPU) and --device cpu trained differently"
fi

# A bad value.
"$mammoth" "${train[@]}" --device gpu >"$tmp/bad.log" 2>&1 && fail "--device gpu was accepted"
grep -q "\-\-device must be auto, cpu or cuda, got 'gpu'" "$tmp/bad.log" || {
  cat "$tmp/bad.log"
  fail "--device gpu: no clear error"
}

# generate shares the set-up: stdout stays the JSON result, the device line goes to stderr.
"$mammoth" generate --model gpt2-tiny --prompt-tokens 1,2,3 --max-new-tokens 2 --device auto \
  >"$tmp/gen.out" 2>"$tmp/gen.err" || { cat "$tmp/gen.err"; fail "generate --device auto"; }
grep -q '"tokens"' "$tmp/gen.out" || fail "generate printed no tokens"
grep -q "^\[generate\] device: " "$tmp/gen.err" || fail "generate did not report its device"
if [[ $cuda -eq 0 ]]; then
  "$mammoth" generate --model gpt2-tiny --prompt-tokens 1,2,3 --device cuda >"$tmp/gen2.out" \
    2>"$tmp/gen2.err" && fail "generate --device cuda without a device succeeded"
  grep -q "\[generate\] --device cuda: " "$tmp/gen2.err" || fail "generate --device cuda: no clear error"
fi
echo "PASS (cuda usable: $cuda)"
