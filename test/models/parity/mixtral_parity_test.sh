#!/bin/bash
# Mixtral parity: mixtral_reference.py (plain PyTorch from modeling_mixtral.py) writes random
# weights, inputs and its logits/loss (with the aux and z router losses)/gradients for three
# cases: dropless, capacity (tokens dropped) and empty (an expert receives no token);
# parity_check compares Mammoth in float32 (1e-5 relative) and float64 (1e-6). transformers'
# MixtralForCausalLM then loads the dropless directories, the reference's and the one Mammoth
# wrote back (transformers is dropless, so not the capacity case).
#   mixtral_parity_test.sh PYTHON_SH REFERENCE_PY PARITY_CHECK HF_CHECK_PY
set -euo pipefail
python_sh="$1"
reference="$2"
check="$3"
hf_check="$4"
out="${TEST_TMPDIR:-$(mktemp -d)}/mixtral"
status=0
for case in dropless capacity empty; do
  "$python_sh" "$reference" --case "$case" --out "$out/$case"
  factor=0
  [[ "$case" == capacity ]] && factor=0.75
  for dtype in f32 f64; do
    tol=1e-5
    [[ "$dtype" == f64 ]] && tol=1e-6
    echo "== mixtral $case $dtype"
    if ! "$check" "$out/$case" "$dtype" "$tol" "$factor"; then
      echo "FAILED: mixtral $case $dtype"
      status=1
    fi
  done
  if [[ "$case" != capacity ]]; then
    echo "== mixtral $case transformers"
    if ! "$python_sh" "$hf_check" "$out/$case" "$out/$case" "$out/$case/mammoth_f32"; then
      echo "FAILED: mixtral $case transformers (tools/setup.sh installs transformers)"
      status=1
    fi
  fi
done
exit $status
