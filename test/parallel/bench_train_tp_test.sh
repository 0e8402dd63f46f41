#!/bin/bash
# `mammoth bench train --tp 1,2` under mpirun: one row per tp size with tokens/s, the tp=2 row
# against tp=1 measured in the same run; --tp larger than the job is a clear error.
set -euo pipefail
mammoth="$1"
mpirun="$2"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/bench_tp.XXXXXX")"
trap 'rm -rf "$work"' EXIT
bash "$mpirun" -np 2 "$mammoth" bench train --models gpt2-tiny --amp fp32 --batch 2 --seq 16 \
  --threads 1 --steps 2 --warmup 1 --tp 1,2 --json "$work/tp.json"
if bash "$mpirun" -np 2 "$mammoth" bench train --models gpt2-tiny --tp 4 2>"$work/err"; then
  echo "expected an error for --tp 4 on 2 ranks"; exit 1
fi
grep -q "needs at least 4 ranks" "$work/err"
"${MAMMOTH_PYTHON:-/usr/bin/python3}" - "$work/tp.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
assert [r["tp"] for r in rows] == [1, 2], rows
assert all(r["ours"] > 0 and r["unit"] == "tokens/s" for r in rows), rows
assert rows[1]["anchor"] == rows[0]["ours"] and rows[1]["ratio"] > 0, rows
print("ok", [(r["tp"], round(r["ours"])) for r in rows])
PY
