#!/bin/bash
# LoRA against HF peft, for GPT-2 (Conv1D, fan_in_fan_out) and LLaMA (named targets and
# "all-linear", with an untied head it must leave out): transformers writes a tiny
# base model; `mammoth train --lora-*` trains adapters on it and saves a PEFT directory;
# lora_peft_check.py loads that with PeftModel.from_pretrained and compares its logits with
# Mammoth's forward (lora_logits) and its loss with `mammoth eval --adapter`; `mammoth ckpt
# export --merge-lora` must equal PEFT's merge_and_unload(); `train --adapter` continues it.
#   lora_peft_test.sh PYTHON_SH CHECK_PY MAMMOTH LORA_LOGITS
set -euo pipefail
python_sh="$1"
check="$2"
mammoth="$3"
logits="$4"
work="$(mktemp -d "${TEST_TMPDIR:-/tmp}/lora_peft.XXXXXX")"
trap 'rm -rf "$work"' EXIT
for family in gpt2 llama llama_all; do
  d="$work/$family"
  mkdir -p "$d"
  case "$family" in
    gpt2) targets=c_attn,c_proj ;;
    llama) targets=q_proj,v_proj,o_proj,down_proj ;;
    llama_all) targets=all-linear ;;  # PEFT's every-Linear-but-the-head
  esac
  "$python_sh" "$check" make "$family" "$d"
  "$mammoth" train --model "$d/base" --data "$d/data.bin" --lora-rank 4 --lora-alpha 8 \
    --lora-dropout 0.1 --lora-targets "$targets" --steps 6 --lr 1e-2 --warmup 1 --seq-len 16 \
    --micro-batch 4 --eval-every 0 --log-every 100 --threads 1 --save-dir "$d/run" \
    2>&1 | tee "$d/train.log"
  grep -q "trainable .* of .* parameters" "$d/train.log"
  grep -q "optimizer states: .* bytes" "$d/train.log"
  test -f "$d/run/adapter/adapter_model.safetensors"
  test -f "$d/run/$(cat "$d/run/latest")/adapter/adapter_config.json"  # with the checkpoint
  "$mammoth" eval --model "$d/base" --adapter "$d/run/adapter" --tokens "$d/data.bin" \
    --seq-len 16 --batch 4 --max-sequences 4 --threads 1 >"$d/eval.json"
  "$logits" "$d/base" "$d/run/adapter" "$d/ids.safetensors" "$d/ours.safetensors"
  "$mammoth" ckpt export "$d/run" --merge-lora --out "$d/merged"
  "$python_sh" "$check" check "$family" "$d"
  # Training continues from the adapter directory; generate runs with it.
  "$mammoth" train --model "$d/base" --data "$d/data.bin" --adapter "$d/run/adapter" --steps 2 \
    --seq-len 16 --micro-batch 4 --eval-every 0 --threads 1 --save-dir "$d/more"
  test -f "$d/more/adapter/adapter_model.safetensors"
  "$mammoth" generate --model "$d/base" --adapter "$d/more/adapter" --prompt-tokens 1,2,3 \
    --max-new-tokens 4 --temperature 0 --threads 1
done
# Refusals by name.
d="$work/gpt2"
if "$mammoth" train --model "$d/base" --data "$d/data.bin" --lora-rank 4 --lora-targets q_proj \
  --steps 1 2>"$work/err"; then
  echo "a target matching no layer was accepted"
  exit 1
fi
grep -q "target 'q_proj' matches no Linear layer" "$work/err"
refuse() {  # refuse EXPECTED_MESSAGE ARGS...: `mammoth train ARGS` fails naming the problem
  local want="$1"
  shift
  if "$mammoth" train --data "$d/data.bin" --steps 1 --seq-len 16 "$@" 2>"$work/err"; then
    echo "accepted: $*"
    exit 1
  fi
  grep -qF "$want" "$work/err" || { cat "$work/err"; exit 1; }
}
refuse "LoRA is supported for the causal LMs (GPT-2, LLaMA), not bert" --model bert-tiny \
  --lora-rank 4 --lora-targets query
refuse "need --lora-rank R" --model "$d/base" --lora-alpha 4
refuse "this run trains the whole model (no LoRA)" --model "$d/base" --save-dir "$d/run" --resume
refuse "brings its own LoRA shape" --model "$d/base" --adapter "$d/run/adapter" --lora-rank 2
echo "lora_peft_test passed"
