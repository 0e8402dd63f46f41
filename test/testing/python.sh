#!/bin/bash
# Runs the Python that reference checks use: python.sh script.py [args...]
#
# $MAMMOTH_PYTHON when set (tools/test.sh points it at the venv from tools/setup.sh, which has
# safetensors, tokenizers and tensorboard besides Debian's torch and numpy); else that venv if it
# exists; else Debian's /usr/bin/python3 (torch and numpy only). Never the first python3 on PATH,
# which may be an interpreter without Debian's packages.
set -euo pipefail
py="${MAMMOTH_PYTHON:-}"
if [[ -z "$py" ]]; then
  for candidate in "${HOME:-/nonexistent}/.cache/mammoth/venv/bin/python" /usr/bin/python3; do
    if [[ -x "$candidate" ]]; then
      py="$candidate"
      break
    fi
  done
fi
if [[ -z "$py" || ! -x "$py" ]]; then
  echo "[python.sh] no Python found (MAMMOTH_PYTHON='${MAMMOTH_PYTHON:-}'); run tools/setup.sh" >&2
  exit 2
fi
exec "$py" "$@"
