#!/usr/bin/env python3
"""Mammoth's GPU kernels beside PyTorch's, measured in the same run on the same machine.

Runs the gpu_bench binary (our figures, as JSON lines), then measures the anchors on the same
shapes: torch.matmul, torch.nn.functional.scaled_dot_product_attention (forward and backward),
torch.nn.functional.layer_norm, torch.optim.AdamW(fused=True). Prints one table row per figure
with the ratio ours / torch (higher is better for us; every unit is a rate).

    gpu_bench.py --bench path/to/gpu_bench [--quick] [--json out.json] [--markdown out.md]
"""
import argparse
import json
import re
import subprocess
import sys


def cuda_time_ms(torch, fn, warmup, iters):
    for _ in range(warmup):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def dtype_of(torch, name):
    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32,
            "tf32": torch.float32}[name]


def anchor(torch, name, quick):
    """The torch figure for one of our figure names, in the same unit; None if not measurable."""
    F = torch.nn.functional
    m = re.fullmatch(r"gemm_(bf16|f16|tf32|f32)_(\d+)x(\d+)x(\d+)", name)
    if m:
        t, M, N, K = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
        torch.backends.cuda.matmul.allow_tf32 = t == "tf32"
        a = torch.randn(M, K, device="cuda", dtype=dtype_of(torch, t))
        b = torch.randn(K, N, device="cuda", dtype=dtype_of(torch, t))
        ms = cuda_time_ms(torch, lambda: torch.matmul(a, b), 3, 5 if quick else 20)
        torch.backends.cuda.matmul.allow_tf32 = False
        return 2.0 * M * N * K / (ms * 1e-3) / 1e12
    m = re.fullmatch(r"attn_bf16_B(\d+)_H(\d+)_T(\d+)_D(\d+)(_causal)?_(fwd|bwd)", name)
    if m:
        B, H, T, D = (int(m.group(i)) for i in range(1, 5))
        causal, phase = m.group(5) is not None, m.group(6)
        q, k, v = (torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        dout = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
        flops = 4.0 * B * H * T * T * D / (2.0 if causal else 1.0)
        fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if phase == "fwd":
            with torch.no_grad():
                ms = cuda_time_ms(torch, fwd, 2, 3 if quick else 10)
            return flops / (ms * 1e-3) / 1e12
        out = fwd()
        bwd = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        ms = cuda_time_ms(torch, bwd, 2, 3 if quick else 10)
        return 2.5 * flops / (ms * 1e-3) / 1e12
    m = re.fullmatch(r"layer_norm_fwd_(bf16|f32)_(\d+)x(\d+)", name)
    if m:
        t, M, N = dtype_of(torch, m.group(1)), int(m.group(2)), int(m.group(3))
        x = torch.randn(M, N, device="cuda", dtype=t)
        w = torch.randn(N, device="cuda", dtype=t)
        b = torch.randn(N, device="cuda", dtype=t)
        with torch.no_grad():
            ms = cuda_time_ms(torch, lambda: F.layer_norm(x, (N,), w, b, 1e-5), 3, 20)
        return 2.0 * M * N * x.element_size() / (ms * 1e-3) / 1e9
    m = re.fullmatch(r"adamw_f32_(\d+)_params_(\d+)_tensors", name)
    if m:
        total, count = int(m.group(1)), int(m.group(2))
        per = (total - 1024 * count * (count - 1) // 2) // count
        params = [torch.zeros(per + 1024 * i, device="cuda", requires_grad=True)
                  for i in range(count)]
        for p in params:
            p.grad = torch.zeros_like(p)
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True)
        ms = cuda_time_ms(torch, opt.step, 3, 20)
        return 7.0 * 4.0 * total / (ms * 1e-3) / 1e9
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="the gpu_bench binary")
    ap.add_argument("--quick", action="store_true", help="smaller shapes, fewer iterations")
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--markdown", help="write the table as Markdown here")
    args = ap.parse_args()

    cmd = [args.bench, "--json"] + (["--quick"] if args.quick else [])
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ours = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        print(f"[gpu_bench.py] {' '.join(cmd)} exited with {proc.returncode} "
              f"after {len(ours)} figures", file=sys.stderr)

    try:
        import torch
        torch_ok = torch.cuda.is_available()
        torch_version = torch.__version__
    except Exception as e:  # no torch on this machine: our figures alone
        torch, torch_ok, torch_version = None, False, f"unavailable ({e})"

    rows = []
    for fig in ours:
        ref, err = None, None
        if torch_ok:
            try:
                ref = anchor(torch, fig["name"], args.quick)
            except Exception as e:  # an anchor that fails is reported, not fatal
                err = f"{type(e).__name__}: {e}"
            torch.cuda.empty_cache()
        rows.append({"name": fig["name"], "ours": fig["value"], "torch": ref, "unit": fig["unit"],
                     "ratio": (fig["value"] / ref) if ref else None, "error": err})

    header = f"| figure | Mammoth | PyTorch {torch_version} | unit | ratio |"
    lines = [header, "|---|---:|---:|---|---:|"]
    for r in rows:
        t = f"{r['torch']:.1f}" if r["torch"] else ("n/a" if not r["error"] else "error")
        ratio = f"{r['ratio']:.2f}" if r["ratio"] else "-"
        lines.append(f"| {r['name']} | {r['ours']:.1f} | {t} | {r['unit']} | {ratio} |")
    table = "\n".join(lines)
    print(table)
    for r in rows:
        if r["error"]:
            print(f"[gpu_bench.py] torch anchor for {r['name']} failed: {r['error']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch_version, "rows": rows, "bench_exit": proc.returncode}, f,
                      indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    return 0 if proc.returncode == 0 and rows else 1


if __name__ == "__main__":
    sys.exit(main())
