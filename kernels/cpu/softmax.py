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

``scale_mask_softmax(x, mask, scale, fill_value)`` is OneFlow's
fused_scale_mask_softmax: softmax over the last dim of ``where(mask, x * scale,
fill_value)``, with a bool ``mask`` (True: keep) broadcasting to x.  The mask is
never broadcast in memory: ``mask_rows`` gives each row of x its offset into the
C-contiguous mask (plus one column stride, 0 or 1), so a (T, S) mask over
(B, H, T, S) scores costs one int64 per row.  Each element rounds as the
composition's ops do (x * scale in x's dtype, then the plain softmax), so the
result equals ``softmax(where(mask, x * scale, fill), -1)`` of these kernels;
a fully masked row with fill -inf is NaN, as that composition is.  The backward
``scale * mask * y * (g - sum(g * y))`` sums over the whole row (a finite fill
leaves y > 0 at masked positions) and writes 0 where the mask is False.
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


# ------------------------------------------------------------------ scale + bool mask
@twin(**JIT)
def _masked_rows_forward(x, out, m, moff, mcol, scale, fill):
    """softmax(where(mask, x * scale, fill)) of each row; row i's mask element j
    is m[moff[i] + j * mcol].  The masked scores are written to ``out`` first,
    then the plain softmax runs on them in place (its arithmetic, step by step)."""
    n = x.shape[1]
    scale = x.dtype.type(scale)
    fill = x.dtype.type(fill)
    for i in prange(x.shape[0]):
        o = moff[i]
        row = out[i]
        if mcol == 0:                   # one mask value for the whole row
            if m[o]:
                for j in range(n):
                    row[j] = x[i, j] * scale
            else:
                row[:] = fill
        else:                           # mcol == 1: a contiguous mask row
            mr = m[o:o + n]
            for j in range(n):
                row[j] = x[i, j] * scale if mr[j] else fill
        mx = row_max(row)
        s = x.dtype.type(0.0)
        for j in range(n):
            e = fast_exp(row[j] - mx)
            row[j] = e
            s += e
        inv = 1.0 / s
        for j in range(n):
            row[j] *= inv


@twin(**JIT)
def _masked_rows_backward(g, y, dx, m, moff, mcol, scale):
    """scale * y * (g - sum(g * y)) where the mask keeps, 0 where it does not."""
    n = y.shape[1]
    scale = y.dtype.type(scale)
    zero = y.dtype.type(0.0)
    for i in prange(y.shape[0]):
        o = moff[i]
        s = y.dtype.type(0.0)
        for j in range(n):
            s += g[i, j] * y[i, j]
        if mcol == 0:
            if m[o]:
                for j in range(n):
                    dx[i, j] = y[i, j] * (g[i, j] - s) * scale
            else:
                dx[i, :] = zero
        else:                           # mcol == 1: a contiguous mask row
            mr = m[o:o + n]
            for j in range(n):
                dx[i, j] = y[i, j] * (g[i, j] - s) * scale if mr[j] else zero


def mask_rows(op, mask_shape, shape):
    """Where a C-contiguous bool mask of ``mask_shape``, broadcast to x's
    ``shape`` (..., n), has each row: ``(moff, mcol)``, int64 offsets (one per
    row of x, C order) and the element stride along the last dim (0 or 1), so
    row r's element j is ``mask.reshape(-1)[moff[r] + j * mcol]``.  Shared by
    the CUDA kernels."""
    shape, mask_shape = tuple(shape), tuple(mask_shape)
    nd = len(shape)
    if nd == 0 or len(mask_shape) > nd or any(
            k not in (1, n) for k, n in zip(mask_shape[::-1], shape[::-1])):
        raise ValueError(f"{op} kernel: mask of shape {mask_shape} does not broadcast to x "
                         f"of shape {shape} (over at least one dim)")
    full = (1,) * (nd - len(mask_shape)) + mask_shape
    strides, step = [0] * nd, 1
    for d in range(nd - 1, -1, -1):
        strides[d] = 0 if full[d] == 1 else step
        step *= full[d]
    moff = np.zeros(shape[:-1], np.int64)
    for d in range(nd - 1):
        if strides[d]:
            idx = np.arange(shape[d], dtype=np.int64) * strides[d]
            moff += idx.reshape((-1,) + (1,) * (nd - 2 - d))
    return moff.reshape(-1), strides[-1]


def _masked_args(op, x, mask):
    if mask.dtype != np.bool_:
        raise TypeError(f"{op} kernel: mask must be bool (True: keep), got {mask.dtype}")
    moff, mcol = mask_rows(op, mask.shape, x.shape)
    return np.ascontiguousarray(mask).reshape(-1), moff, mcol


@register("scale_mask_softmax", "cpu")
def scale_mask_softmax(x, mask, scale=1.0, fill_value=-np.inf):
    """softmax(where(mask, x * scale, fill_value), -1); mask bool, broadcasting to x."""
    m, moff, mcol = _masked_args("scale_mask_softmax", x, mask)
    out = np.empty(x.shape, x.dtype)
    if out.size:
        n = x.shape[-1]
        _masked_rows_forward(np.ascontiguousarray(x).reshape(-1, n), out.reshape(-1, n), m,
                             moff, mcol, float(scale), float(fill_value))
    return out


@register("scale_mask_softmax_backward", "cpu")
def scale_mask_softmax_backward(g, y, mask, scale=1.0):
    """The gradient of scale_mask_softmax with respect to x, from its output y."""
    m, moff, mcol = _masked_args("scale_mask_softmax_backward", y, mask)
    dx = np.empty(y.shape, y.dtype)
    if dx.size:
        n = y.shape[-1]
        _masked_rows_backward(np.ascontiguousarray(g).reshape(-1, n),
                              np.ascontiguousarray(y).reshape(-1, n), dx.reshape(-1, n), m, moff,
                              mcol, float(scale))
    return dx


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
