"""Fits the rational erf of kernels/cpu/fast_impl.h `gelu_erf` and prints its coefficients.

    erf(a / sqrt 2) ~ a P(w) / Q(w),  w = a^2,  0 <= a < 5.5437,  deg P = 6, deg Q = 4, Q(0) = 1

Minimax by Lawson's iteration on the linearised problem (u P - f Q = 0 weighted by 1 / Q of the
previous step), then each coefficient rounded to f32 in turn (highest degree first) with the
others refitted around it. Prints the fit's error, the f32 evaluation's error (fused
multiply-adds emulated in double) and the C++ lines. Needs numpy:

    ~/.cache/mammoth/venv/bin/python tools/fit_gelu_erf.py
"""
from math import erf, sqrt

import numpy as np

EDGE = 5.5437  # erf(EDGE / sqrt 2) rounds to 1 in f32
M, N = 6, 4
ITERS = 1500

a = np.unique(np.concatenate([np.linspace(0, EDGE, 6000),
                              EDGE * np.sin(np.linspace(0, np.pi / 2, 6000))]))
f = np.array([erf(x / sqrt(2)) for x in a])
w2 = a * a
cols = [a * w2**k for k in range(M + 1)] + [-f * w2**k for k in range(1, N + 1)]
scale = np.array([EDGE**(-2 * k) for k in range(M + 1)] + [EDGE**(-2 * k) for k in range(1, N + 1)])


def solve(fixed, iters, weights):
    w = weights.copy()
    q_prev = np.ones_like(a)
    free = [i for i in range(M + 1 + N) if i not in fixed]
    best = None
    for _ in range(iters):
        rhs = f - sum((cols[i] * v for i, v in fixed.items()), np.zeros_like(a))
        A = np.stack([cols[i] * scale[i] for i in free], 1)
        sw = np.sqrt(w) / np.abs(q_prev)
        c, *_ = np.linalg.lstsq(A * sw[:, None], rhs * sw, rcond=None)
        full = np.zeros(M + 1 + N)
        for i, v in fixed.items():
            full[i] = v
        for j, i in enumerate(free):
            full[i] = c[j] * scale[i]
        p, q = full[:M + 1], np.concatenate([[1.0], full[M + 1:]])
        q_val = np.polyval(q[::-1], w2)
        err = a * np.polyval(p[::-1], w2) / q_val - f
        e = np.max(np.abs(err))
        if best is None or e < best[0]:
            best = (e, full.copy(), w.copy())
        q_prev = q_val
        w = w * (np.abs(err) / e) + 1e-300
        w /= w.sum()
    return best


fixed = {}
e, full, weights = solve(fixed, ITERS, np.ones_like(a) / len(a))
print(f"fit (double coefficients): {e:.3e}")
for i in list(range(M, -1, -1)) + list(range(M + N, M, -1)):
    fixed[i] = float(np.float32(full[i]))
    if len(fixed) < M + 1 + N:
        e, full, weights = solve(fixed, ITERS // 4, weights)
p = np.float32(full[:M + 1])
q = np.float32(np.concatenate([[1.0], full[M + 1:]]))
print(f"fit (f32 coefficients): {e:.3e}")

f32 = np.float32


def fma(x, y, z):
    return f32(x.astype(np.float64) * y.astype(np.float64) + z.astype(np.float64))


x = f32(np.linspace(-8, 8, 400001))
ax = np.abs(x)
w = f32(ax * ax)
P = np.full_like(ax, p[M])
for c in p[M - 1::-1]:
    P = fma(P, w, np.full_like(ax, c))
Q = np.full_like(ax, q[N])
for c in q[N - 1::-1]:
    Q = fma(Q, w, np.full_like(ax, c))
E = np.where(ax - f32(EDGE) < 0, f32(f32(ax * P) / Q), f32(1))
y = fma(f32(0.5) * ax, E, f32(0.5) * x)
ref = np.array([0.5 * v * (1 + erf(v / sqrt(2))) for v in x.astype(np.float64)])
erf_ref = np.array([erf(v / sqrt(2)) for v in ax.astype(np.float64)])
print(f"f32 evaluation: erf within {np.max(np.abs(E - erf_ref)):.2e}, "
      f"GELU within {np.max(np.abs(y - ref)):.2e}")
print(f"  Vec p = Vec::set1({float(p[M])!r}f);")
for c in p[M - 1::-1]:
    print(f"  p = fma(p, w, Vec::set1({float(c)!r}f));")
print(f"  Vec q = Vec::set1({float(q[N])!r}f);")
for c in q[N - 1::-1]:
    print(f"  q = fma(q, w, Vec::set1({float(c)!r}f));")
