"""The PyTorch anchor of `mammoth bench train`: a plain eager GPT-2 training step on the CPU.

The model matches Mammoth's GPT-2 (models/gpt2): learned positions, pre-LayerNorm blocks,
fused QKV projection, causal attention, tanh-GELU MLP of 4*d, final LayerNorm, LM head tied to
the token embedding; AdamW over all parameters. One step = forward, cross-entropy, backward,
AdamW step, zero_grad: the same work Mammoth's step does.

PyTorch is set up at its best on this CPU, as the issue asks: Debian's torch runs f32 matmuls
on the system BLAS (checked and printed: OpenBLAS, not the reference BLAS), OpenBLAS 0.3.21
needs OPENBLAS_CORETYPE=SkylakeX to use AVX-512 on CPUs it does not know (set here by
re-executing before torch loads, only where the CPU has AVX-512 F/BW/VL/DQ/CD; Haswell where it
has AVX2 + FMA; a value the user set is kept), and torch's thread count is set explicitly.

usage: train_bench.py --n-layer 12 --n-head 12 --d-model 768 --vocab 50257 --max-seq 1024
                      --batch 4 --seq 64 --threads 2 --steps 5 --warmup 2 --amp fp32|bf16
prints one JSON line: {"ms_per_step": ..., "tokens_per_s": ..., "blas": ..., ...}
"""
import argparse
import json
import os
import sys
import time


def cpu_has(*flags):
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(flags) <= set(line.split())
    except OSError:
        pass
    return False


def openblas_core():
    """The OpenBLAS core matching this CPU (as tools/bench/gemm_bench.cc picks it), or None."""
    if cpu_has("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "fma"):
        return "SkylakeX"
    if cpu_has("avx2", "fma"):
        return "Haswell"
    return None


if "OPENBLAS_CORETYPE" not in os.environ and openblas_core():
    os.environ["OPENBLAS_CORETYPE"] = openblas_core()
    os.execv(sys.executable, [sys.executable] + sys.argv)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, d, h, max_seq):
        super().__init__()
        self.h = h
        self.register_buffer(
            "causal", torch.ones(max_seq, max_seq, dtype=torch.bool).triu(1), persistent=False)
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        # torch 1.13 (Debian) has no scaled_dot_product_attention: the eager formulation.
        att = (q @ k.transpose(-2, -1)) * (1.0 / (C // self.h) ** 0.5)
        att = att.masked_fill(self.causal[:T, :T], float("-inf")).softmax(dim=-1)
        y = att @ v
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, n_layer, n_head, d, vocab, max_seq):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(max_seq, d)
        self.h = nn.ModuleList(Block(d, n_head, max_seq) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, targets):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1]))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def blas_in_use():
    """The BLAS library torch's process actually mapped (after a matmul)."""
    torch.ones(64, 64) @ torch.ones(64, 64)
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "blas" in path or "mkl" in path:
                libs.add(os.path.realpath(path))
    return sorted(libs)


def main():
    ap = argparse.ArgumentParser()
    for name in ("n-layer", "n-head", "d-model", "vocab", "max-seq", "batch", "seq", "threads",
                 "steps", "warmup"):
        ap.add_argument("--" + name, type=int, required=name not in ("steps", "warmup"))
    ap.add_argument("--amp", default="fp32", choices=["fp32", "bf16"])
    ap.set_defaults(steps=5, warmup=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT2(a.n_layer, a.n_head, a.d_model, a.vocab, a.max_seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp == "bf16"):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(a.warmup):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    times.sort()
    ms = 1000 * times[len(times) // 2]
    print(json.dumps({
        "ms_per_step": ms,
        "tokens_per_s": a.batch * a.seq / (ms / 1000),
        "loss": loss,
        "threads": torch.get_num_threads(),
        "blas": blas_in_use(),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
        "torch": torch.__version__,
        "params": sum(p.numel() for p in model.parameters()),
    }))


if __name__ == "__main__":
    main()
