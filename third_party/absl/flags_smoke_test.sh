#!/bin/bash
# Runs flags_smoke with flags and checks that Abseil parsed them (and rejects an unknown one).
set -euo pipefail
bin=third_party/absl/flags_smoke
out=$("$bin" --steps=7 --name=zoo extra)
if [[ "$out" != "zoo 7 2" ]]; then
  echo "expected 'zoo 7 2', got '$out'" >&2
  exit 1
fi
if "$bin" --no_such_flag=1 >/dev/null 2>&1; then
  echo "an unknown flag was accepted" >&2
  exit 1
fi
echo "ok: $out"
