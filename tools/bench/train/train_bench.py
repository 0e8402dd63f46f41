"""The PyTorch anchor of `mammoth bench train`: a GPT-2 training step on the CPU, eager and
torch.compile, served to the bench over stdin / stdout so that rounds alternate within one job.

The model matches Mammoth's GPT-2 (models/gpt2): learned positions, pre-LayerNorm blocks,
fused QKV projection, causal attention, tanh-GELU MLP of 4*d, final LayerNorm, LM head tied to
the token embedding; AdamW over all parameters. One step = forward, cross-entropy, backward,
AdamW step, zero_grad: the same work Mammoth's step does. Neither side has dropout (Mammoth's
bench builds its model with dropout 0 whatever the model's config says).

PyTorch is set up at its best on this CPU, as the issue asks. PyTorch 2.x (PyPI, MKL / oneDNN;
tools/setup.sh --bench-anchor) uses scaled_dot_product_attention and the fused AdamW, and runs
eager or torch.compile'd (inductor). Debian's torch 1.13 runs the eager formulation on the system
BLAS (checked and printed: OpenBLAS, not the reference BLAS); OpenBLAS 0.3.21 needs
OPENBLAS_CORETYPE=SkylakeX to use AVX-512 on CPUs it does not know (set here by re-executing
before torch loads, only where the CPU has AVX-512 F/BW/VL/DQ/CD; Haswell where it has AVX2 +
FMA; a value the user set is kept). torch's thread count is set explicitly.

usage: train_bench.py --n-layer 12 --n-head 12 --d-model 768 --vocab 50257 --max-seq 1024
                      --batch 4 --seq 64 --threads 2 --steps 5 --warmup 2 --amp fp32|bf16
prints one JSON line describing the anchor ({"torch", "cpu_capability", "compile", ...}), then
for each line "eager" or "compiled" read from stdin times that many steps (after --warmup steps
the first time a mode runs; for "compiled" more until a step is near the fastest, so the
compilation is all in the warm-up) and prints one JSON
line: {"mode", "ms_per_step", "tokens_per_s", "loss", "warmup_s"}, or {"error"}.
"""
import argparse
import json
import math
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
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
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
            # numpy's own OpenBLAS and the CUDA libraries PyPI's torch maps are not torch's
            # CPU BLAS (PyPI's torch links MKL statically: "mkl" in the line says so).
            if "numpy.libs" in path or "cublas" in path:
                continue
            if "blas" in path or "mkl" in path:
                libs.add(os.path.realpath(path))
    return sorted(libs)


def cpu_capability():
    """The ATen kernel family torch dispatches to ("AVX2", "AVX512", ...), when it says."""
    get = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return get() if get else "unknown (torch %s does not report it)" % torch.__version__


def inductor_isa():
    """The vector ISA torch.compile's C++ code is generated for, when this torch has inductor."""
    try:
        from torch._inductor import cpu_vec_isa
        return str(cpu_vec_isa.pick_vec_isa())
    except Exception:  # noqa: BLE001 - older torch: not reported, the line says so
        return "unknown"


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
    # The fused (single-kernel) AdamW where this torch has it on the CPU (2.4 and later).
    fused = "fused" in torch.optim.AdamW.__init__.__code__.co_varnames
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1,
                                **({"fused": True} if fused else {}))
    except RuntimeError:
        fused = False
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    can_compile = hasattr(torch, "compile")
    # One module, one optimizer: the compiled form shares the eager one's parameters.
    forward = {"eager": model, "compiled": torch.compile(model) if can_compile else None}

    def step(mode):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.amp == "bf16"):
            loss = forward[mode](x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    print(json.dumps({
        "torch": torch.__version__,
        "cpu_capability": cpu_capability(),
        "inductor_isa": inductor_isa() if can_compile else "none",
        "compile": can_compile,
        "sdpa": hasattr(F, "scaled_dot_product_attention"),
        "fused_adamw": fused,
        "mkl": torch.backends.mkl.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "threads": torch.get_num_threads(),
        "blas": blas_in_use(),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
        "params": sum(p.numel() for p in model.parameters()),
    }), flush=True)
    warmed = set()
    for line in sys.stdin:
        mode = line.strip()
        if forward.get(mode) is None:
            print(json.dumps({"error": "unknown or unavailable mode %r (torch %s)" % (
                mode, torch.__version__)}), flush=True)
            continue
        warmup_s = 0.0
        if mode not in warmed:
            t0 = time.perf_counter()
            warm = []
            for _ in range(a.warmup):
                t1 = time.perf_counter()
                step(mode)
                warm.append(time.perf_counter() - t1)
            # torch.compile can recompile on the steps after the first (the backward, the
            # optimizer's first state): warm up until a step is near the fastest seen, at most
            # 8 more, so no compilation lands in the timed steps.
            while mode == "compiled" and len(warm) < a.warmup + 8 and warm[-1] > 1.3 * min(warm):
                t1 = time.perf_counter()
                step(mode)
                warm.append(time.perf_counter() - t1)
            warmup_s = time.perf_counter() - t0
            warmed.add(mode)
        times = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            loss = step(mode)
            times.append(time.perf_counter() - t0)
        times.sort()
        ms = 1000 * times[len(times) // 2]
        # A NaN loss (seen from torch.compile capped at AVX2) is reported as text: JSON has no
        # NaN, and the timing is still the figure asked for.
        print(json.dumps({"mode": mode, "ms_per_step": ms,
                          "tokens_per_s": a.batch * a.seq / (ms / 1000),
                          "loss": loss if math.isfinite(loss) else str(loss),
                          "warmup_s": warmup_s}), flush=True)


if __name__ == "__main__":
    main()
