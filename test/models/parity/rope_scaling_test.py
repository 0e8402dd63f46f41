#!/usr/bin/env python3
"""Parity of current LLaMA configs with transformers 4.44's own models.

For each variant transformers builds the model from its config (random weights, made large
enough that rotary differences show), runs forward and backward in float64 on one batch and
save_pretrained's the weights (float32) and config.json; parity_check (Mammoth) loads that
directory and compares logits, loss and every gradient (f32 and f64), then writes the model back
with save_pretrained, which transformers loads again (hf_check.py) and must give the same logits:
so our config.json export of rope_scaling / head_dim is the one transformers reads.

  llama3   rope_scaling llama3 (all three frequency bands occur), tied embeddings
  linear   rope_scaling linear through the older "type" key, untied
  dynamic  rope_scaling dynamic (NTK) on a sequence longer than max_position_embeddings
  head_dim an explicit head_dim != hidden_size / heads. transformers 4.44's LlamaForCausalLM
           refuses that, so the reference is MistralForCausalLM (the same network without a
           sliding window, with the same parameter names) and the export is not reloaded.
Unsupported rope_scaling (yarn, longrope, unknown keys) must be refused by name.

Greedy generation (mammoth generate, KV cache) of 20 tokens after a 10-token prompt equals
transformers' generate for llama3 and for dynamic, whose max_position_embeddings 16 it passes.

usage: rope_scaling_test.py PARITY_CHECK HF_CHECK_PY MAMMOTH
"""
import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from safetensors.torch import save_file

BASE = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
        "tie_word_embeddings": False, "attention_dropout": 0.0}

VARIANTS = {
    # head_dim 16: wavelengths 2*pi * 10000^(i/8) = 6.3, 20, 63, 199...; old context 64 with
    # factors 1 and 8 keeps the first (< 8), blends the next two (8..64), divides the rest.
    "llama3": dict(BASE, tie_word_embeddings=True, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 8.0,
        "original_max_position_embeddings": 64}, max_position_embeddings=256),
    "linear": dict(BASE, rope_scaling={"type": "linear", "factor": 2.5}),
    "dynamic": dict(BASE, max_position_embeddings=16,
                    rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
    "head_dim": dict(BASE, head_dim=24, hidden_size=48, rope_theta=500000.0),
}
T = {"llama3": 24, "linear": 24, "dynamic": 40, "head_dim": 20}

REFUSED = {
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
             "rope_scaling 'yarn' is not supported"),
    "longrope": ({"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0]},
                 "rope_scaling 'longrope' is not supported"),
    "unknown_key": ({"rope_type": "linear", "factor": 2.0, "attention_factor": 1.0},
                    "key 'attention_factor' is not supported"),
    "no_factor": ({"rope_type": "dynamic"}, "'dynamic' needs a factor"),
    "llama3_missing": ({"rope_type": "llama3", "factor": 8.0},
                       "'llama3' needs low_freq_factor"),
}


def build(name, cfg, out):
    torch.manual_seed(26)
    if name == "head_dim":
        config = transformers.MistralConfig(sliding_window=None, **cfg)
        model = transformers.MistralForCausalLM(config)
    else:
        config = transformers.LlamaConfig(**cfg)
        model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.5 * torch.randn_like(p) / p.shape[-1] ** 0.5)
    model.save_pretrained(out, safe_serialization=True)  # float32 weights
    if name == "head_dim":  # ours reads it as the LLaMA it is
        with open(os.path.join(out, "config.json")) as f:
            c = json.load(f)
        c = {k: v for k, v in c.items() if k not in ("sliding_window",)}
        c.update(model_type="llama", architectures=["LlamaForCausalLM"])
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(c, f)
    model = model.double().eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, cfg["vocab_size"], (2, T[name]), generator=g)
    out_ = model(input_ids=ids, labels=ids)
    out_.loss.backward()
    expected = {"input.ids": ids, "logits": out_.logits.detach().contiguous(),
                "loss": out_.loss.detach().reshape(())}
    for pname, p in model.named_parameters():
        expected["grad." + pname] = p.grad.detach().contiguous()
    save_file(expected, os.path.join(out, "expected.safetensors"))


def main():
    check, hf_check = sys.argv[1], sys.argv[2]
    status = 0
    with tempfile.TemporaryDirectory() as root:
        for name, cfg in VARIANTS.items():
            d = os.path.join(root, name)
            build(name, cfg, d)
            for dtype, tol in (("f32", "1e-4"), ("f64", "2e-6")):
                # f64: transformers builds cos/sin in float32 (see hf_check.py), ~5e-7.
                r = subprocess.run([check, d, dtype, tol], capture_output=True, text=True)
                print(f"== {name} {dtype}: {r.stdout.strip().splitlines()[-1] if r.stdout else ''}")
                if r.returncode != 0:
                    print(r.stdout, r.stderr)
                    status = 1
            if name in ("llama3", "dynamic"):
                m = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
                prompt = [5, 9, 2, 44, 17, 3, 8, 60, 11, 23]
                want = m.generate(torch.tensor([prompt]), do_sample=False,
                                  max_new_tokens=20)[0, len(prompt):].tolist()
                r = subprocess.run([sys.argv[3], "generate", "--model", d, "--prompt-tokens",
                                    ",".join(map(str, prompt)), "--max-new-tokens", "20",
                                    "--temperature", "0"], capture_output=True, text=True)
                got = json.loads(r.stdout.strip().splitlines()[-1])["tokens"] if r.stdout else None
                print(f"== {name} greedy generation equals transformers': {got == want}")
                if got != want:
                    print(want, got, r.stderr[-500:])
                    status = 1
            if name != "head_dim":
                r = subprocess.run([sys.executable, hf_check, d, os.path.join(d, "mammoth_f32")],
                                   capture_output=True, text=True)
                print(f"== {name} exported, reloaded by transformers: {r.stdout.strip()}")
                exported = json.load(open(os.path.join(d, "mammoth_f32", "config.json")))
                print(f"   rope_scaling {exported.get('rope_scaling')}")
                if r.returncode != 0:
                    print(r.stderr)
                    status = 1
        for name, (rs, message) in REFUSED.items():
            d = os.path.join(root, "refused_" + name)
            os.makedirs(d)
            json.dump(dict(BASE, model_type="llama", rope_scaling=rs),
                      open(os.path.join(d, "config.json"), "w"))
            r = subprocess.run([check, d, "f32"], capture_output=True, text=True)
            ok = r.returncode != 0 and message in r.stderr
            print(f"== refused {name}: {'ok' if ok else 'NOT REFUSED AS EXPECTED'}: "
                  f"{r.stderr.strip()}")
            status |= 0 if ok else 1
    sys.exit(status)


if __name__ == "__main__":
    main()
