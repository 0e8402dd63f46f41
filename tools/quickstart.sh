#!/bin/bash
# Installs what is missing, builds Mammoth and trains the default model on the shipped corpus.
#
#   bash tools/quickstart.sh [train flags...]
#
# Runs tools/setup.sh, builds //tools:mammoth and runs `bazel-bin/tools/mammoth train` (with no
# flags every option has its default: the small GPT on the bundled corpus, CPU or GPU 0).
# To train on several ranks afterwards:
#   mpirun -np 2 bazel-bin/tools/mammoth train --dp=2
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash tools/setup.sh

echo "[quickstart] bazel build //tools:mammoth"
if ! bazel query //tools:mammoth >/dev/null 2>&1; then
  echo "[quickstart] //tools:mammoth does not exist in this checkout" >&2
  exit 1
fi
bazel build //tools:mammoth

echo "[quickstart] bazel-bin/tools/mammoth train $*"
exec bazel-bin/tools/mammoth train "$@"
