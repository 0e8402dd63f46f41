#!/bin/bash
# Model parity: for each family, PyTorch (reference.py, plain torch, HF names) writes random
# weights, inputs and its logits/loss/gradients; parity_check loads them into Mammoth and
# compares, in float32 (1e-4 relative) and float64 (1e-9 relative).
#   parity_test.sh PYTHON_SH REFERENCE_PY PARITY_CHECK [family...]
set -euo pipefail
python_sh="$1"
reference="$2"
check="$3"
shift 3
families=("$@")
[[ ${#families[@]} -gt 0 ]] || families=(gpt2 llama bert vit)
out="${TEST_TMPDIR:-$(mktemp -d)}/parity"
status=0
for family in "${families[@]}"; do
  "$python_sh" "$reference" --family "$family" --out "$out/$family"
  for dtype in f32 f64; do
    echo "== $family $dtype"
    if ! "$check" "$out/$family" "$dtype"; then
      echo "FAILED: $family $dtype"
      status=1
    fi
  done
done
exit $status
