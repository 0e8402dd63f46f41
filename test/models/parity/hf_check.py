"""transformers' side of the parity test (tools/setup.sh installs transformers in the venv).

Loads model directories with transformers' own from_pretrained (AutoModelForCausalLM), runs the
inputs reference.py recorded, and compares logits and loss with its float64 values: so the plain
torch reference and the file layouts are the ones transformers reads. Each DIR is reference.py's
output or a directory parity_check wrote back with models::save_pretrained.

usage: hf_check.py EXPECTED_DIR DIR... (causal LMs: gpt2, gpt2_untied, llama, mistral, qwen2)
"""
import json
import os
import struct
import sys

import numpy as np
import torch
import transformers

_NP = {"F32": np.float32, "F64": np.float64, "I64": np.int64}


def load_safetensors(path):  # by hand, so that only transformers itself is needed
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        a = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=_NP[info["dtype"]])
        out[name] = torch.from_numpy(a.reshape(info["shape"]).copy())
    return out


def main():
    expected = load_safetensors(os.path.join(sys.argv[1], "expected.safetensors"))
    ids = expected["input.ids"]
    worst = 0.0
    for d in sys.argv[2:]:
        # eager: the attention whose mask transformers 4.44 builds with Mistral's sliding window
        model = transformers.AutoModelForCausalLM.from_pretrained(
            d, torch_dtype=torch.float64, attn_implementation="eager")
        model.eval()
        with torch.no_grad():
            out = model(input_ids=ids, labels=ids)
        for name, ours in (("logits", out.logits), ("loss", out.loss)):
            ref = expected[name]
            e = ((ours - ref).abs().max() / ref.abs().max()).item()
            worst = max(worst, e)
            print(f"transformers {d} {name}: rel {e:.3e}")
    print(json.dumps({"transformers": transformers.__version__, "max_rel": worst}))
    # float64 throughout, except that transformers' LLaMA builds its rotary cos/sin in float32
    # (~5e-7 here); GPT-2 agrees to ~1e-15.
    sys.exit(0 if worst < 2e-6 else 1)


if __name__ == "__main__":
    main()
