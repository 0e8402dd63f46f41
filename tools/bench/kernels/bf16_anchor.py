#!/usr/bin/env python3
"""The bf16 GEMM anchor of `mammoth bench kernels`: torch.matmul on bf16 tensors (oneDNN).

Times C = op(A) @ op(B) for each shape given as NAME:TA:TB:M:N:K (TA/TB are 0 or 1; a
transposed operand is a transposed view of a row-major tensor, as the engine stores it) with
a fixed number of threads, the best of --reps runs after a warm-up, and prints one JSON object
as its last line: {"torch", "threads", "rows": [{"name", "gflops", "impl"}]}. "impl" is the
oneDNN primitive that ran the shape (from oneDNN's verbose log of the warm-up call), so the
table says whether it was AMX, AVX512_BF16, a reference path or no oneDNN at all. Exits 3 if
torch cannot be imported, 4 (with {"error"}) if torch has no bf16 matmul on this CPU / ISA.
"""

import argparse
import json
import os
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--shapes", required=True, help="NAME:TA:TB:M:N:K,...")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    try:
        import torch
    except ImportError as e:
        print(json.dumps({"error": "torch not importable: %s" % e}))
        sys.exit(3)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    shapes = []
    for spec in args.shapes.split(","):
        name, ta, tb, m, n, k = spec.split(":")
        shapes.append((name, ta == "1", tb == "1", int(m), int(n), int(k)))

    def operands(ta, tb, m, n, k):
        a = torch.randn(k, m) if ta else torch.randn(m, k)
        b = torch.randn(n, k) if tb else torch.randn(k, n)
        a, b = a.bfloat16(), b.bfloat16()
        return (a.t() if ta else a), (b.t() if tb else b)

    def first_call(a, b):
        """Runs torch.matmul once (the warm-up) and returns the oneDNN primitive that ran it."""
        mk = getattr(torch.backends, "mkldnn", None)
        if mk is None or not hasattr(mk, "verbose"):
            torch.matmul(a, b)
            return "unknown (no oneDNN verbose in this torch)"
        # oneDNN writes its verbose log to fd 1 from C; catch it in a file.
        sys.stdout.flush()
        saved = os.dup(1)
        with tempfile.TemporaryFile(mode="w+") as log:
            os.dup2(log.fileno(), 1)
            try:
                with mk.verbose(mk.VERBOSE_ON):
                    torch.matmul(a, b)
            finally:
                sys.stdout.flush()
                os.dup2(saved, 1)
                os.close(saved)
            log.seek(0)
            for line in log:
                f = line.strip().split(",")
                if len(f) > 5 and f[0] in ("onednn_verbose", "dnnl_verbose") and f[1] == "exec":
                    return "oneDNN %s %s" % (f[3], f[4])
        return "no oneDNN primitive ran"

    rows = []
    for name, ta, tb, m, n, k in shapes:
        a, b = operands(ta, tb, m, n, k)
        try:
            impl = first_call(a, b)  # also the warm-up: primitive creation, page faults
        except RuntimeError as e:
            # oneDNN has no bf16 matmul below AVX512_BF16 / AVX512-BW (an AVX2-only CPU, or
            # ONEDNN_MAX_CPU_ISA=AVX2): the rows say so and the bench goes on.
            print(json.dumps({"error": "torch %s has no bf16 matmul on this CPU/ISA (oneDNN "
                              "needs AVX-512 BF16; ONEDNN_MAX_CPU_ISA=%s): %s" % (
                                  torch.__version__,
                                  os.environ.get("ONEDNN_MAX_CPU_ISA", "unset"),
                                  str(e).splitlines()[0])}))
            sys.exit(4)
        best = float("inf")
        for _ in range(args.reps):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - t0)
        rows.append({"name": name, "gflops": 2.0 * m * n * k / best / 1e9, "impl": impl})
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(),
                      "rows": rows}))


if __name__ == "__main__":
    main()
