#!/usr/bin/env python3
"""Mistral and Qwen2 directories written by transformers 4.44 itself, through Mammoth's commands.

For each, transformers builds the model from its own config class (eager attention, random
weights) and save_pretrained's it; then:
  - parity_check (Mammoth) loads the directory and matches transformers' logits, loss and every
    gradient on 24 tokens (f32 1e-4, f64 2e-6; mistral's window of 6 is shorter, so it masks),
    and writes the model back, which transformers reloads with the same logits (hf_check.py);
  - `mammoth generate` (KV cache) decodes 20 greedy tokens after a 10-token prompt, past the
    window, equal to transformers' generate;
  - `mammoth train --model DIR` trains 2 steps and `mammoth ckpt export` writes a directory that
    transformers loads as MistralForCausalLM / Qwen2ForCausalLM, whose logits parity_check
    reproduces from that same directory.

usage: hf_variants_test.py PARITY_CHECK HF_CHECK_PY MAMMOTH
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from safetensors.torch import save_file

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
            rms_norm_eps=1e-6, rope_theta=10000.0, attention_dropout=0.0)
VARIANTS = {
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM,
                dict(BASE, sliding_window=6, tie_word_embeddings=False)),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM,
              dict(BASE, use_sliding_window=False, tie_word_embeddings=True)),
}
T = 24


def record_expected(model, d, vocab):
    """transformers' float64 logits, loss and gradients on one batch, for parity_check."""
    model = model.double().eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, vocab, (2, T), generator=g)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    expected = {"input.ids": ids, "logits": out.logits.detach().contiguous(),
                "loss": out.loss.detach().reshape(())}
    for pname, p in model.named_parameters():
        if p.grad is not None:
            expected["grad." + pname] = p.grad.detach().contiguous()
    save_file(expected, os.path.join(d, "expected.safetensors"))


def parity(check, d, status):
    for dtype, tol in (("f32", "1e-4"), ("f64", "2e-6")):
        r = subprocess.run([check, d, dtype, tol], capture_output=True, text=True)
        lines = r.stdout.strip().splitlines()
        loss = [l for l in lines if l.startswith("loss")]
        print(f"== {d} {dtype}: {loss[0] if loss else ''} {lines[-1] if lines else ''}")
        if r.returncode != 0:
            print(r.stdout[-3000:], r.stderr[-3000:])
            status = 1
    return status


def main():
    check, hf_check, mammoth = sys.argv[1:4]
    status = 0
    with tempfile.TemporaryDirectory() as root:
        for name, (config_cls, model_cls, cfg) in VARIANTS.items():
            d = os.path.join(root, name)
            torch.manual_seed(26)
            model = model_cls(config_cls(attn_implementation="eager", **cfg))
            with torch.no_grad():
                for pname, p in model.named_parameters():
                    if "norm" in pname:
                        p.copy_(1 + 0.2 * torch.randn_like(p))
                    else:
                        p.copy_(0.5 * torch.randn_like(p) / p.shape[-1] ** 0.5)
            model.save_pretrained(d, safe_serialization=True)  # float32 weights
            prompt = [5, 9, 2, 44, 17, 3, 8, 60, 11, 23]
            want = model.eval().generate(torch.tensor([prompt]), do_sample=False,
                                         max_new_tokens=20)[0, len(prompt):].tolist()
            record_expected(model, d, cfg["vocab_size"])
            status = parity(check, d, status)
            r = subprocess.run([sys.executable, hf_check, d, os.path.join(d, "mammoth_f32")],
                               capture_output=True, text=True)
            print(f"== {name} written back, reloaded by transformers: {r.stdout.strip()}")
            if r.returncode != 0:
                print(r.stderr[-3000:])
                status = 1
            r = subprocess.run([mammoth, "generate", "--model", d, "--prompt-tokens",
                                ",".join(map(str, prompt)), "--max-new-tokens", "20",
                                "--temperature", "0"], capture_output=True, text=True)
            got = json.loads(r.stdout.strip().splitlines()[-1])["tokens"] if r.stdout else None
            print(f"== {name} greedy generation equals transformers': {got == want}")
            if got != want:
                print(want, got, r.stderr[-1000:])
                status = 1
            # Train from the directory, export, and load the export with transformers.
            tokens = np.random.default_rng(1).integers(0, cfg["vocab_size"], 4096)
            shard = os.path.join(root, name + "_train_000000.bin")
            header = np.zeros(256, dtype=np.int32)
            header[:3] = (20240520, 1, len(tokens))
            with open(shard, "wb") as f:
                f.write(header.tobytes())
                f.write(tokens.astype(np.uint16).tobytes())
            save, exported = os.path.join(root, name + "_run"), os.path.join(root, name + "_hf")
            for cmd in ([mammoth, "train", "--model", d, "--data", shard, "--steps", "2",
                         "--seq-len", str(T), "--micro-batch", "2", "--eval-every", "0",
                         "--log-every", "1", "--threads", "1", "--save-dir", save],
                        [mammoth, "ckpt", "export", save, "--out", exported]):
                r = subprocess.run(cmd, capture_output=True, text=True)
                if r.returncode != 0:
                    print("FAILED:", " ".join(cmd), r.stdout[-2000:], r.stderr[-2000:])
                    status = 1
            if status:
                continue
            back = transformers.AutoModelForCausalLM.from_pretrained(
                exported, attn_implementation="eager", torch_dtype=torch.float64)
            print(f"== {name} trained and exported: transformers loads "
                  f"{type(back).__name__}")
            if type(back) is not model_cls:
                status = 1
            record_expected(back, exported, cfg["vocab_size"])
            status = parity(check, exported, status)
    sys.exit(status)


if __name__ == "__main__":
    main()
