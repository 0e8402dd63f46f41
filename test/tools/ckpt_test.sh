#!/bin/bash
# `mammoth ckpt inspect / verify / convert` on checkpoints of every layout a run writes (one
# process, dp 2, ZeRO-3 dp 2, tp 2, pp 2, sp 2 (Ulysses), dp 2 with host offload):
#   1. inspect names the form, step, model, layout, files and every tensor;
#   2. convert --to single and back --to sharded --shards 3 keeps every tensor bitwise: checked
#      by a second reader (Python, reassembling the shards' "<tensor>@<offset>" pieces from the
#      raw safetensors bytes, not through our loader) against the source;
#   3. a converted checkpoint resumes training (one process from dp 2's, in a --save-dir);
#   4. verify passes on good checkpoints and, exit 1, names the file and the damaged tensor of a
#      flipped byte, a damaged header and a truncated file;
#   5. --to hf writes a model directory; bad --to / --shards are refused by name.
set -euo pipefail
mammoth="$1"
mpirun="$2"
py="${MAMMOTH_PYTHON:-/usr/bin/python3}"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/ckpt.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export HOME="$work/home"  # the embedded corpus is tokenized into $HOME/.cache
fail() { echo "FAIL: $*" >&2; exit 1; }
common=(--steps 2 --log-every 1 --eval-every 0 --warmup 1 --threads 1 --seq-len 32
  --micro-batch 2 --save-every 2)

declare -A layouts=([np1]="" [dp2]="--dp 2" [zero3]="--dp 2 --zero 3" [tp2]="--tp 2"
  [pp2]="--pp 2" [sp2]="--sp 2 --sp-mode ulysses" [offload]="--dp 2 --offload host --chunk-mb 0.25")
all=(np1 dp2 zero3 tp2 pp2 sp2 offload)
for name in "${all[@]}"; do
  # shellcheck disable=SC2086
  if [[ "$name" == np1 ]]; then
    "$mammoth" train "${common[@]}" --save-dir "$work/$name" >"$work/$name.log" 2>&1 ||
      { cat "$work/$name.log"; fail "train $name"; }
  else
    bash "$mpirun" -np 2 "$mammoth" train "${common[@]}" ${layouts[$name]} \
      --save-dir "$work/$name" >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "train $name"; }
  fi
done

# 1. inspect
"$mammoth" ckpt inspect "$work/zero3" >"$work/inspect.txt"
cat "$work/inspect.txt" | head -12
for want in "form    sharded (mammoth-sharded-checkpoint-1)" "step    2" "model   gpt2-tiny" \
  '"zero":3' "shard_00001.safetensors" "h.0.attn.c_attn.weight.exp_avg_sq " "[384, 128]"; do
  grep -qF -- "$want" "$work/inspect.txt" || fail "inspect: no '$want'"
done
grep -q "form    single" <<<"$("$mammoth" ckpt inspect "$work/np1")" || fail "inspect np1: not single"
"$mammoth" ckpt inspect --json "$work/pp2" >"$work/inspect.json"
"$py" - "$work/inspect.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["form"] == "sharded" and d["step"] == 2 and d["layout"]["pp"] == 2, d["layout"]
t = d["tensors"]["wte.weight"]
assert t["dtype"] == "f32" and t["bytes"] == 4 * t["shape"][0] * t["shape"][1], t
PY

# 2. convert round trips, checked by an independent reader.
for name in "${all[@]}"; do
  "$mammoth" ckpt convert "$work/$name" --to single --out "$work/$name.single"
  "$mammoth" ckpt convert "$work/$name.single" --to sharded --shards 3 --out "$work/$name.sharded"
  "$mammoth" ckpt verify "$work/$name.single" >/dev/null
  "$mammoth" ckpt verify "$work/$name.sharded" >/dev/null
  grep -q "shard_00002.safetensors" <<<"$("$mammoth" ckpt inspect "$work/$name.sharded")" ||
    fail "$name: no third shard"
  "$py" - "$work/$name/step_00000002" "$work/$name.single/step_00000002" \
    "$work/$name.sharded/step_00000002" <<'PY'
import json, os, struct, sys
SIZE = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4}

def safetensors(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}

def whole(d):
    """Every single-process tensor's bytes, from either form."""
    if not os.path.exists(f"{d}/index.json"):
        out = {}
        for f in ("model.safetensors", "optimizer.safetensors"):
            for k, (dt, shape, b) in safetensors(f"{d}/{f}").items():
                assert k not in out, k
                out[k] = (dt, shape, b)
        return out
    index = json.load(open(f"{d}/index.json"))
    bufs = {k: bytearray(SIZE[v["dtype"].upper()] * (eval("*".join(map(str, v["shape"])) or "1")))
            for k, v in index["tensors"].items()}
    filled = {k: 0 for k in bufs}
    for f in index["shards"]:
        for key, (dt, shape, b) in safetensors(f"{d}/{f}").items():
            name, off = key.rsplit("@", 1)
            es = SIZE[dt]
            bufs[name][int(off) * es:int(off) * es + len(b)] = b
            filled[name] += len(b)
    for k in bufs:
        assert filled[k] == len(bufs[k]), f"{d}: {k} pieces cover {filled[k]} of {len(bufs[k])}"
    return {k: (index["tensors"][k]["dtype"].upper(), index["tensors"][k]["shape"], bytes(b))
            for k, b in bufs.items()}

src, single, sharded = (whole(d) for d in sys.argv[1:4])
assert len(src) > 100, len(src)
for other, what in ((single, "single"), (sharded, "sharded")):
    assert set(other) == set(src), (what, set(src) ^ set(other))
    for k, (dt, shape, b) in src.items():
        assert other[k][1] == shape and other[k][2] == b, f"{what}: {k} differs"
# The single form splits parameters and optimizer state as training writes them.
model = safetensors(f"{sys.argv[2]}/model.safetensors")
assert "wte.weight" in model and not any(k.endswith(".exp_avg") for k in model), sorted(model)[:5]
print(f"{sys.argv[1]}: {len(src)} tensors bitwise equal in both conversions")
PY
done

# 3. dp 2's checkpoint, converted to the single form, resumes on one process.
"$mammoth" train "${common[@]}" --micro-batch 4 --steps 4 --resume --save-dir "$work/dp2.single" \
  >"$work/resume.log" 2>&1 || { cat "$work/resume.log"; fail "resume from the converted one"; }
grep -q "resumed from $work/dp2.single/step_00000002 at step 2" "$work/resume.log" ||
  { cat "$work/resume.log"; fail "did not resume from the converted checkpoint"; }

# 4. verify: a good checkpoint passes; damage is named by file and tensor, exit 1.
grep -q ": OK" <<<"$("$mammoth" ckpt verify "$work/tp2")" || fail "verify of a good checkpoint"
expect_bad() {  # expect_bad DIR PATTERN...
  local dir="$1" rc=0
  shift
  "$mammoth" ckpt verify "$dir" >"$work/verify.log" 2>&1 || rc=$?
  cat "$work/verify.log"
  [[ $rc -eq 1 ]] || fail "verify $dir: exit $rc, expected 1"
  for p in "$@"; do grep -qF -- "$p" "$work/verify.log" || fail "verify $dir: no '$p'"; done
}
cp -r "$work/zero3" "$work/flip"  # both ranks hold pieces (dp 2 alone: rank 0 writes all)
shard="$work/flip/step_00000002/shard_00001.safetensors"
# The last byte of the data section belongs to the shard's last piece.
last="$("$py" -c '
import json, struct, sys
raw = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
k = max(h, key=lambda k: h[k]["data_offsets"][1]); name, off = k.rsplit("@", 1)
end = int(off) + h[k]["shape"][0]
print(name + "\x27 elements [" + off + ", " + str(end) + ")")' "$shard")"
size=$(stat -c %s "$shard")
printf '\x55' | dd of="$shard" bs=1 seek=$((size - 1)) conv=notrunc status=none
expect_bad "$work/flip" "shard_00001.safetensors is corrupt" "damaged tensor(s): '$last"
cp -r "$work/np1" "$work/header"
printf '\x00' | dd of="$work/header/step_00000002/model.safetensors" bs=1 seek=9 conv=notrunc \
  status=none
expect_bad "$work/header" "model.safetensors is corrupt" "safetensors header is damaged"
cp -r "$work/pp2" "$work/trunc"
truncate -s 1000 "$work/trunc/step_00000002/shard_00000.safetensors"
expect_bad "$work/trunc" "shard_00000.safetensors has 1000 bytes"

# 5. --to hf and refusals.
"$mammoth" ckpt convert "$work/tp2" --to hf --out "$work/hf" >/dev/null
[[ -f "$work/hf/config.json" && -f "$work/hf/model.safetensors" ]] || fail "--to hf: no model"
if "$mammoth" ckpt convert "$work/tp2" --out "$work/x" >"$work/no_to.log" 2>&1; then
  fail "convert without --to ran"
fi
grep -q "\-\-to (not given)" "$work/no_to.log" || { cat "$work/no_to.log"; fail "no --to refusal"; }
if "$mammoth" ckpt convert "$work/tp2" --to single --out "$work/dp2.single" >"$work/ne.log" 2>&1; then
  fail "convert into a non-empty --out ran"
fi
grep -q "exists and is not empty" "$work/ne.log" || { cat "$work/ne.log"; fail "no --out refusal"; }
if "$mammoth" ckpt convert "$work/tp2" --to single --shards 2 --out "$work/y" >"$work/sh.log" 2>&1
then fail "--shards with --to single ran"; fi
grep -q "\-\-shards 2 is for --to sharded" "$work/sh.log" || { cat "$work/sh.log"; fail "--shards"; }
echo "PASS"
