"""Softmax and log-softmax row kernels (numba), forward and fused backward.

An input is viewed as (outer, n, inner) around the softmax dim.  With
``inner == 1`` (softmax over the last dim, the usual case) each row is
contiguous and one loop finds the max, one sums exp(x - max) while writing it,
one scales.  Otherwise the kernel walks the n slices of each outer block and
keeps ``inner`` running maxima/sums, so every inner loop stays contiguous and
no transposed copy is made.

``fast_exp`` is why these loops are not NumPy: numba's pip build has no SVML,
so ``math.exp`` is a scalar libm call (5x slower than NumPy's SIMD exp).  For
float32 we evaluate Cephes' expf polynomial inline, which LLVM vectorizes,
relative error < 1e-7 over its range (measured against float64); float64
keeps ``math.exp``.  Row maxima use ``row_max`` (eight independent lanes).

Over the last dim the kernels also take a ``scale`` and a ``causal`` mask:
softmax(x * scale) with each query row cut at its own position, the fused
scale + mask + softmax of attention (OneFlow's fused_scale_tril_softmax).
The masked half of the scores is never read (zeros are written), and no
scaled copy of q or additive -inf bias is materialized.
"""
import math

import numpy as np
from numba import njit, prange

from ..registry import register
from .twin import twin
from .fastmath import fast_exp

# Reassociation lets LLVM vectorize the max/sum reductions; no 'nnan'/'ninf',
# because -inf (masked logits) and NaN must behave exactly as in IEEE.
FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}
JIT = dict(nogil=True, cache=True, fastmath=FASTMATH, error_model="numpy")


@njit(**JIT)
def row_max(r):
    """max of a 1-D array.  Eight independent running maxima: one chain of
    compare-selects cannot be vectorized without 'nnan' (measured 4x slower).
    A NaN may be skipped here, but it still makes exp(x - max) NaN downstream."""
    n = r.shape[0]
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = r[0]
    j = 0
    while j + 8 <= n:
        m0 = r[j] if r[j] > m0 else m0
        m1 = r[j + 1] if r[j + 1] > m1 else m1
        m2 = r[j + 2] if r[j + 2] > m2 else m2
        m3 = r[j + 3] if r[j + 3] > m3 else m3
        m4 = r[j + 4] if r[j + 4] > m4 else m4
        m5 = r[j + 5] if r[j + 5] > m5 else m5
        m6 = r[j + 6] if r[j + 6] > m6 else m6
        m7 = r[j + 7] if r[j + 7] > m7 else m7
        j += 8
    for k in range(j, n):
        m0 = r[k] if r[k] > m0 else m0
    m0 = max(max(m0, m1), max(m2, m3))
    m4 = max(max(m4, m5), max(m6, m7))
    return max(m0, m4)


# ------------------------------------------------------------------ forward
@njit(**JIT)
def valid_length(i, n, causal):
    """Columns row ``i`` keeps: all ``n``, or under a causal mask over
    ``causal`` query rows per matrix, the keys up to its query position
    (PyTorch's top-left aligned ``tril``)."""
    return n if causal == 0 else min(n, i % causal + 1)


@twin(**JIT)
def _rows_forward(x, out, log, scale, causal):
    """softmax(x * scale) of each row; with ``causal`` the masked tail of a row is
    skipped (never read) and written as 0 (log: -inf)."""
    n = x.shape[1]
    scale = x.dtype.type(scale)        # a float32 row stays float32 (vectorized)
    for i in prange(x.shape[0]):
        nv = valid_length(i, n, causal)
        if scale >= 0:
            m = row_max(x[i, :nv]) * scale
        else:
            m = -row_max(-x[i, :nv]) * scale
        s = x.dtype.type(0.0)
        if log:
            # (x - m) - log(s), stored in two steps: with reassociation allowed the
            # compiler would otherwise form x - (m + log(s)), which rounds m first
            for j in range(nv):
                out[i, j] = x[i, j] * scale - m
                s += fast_exp(out[i, j])
            logs = math.log(s)
            for j in range(nv):
                out[i, j] -= logs
            out[i, nv:] = -np.inf
        else:
            for j in range(nv):
                e = fast_exp(x[i, j] * scale - m)
                out[i, j] = e
                s += e
            inv = 1.0 / s
            for j in range(nv):
                out[i, j] *= inv
            out[i, nv:] = 0.0


@twin(**JIT)
def _cols_forward(x, out, log):
    outer, n, inner = x.shape
    for o in prange(outer):
        m = x[o, 0].copy()
        for j in range(n):
            for k in range(inner):
                m[k] = max(m[k], x[o, j, k])
        s = np.zeros(inner, x.dtype)
        for j in range(n):
            for k in range(inner):
                d = x[o, j, k] - m[k]
                e = fast_exp(d)
                s[k] += e
                out[o, j, k] = d if log else e
        if log:
            for k in range(inner):
                s[k] = math.log(s[k])
            for j in range(n):
                for k in range(inner):
                    out[o, j, k] -= s[k]
        else:
            for k in range(inner):
                s[k] = 1.0 / s[k]
            for j in range(n):
                for k in range(inner):
                    out[o, j, k] *= s[k]


# ------------------------------------------------------------------ backward
# softmax:     dx = y * (g - sum(g * y))
# log_softmax: dx = g - exp(y) * sum(g)
@twin(**JIT)
def _rows_backward(g, y, dx, log, scale, causal):
    """The gradient of softmax(x * scale): ``scale`` times the plain one; the
    causally masked tail gets 0 without being read."""
    n = y.shape[1]
    scale = y.dtype.type(scale)
    for i in prange(y.shape[0]):
        nv = valid_length(i, n, causal)
        s = y.dtype.type(0.0)
        if log:
            for j in range(nv):
                s += g[i, j]
            for j in range(nv):
                dx[i, j] = (g[i, j] - fast_exp(y[i, j]) * s) * scale
        else:
            for j in range(nv):
                s += g[i, j] * y[i, j]
            for j in range(nv):
                dx[i, j] = y[i, j] * (g[i, j] - s) * scale
        dx[i, nv:] = 0.0


@twin(**JIT)
def _cols_backward(g, y, dx, log):
    outer, n, inner = y.shape
    for o in prange(outer):
        s = np.zeros(inner, y.dtype)
        for j in range(n):
            for k in range(inner):
                s[k] += g[o, j, k] if log else g[o, j, k] * y[o, j, k]
        for j in range(n):
            for k in range(inner):
                if log:
                    dx[o, j, k] = g[o, j, k] - fast_exp(y[o, j, k]) * s[k]
                else:
                    dx[o, j, k] = y[o, j, k] * (g[o, j, k] - s[k])


# ------------------------------------------------------------------ entry points
def _split(shape, dim):
    outer, inner = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
    return outer, shape[dim], inner


def _run(rows_kernel, cols_kernel, arrays, dim, log, scale, causal):
    """Call the row kernel (inner == 1) or the strided one on (outer, n, inner) views."""
    shape = arrays[0].shape
    outer, n, inner = _split(shape, dim)
    causal_rows = fused_args("softmax", scale, causal, shape, dim, inner)
    out = np.empty(shape, arrays[0].dtype)
    if arrays[0].size == 0:
        return out
    arrays = [np.ascontiguousarray(a) for a in arrays]
    if inner == 1:
        rows_kernel(*[a.reshape(outer, n) for a in arrays], out.reshape(outer, n), log,
                    scale, causal_rows)
    else:
        cols_kernel(*[a.reshape(outer, n, inner) for a in arrays],
                    out.reshape(outer, n, inner), log)
    return out


def fused_args(op, scale, causal, shape, dim, inner):
    """The row kernels' causal argument, query rows per matrix (0: no mask),
    after checking that scale and mask apply where they can: the last dim of
    (..., L, S) scores.  Shared by the CUDA kernels."""
    causal_rows = 0
    if causal:
        if len(shape) < 2 or dim != len(shape) - 1:
            raise ValueError(f"{op} kernel: a causal mask needs (..., L, S) scores and the "
                             f"last dim, got shape {tuple(shape)} and dim={dim}")
        causal_rows = shape[-2]
    if inner != 1 and scale != 1.0:
        raise ValueError(f"{op} kernel: scale applies to the last dim only, got dim={dim} of "
                         f"shape {tuple(shape)}")
    return causal_rows


# ``scale`` and ``causal`` (softmax over the last dim only) make these the fused
# scale + causal-mask + softmax of attention (OneFlow's fused_scale_tril_softmax).
@register("softmax", "cpu")
def softmax(x, dim, scale=1.0, causal=False):
    return _run(_rows_forward, _cols_forward, [x], dim, False, float(scale), causal)


@register("log_softmax", "cpu")
def log_softmax(x, dim, scale=1.0, causal=False):
    return _run(_rows_forward, _cols_forward, [x], dim, True, float(scale), causal)


@register("softmax_backward", "cpu")
def softmax_backward(g, y, dim, scale=1.0, causal=False):
    return _run(_rows_backward, _cols_backward, [g, y], dim, False, float(scale), causal)


@register("log_softmax_backward", "cpu")
def log_softmax_backward(g, y, dim, scale=1.0, causal=False):
    return _run(_rows_backward, _cols_backward, [g, y], dim, True, float(scale), causal)
