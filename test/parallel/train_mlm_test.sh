#!/bin/bash
# `mammoth train --model bert-tiny` trains masked-LM (engine/data/masking.h). Reads the batches
# the model is fed (--dump-batches) and checks the rule on them: per window round(15% of 64) =
# 10 chosen positions, labels -100 elsewhere, the label at a chosen position the original token
# at that position (not the next one), and the inputs there [MASK] / random / unchanged in
# 80/10/10 proportion (binomial tolerances); and that the same seed gives the same global batch
# under dp 1/2/4, gradient accumulation, tp 2, sp 2 (ring), dp 2 x tp 2, pp 2 and a resumed run, and
# the same loss curve (every window has 10 predictions, so micro-batch means weigh equally).
set -euo pipefail
mammoth="$1"
mpirun="$2"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/train_mlm.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"
py="${MAMMOTH_PYTHON:-/usr/bin/python3}"

# The repetitive stream of test/testing/token_data.h shifted past bert-tiny's special ids 0-4:
# (i * 7 + i / 31) % 48 + 5, 40000 tokens (624 windows of 64: the statistics run reads 320 of
# them, each once).
# The layout runs read 4000 tokens: 59 training windows, so 9 steps of 8 cross into the second
# epoch (step 8 straddles the two), where the masks are drawn anew.
"$py" - "$work" <<'PY'
import struct, sys
for name, n in [("data", 40000), ("small", 4000)]:
    tokens = [(i * 7 + i // 31) % 48 + 5 for i in range(n)]
    with open(f"{sys.argv[1]}/{name}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *tokens))
PY

common=(--model bert-tiny --seq-len 64 --log-every 100 --eval-every 0 --lr 1e-3 --warmup 1
  --schedule constant --threads 1)  # constant: a 5-step run schedules as the 9-step one
# Statistics: 10 steps of 32 windows.
"$mammoth" train "${common[@]}" --data "$work/data.bin" --steps 10 --micro-batch 32 \
  --dump-batches "$work/stats"
# Layouts: 9 steps of a global batch of 8 windows.
layout=("${common[@]}" --data "$work/small.bin" --steps 9)
"$mammoth" train "${layout[@]}" --micro-batch 8 --dump-batches "$work/single" \
  --metrics "$work/single.jsonl"
# Resumed at step 5 (the masks hold no state: the window, its epoch and the seed give them).
"$mammoth" train "${layout[@]}" --steps 5 --micro-batch 8 --save-dir "$work/ckpt" \
  --dump-batches "$work/resumed_a"
"$mammoth" train "${layout[@]}" --micro-batch 8 --save-dir "$work/ckpt" --resume \
  --dump-batches "$work/resumed_b" --metrics "$work/resumed.jsonl"
"$mammoth" train "${layout[@]}" --micro-batch 2 --grad-accum 4 --dump-batches "$work/accum4" \
  --metrics "$work/accum4.jsonl"
bash "$mpirun" -np 2 "$mammoth" train "${layout[@]}" --micro-batch 4 --dump-batches "$work/dp2" \
  --metrics "$work/dp2.jsonl"
bash "$mpirun" -np 4 "$mammoth" train "${layout[@]}" --micro-batch 2 --dump-batches "$work/dp4" \
  --metrics "$work/dp4.jsonl"
bash "$mpirun" -np 2 "$mammoth" train "${layout[@]}" --micro-batch 8 --tp 2 \
  --dump-batches "$work/tp2" --metrics "$work/tp2.jsonl"
bash "$mpirun" -np 2 "$mammoth" train "${layout[@]}" --micro-batch 8 --sp 2 --sp-mode ring \
  --dump-batches "$work/sp2" --metrics "$work/sp2.jsonl"
bash "$mpirun" -np 4 "$mammoth" train "${layout[@]}" --micro-batch 4 --tp 2 \
  --dump-batches "$work/dp2tp2" --metrics "$work/dp2tp2.jsonl"
# Pipeline stages: 4 micro-batches of 2 windows through 2 stages (1F1B). A stage is fed the
# micro-batch as one [B, 2T] row of ids and targets, not through the loss --dump-batches taps,
# so only its curve is compared.
bash "$mpirun" -np 2 "$mammoth" train "${layout[@]}" --micro-batch 2 --grad-accum 4 --pp 2 \
  --metrics "$work/pp2.jsonl"

PYTHONPATH="$(dirname "$0")/../testing" "$py" - "$work" <<'PY'
import curves, glob, json, math, struct, sys
work = sys.argv[1]
T, IGNORE, MASK, SPECIAL, VOCAB = 64, -100, 4, {0, 1, 2, 3, 4}, 512
with open(f"{work}/data.bin", "rb") as f:
    f.read(1024)
    data = list(struct.unpack("<40000H", f.read()))
windows = {tuple(data[w * T:(w + 1) * T]): w for w in range(len(data) // T)}

def batches(path):
    """The micro-batches a rank was fed, in order: (coords, [rows of (input, target)])."""
    out = []
    for line in open(path):
        b = json.loads(line)
        B, n = b["shape"]
        assert n == T
        rows = [(b["input"][r * T:(r + 1) * T], b["target"][r * T:(r + 1) * T]) for r in range(B)]
        out.append(((b["dp"], b["tp"], b["sp"]), rows))
    return out

# The rule, on 320 windows.
rows = [r for _, rs in batches(f"{work}/stats") for r in rs]
assert len(rows) == 320, len(rows)
chosen = masked = randomised = kept = 0
for inp, tgt in rows:
    pos = [i for i in range(T) if tgt[i] != IGNORE]
    assert len(pos) == 10, pos  # round(0.15 * 64); the stream holds no special token
    original = [tgt[i] if tgt[i] != IGNORE else inp[i] for i in range(T)]
    # The labels restore a window of the file exactly: each is the token at its own position
    # (the stream's next token always differs from the current one, so next-token labels
    # would restore nothing).
    w = windows.get(tuple(original))
    assert w is not None, "labels are not the original tokens at their positions"
    for i in pos:
        chosen += 1
        if inp[i] == MASK:
            masked += 1
        elif inp[i] == tgt[i]:
            kept += 1
        else:
            assert inp[i] not in SPECIAL and 0 <= inp[i] < VOCAB, inp[i]
            randomised += 1
# A random replacement equals the original with probability 1/507 (507 ordinary ids).
for what, n, p in [("[MASK]", masked, 0.8), ("random", randomised, 0.1 * 506 / 507),
                   ("unchanged", kept, 0.1 + 0.1 / 507)]:
    mean, sd = chosen * p, math.sqrt(chosen * p * (1 - p))
    print(f"{what}: {n} of {chosen} (expected {mean:.1f} +- 5 x {sd:.1f})")
    assert abs(n - mean) <= 5 * sd, (what, n, mean, sd)

# Layouts: the global batch of each step, dp shares concatenated in dp order.
STEPS = 9

def global_batches(name, accum=1, steps=STEPS):
    per_dp = {}
    for path in glob.glob(f"{work}/{name}") + glob.glob(f"{work}/{name}.rank*"):
        fed = batches(path)
        coords = fed[0][0]
        steps_fed = [sum((rs for _, rs in fed[s * accum:(s + 1) * accum]), []) for s in range(steps)]
        assert len(fed) == steps * accum, (path, len(fed))
        if coords[0] in per_dp:
            assert per_dp[coords[0]] == steps_fed, f"{path}: tp/sp ranks of one replica differ"
        per_dp[coords[0]] = steps_fed
    return [sum((per_dp[d][s] for d in sorted(per_dp)), []) for s in range(steps)]

single = global_batches("single")
assert all(len(b) == 8 for b in single)
for name, accum in [("accum4", 4), ("dp2", 1), ("dp4", 1), ("tp2", 1), ("sp2", 1), ("dp2tp2", 1)]:
    assert global_batches(name, accum) == single, f"{name} is fed other batches than one process"
    print(f"{name}: the single-process batches")
    if name != "accum4":
        curves.Runs(work).matches(name, "single", tol=1e-4)
curves.Runs(work).matches("accum4", "single", tol=1e-5)
curves.Runs(work).matches("pp2", "single", tol=1e-5)
resumed = global_batches("resumed_a", steps=5) + global_batches("resumed_b", steps=STEPS - 5)
assert resumed == single, "a resumed run is fed other batches"
print("resumed at step 5: the single-process batches")
curves.Runs(work).matches("resumed", "single", tol=1e-6, steps=[6, 7, 8, 9])
# Epoch 1 masks anew: a window read in both epochs (same tokens) is masked differently.
rows = [r for b in single for r in b]
first = {}
for k, (inp, tgt) in enumerate(rows):
    key = tuple(tgt[i] if tgt[i] != IGNORE else inp[i] for i in range(T))
    first.setdefault(key, []).append((k, tgt))
pairs = [(a, b) for v in first.values() for a, b in zip(v, v[1:]) if b[0] >= 59 > a[0]]
assert pairs and all(a[1] != b[1] for a, b in pairs), "epoch 1 repeats epoch 0's masks"
print("ok")
PY
