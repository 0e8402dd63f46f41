#!/bin/bash
# Model parity: for each family, PyTorch (reference.py, plain torch, HF names) writes random
# weights, inputs and its logits/loss/gradients; parity_check loads them into Mammoth and
# compares, in float32 (1e-4 relative) and float64 (1e-9 relative).
# hf_check.py also loads both directories with transformers (tools/setup.sh installs it).
#   parity_test.sh PYTHON_SH REFERENCE_PY PARITY_CHECK HF_CHECK_PY [family...]
set -euo pipefail
python_sh="$1"
reference="$2"
check="$3"
hf_check="$4"
shift 4
families=("$@")
[[ ${#families[@]} -gt 0 ]] || families=(gpt2 gpt2_untied llama mistral qwen2 bert vit)
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
  # transformers' own loader on the reference's directory and on the one Mammoth wrote back.
  case "$family" in
    gpt2 | gpt2_untied | llama | mistral | qwen2)
      echo "== $family transformers"
      if ! "$python_sh" "$hf_check" "$out/$family" "$out/$family" "$out/$family/mammoth_f32"; then
        echo "FAILED: $family transformers (tools/setup.sh installs transformers in the venv)"
        status=1
      fi
      ;;
  esac
done
exit $status
