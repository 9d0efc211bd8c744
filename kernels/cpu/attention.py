"""Fused attention (numba), forward and backward, flash-attention style:

    out = softmax(masked_fill((q @ k^T) * scale, masked, -inf)) @ v

in one kernel per direction instead of a matmul, a mul, a masked fill, a
softmax, a matmul and five backward kernels, each with its own (..., T, S)
output.  Nothing of size T x S is written to memory: the forward keeps one row
of scores at a time and saves the log-sum-exp of each row (``lse``); the
backward recomputes the probabilities of a row from it,
``P = exp(s - lse)``, and with ``D_i = dout_i . out_i``:

    dS = P * (dout @ v^T - D) (0 where masked),   dq = scale * dS @ k,
    dk = scale * dS^T @ q,                        dv = P^T @ dout

One ``prange`` iteration per (batch, head) matrix: dk and dv of a head are
summed by that iteration alone, so there are no races.  A head's k and v are
copied into contiguous scratch (k also transposed, so the scores of a query
row are a sum of scaled key columns that vectorizes over the keys without a
horizontal sum); that is O(S * E) per head against O(T * S * E) of work.  q,
k, v, dout and the mask are read through their strides ('A' layout), so the
views attention is fed (``qkv.split(...)`` then ``view`` + ``transpose``) are
not copied.

Semantics are the unfused chain's, rounding aside: the scores are
``dot(q_i, k_j) * scale`` as ``(q @ k^T) * scale`` computes them, and a row
whose scores are all masked is NaN (the softmax of nothing), its gradient as
the chain's backward makes it: dq of the row 0, dv NaN.  Causally masked
positions (key j > query i, PyTorch's top-left aligned ``is_causal``) are
skipped, neither computed nor read, unless skipping would change a result: a
non-finite value in the head's k or v (0 * inf is NaN in the chain's matmuls),
or a NaN row; those rows run over every key with the masked positions as zeros.
``zero_empty_rows`` gives PyTorch SDPA's rule instead: a row that keeps no key
is 0, with zero gradients (its lse is -inf).

float32 and float64, computed in the input dtype (the op layer computes
float16/bfloat16 in float32).  ``exp`` is ``fast_exp`` as in the softmax
kernels (softmax.py says why).
"""
import math

import numpy as np
from numba import njit, prange

from ..registry import register
from . import twin as _twin
from .fastmath import fast_exp
from .softmax import JIT, row_max
from .twin import twin

# Multiply-adds (T * S * (E + Ev) per head, all heads) from which a call runs on
# the threads: measured on this project's 2-core machine (docs in the report of
# issue 16), a GPT-mini layer (8 x 4 heads of 32 x 32 x 16, 2**20) gains from
# two threads only when they are idle.  Scaled from twin.PARALLEL_MIN so that
# tests patching it move this rule too.
WORK_PER_ELEMENT = 8


def _pick(kernel, heads, work):
    """The parallel compilation when there are heads to share and work to pay
    for the threads, else the serial one."""
    if heads > 1 and work >= _twin.PARALLEL_MIN * WORK_PER_ELEMENT:
        return kernel.parallel
    return kernel.serial


# ------------------------------------------------------------------ pieces
# A head is worked on in blocks of BLOCK query rows, every product as
# ``c[m, :n] += a[k, m] * b[k, :n]``: the innermost loop runs along a row of
# keys (or of queries) of b and c, contiguous scratch, long enough to vectorize
# well (loops along E, 16 or 64 long, measured 2-3x slower here).
BLOCK = 64


@njit(**JIT)
def _acc(c, a, b, lim, lo):
    """c[m, :n] += sum over k of a[k, m] * b[k, :n], with n = min(lim[lo + m],
    c's width) when ``lim`` has entries (a causal row's keys), else the width.
    Eight k at a time: one load and store of c per eight products (measured
    45 against 23 GFLOP/s float32 on 64 x 128 x 64; the same on 32 x 32 x 16)."""
    N, K = c.shape[1], a.shape[0]
    for m in range(c.shape[0]):
        n = min(N, lim[lo + m]) if lim.shape[0] else N
        cm = c[m]
        kk = 0
        while kk + 8 <= K:
            a0, a1, a2, a3 = a[kk, m], a[kk + 1, m], a[kk + 2, m], a[kk + 3, m]
            a4, a5, a6, a7 = a[kk + 4, m], a[kk + 5, m], a[kk + 6, m], a[kk + 7, m]
            b0, b1, b2, b3 = b[kk], b[kk + 1], b[kk + 2], b[kk + 3]
            b4, b5, b6, b7 = b[kk + 4], b[kk + 5], b[kk + 6], b[kk + 7]
            for j in range(n):
                cm[j] += (a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j]) + \
                    (a4 * b4[j] + a5 * b5[j] + a6 * b6[j] + a7 * b7[j])
            kk += 8
        for k2 in range(kk, K):
            amk = a[k2, m]
            for j in range(n):
                cm[j] += amk * b[k2, j]


@njit(**JIT)
def _load(x, a, h, r0, r1, xt, xr, cols, rows):
    """Copy rows r0:r1 of head (a, h) of x (.., n, d): with ``cols`` into xt
    (d, r1 - r0), transposed, with ``rows`` into xr (r1 - r0, d).  True when
    every value is finite."""
    bad = x.dtype.type(0.0)             # stays 0 unless some val is inf or NaN (0 * inf)
    for j in range(r0, r1):
        for e in range(x.shape[3]):
            val = x[a, h, j, e]
            if cols:
                xt[e, j - r0] = val
            if rows:
                xr[j - r0, e] = val
            bad += val * 0.0
    return bad == 0.0


@njit(**JIT)
def _masked(mask, has_mask, causal, a, h, i, j):
    return (has_mask and mask[a, h, i, j]) or (causal and j > i)


@njit(**JIT)
def _scores(qt, kt, lim, i0, s, mask, has_mask, causal, a, h, scale):
    """s[r, :lim] = dot(q_i, k_j) * scale of rows i = i0 + r, the masked ones
    -inf, 0 from lim on; returns how many keys each row keeps (``kept``)."""
    T = s.shape[0]
    s[:, :] = 0.0
    _acc(s, qt, kt, lim, i0)
    kept = np.empty(T, np.int64)
    for r in range(T):
        i, n = i0 + r, lim[i0 + r]
        kept[r] = n
        for j in range(n):
            s[r, j] *= scale
        if has_mask or (causal and n > i + 1):
            for j in range(n):
                if _masked(mask, has_mask, causal, a, h, i, j):
                    s[r, j] = -np.inf
                    kept[r] -= 1
    return kept


# ------------------------------------------------------------------ forward
@twin(**JIT)
def _forward(q, k, v, mask, has_mask, scale, causal, zero_empty, out, lse):
    A, H, T, E = q.shape
    S, Ev = k.shape[2], v.shape[3]
    scale = q.dtype.type(scale)         # a float32 row stays float32 (vectorized)
    one = q.dtype.type(1.0)
    for bh in prange(A * H):
        a, h = bh // H, bh % H
        kt = np.empty((E, S), q.dtype)
        vh = np.empty((S, Ev), q.dtype)
        _load(k, a, h, 0, S, kt, kt, True, False)
        finite = _load(v, a, h, 0, S, vh, vh, False, True)  # skipping j > i needs 0 * v_j == 0
        lim = np.empty(T, np.int64)     # keys each row reads: j > i skipped when causal
        for i in range(T):
            lim[i] = min(S, i + 1) if causal and finite else S
        for i0 in range(0, T, BLOCK):
            i1 = min(T, i0 + BLOCK)
            qt = np.empty((E, i1 - i0), q.dtype)
            _load(q, a, h, i0, i1, qt, qt, True, False)
            s = np.empty((i1 - i0, S), q.dtype)
            kept = _scores(qt, kt, lim, i0, s, mask, has_mask, causal, a, h, scale)
            pt = np.zeros((S, i1 - i0), q.dtype)     # probabilities, transposed
            for r in range(i1 - i0):
                i, n = i0 + r, lim[i0 + r]
                if zero_empty and kept[r] == 0:
                    lse[a, h, i] = -np.inf      # the row stays 0 in pt
                    continue
                m = row_max(s[r, :n])       # -inf when all masked: then NaN, as the chain
                tot = q.dtype.type(0.0)
                for j in range(n):
                    ej = fast_exp(s[r, j] - m)
                    s[r, j] = ej
                    tot += ej
                inv = one / tot
                for j in range(n):
                    pt[j, r] = s[r, j] * inv
                lse[a, h, i] = m + math.log(tot)
            ot = np.zeros((Ev, i1 - i0), q.dtype)
            _acc(ot, vh[:lim[i1 - 1]], pt[:lim[i1 - 1]], lim[:0], 0)
            for r in range(i1 - i0):
                for e in range(Ev):
                    out[a, h, i0 + r, e] = ot[e, r]


# ------------------------------------------------------------------ backward
@twin(**JIT)
def _backward(g, q, k, v, out, lse, mask, has_mask, scale, causal, zero_empty, dq, dk, dv):
    A, H, T, E = q.shape
    S, Ev = k.shape[2], v.shape[3]
    scale = q.dtype.type(scale)
    for bh in prange(A * H):
        a, h = bh // H, bh % H
        kt = np.empty((E, S), q.dtype)
        kh = np.empty((S, E), q.dtype)
        vt = np.empty((Ev, S), q.dtype)
        finite = _load(k, a, h, 0, S, kt, kh, True, True)
        finite = _load(v, a, h, 0, S, vt, vt, True, False) and finite
        dkt = np.zeros((E, S), q.dtype)
        dvt = np.zeros((Ev, S), q.dtype)
        lim = np.empty(T, np.int64)
        for i0 in range(0, T, BLOCK):
            i1 = min(T, i0 + BLOCK)
            Tb = i1 - i0
            qt = np.empty((E, Tb), q.dtype)
            qh = np.empty((Tb, E), q.dtype)
            _load(q, a, h, i0, i1, qt, qh, True, True)
            gt = np.empty((Ev, Tb), q.dtype)
            gh = np.empty((Tb, Ev), q.dtype)
            _load(g, a, h, i0, i1, gt, gh, True, True)
            D = np.zeros(Tb, q.dtype)
            for r in range(Tb):
                for e in range(Ev):
                    D[r] += gh[r, e] * out[a, h, i0 + r, e]
                # j > i contributes exact zeros only if everything it multiplies is finite
                L = lse[a, h, i0 + r]
                skip = causal and finite and math.isfinite(L) and math.isfinite(D[r])
                lim[i0 + r] = min(S, i0 + r + 1) if skip else S
            p = np.empty((Tb, S), q.dtype)
            _scores(qt, kt, lim, i0, p, mask, has_mask, causal, a, h, scale)
            ds = np.zeros((Tb, S), q.dtype)
            _acc(ds, gt, vt, lim, i0)                       # dP = dout @ v^T
            dst = np.zeros((S, Tb), q.dtype)
            for r in range(Tb):
                i, n, L = i0 + r, lim[i0 + r], lse[a, h, i0 + r]
                if zero_empty and L == -np.inf:     # (only rows that kept no key have -inf)
                    p[r, :] = 0.0
                    ds[r, :] = 0.0
                    continue
                for j in range(n):
                    p[r, j] = fast_exp(p[r, j] - L)
                    ds[r, j] = p[r, j] * (ds[r, j] - D[r]) * scale
                if has_mask or (causal and n > i + 1):
                    for j in range(n):      # the masked fill's backward: 0 where masked
                        if _masked(mask, has_mask, causal, a, h, i, j):
                            ds[r, j] = 0.0
                p[r, n:] = 0.0
                for j in range(n):
                    dst[j, r] = ds[r, j]
            dqt = np.zeros((E, Tb), q.dtype)
            _acc(dqt, kh, dst, lim[:0], 0)                  # dq = dS @ k
            for r in range(Tb):
                for e in range(E):
                    dq[a, h, i0 + r, e] = dqt[e, r]
            _acc(dkt, qh, ds, lim[:0], 0)                   # dk += dS^T @ q
            _acc(dvt, gh, p, lim[:0], 0)                    # dv += P^T @ dout
        for j in range(S):
            for e in range(E):
                dk[a, h, j, e] = dkt[e, j]
            for e in range(Ev):
                dv[a, h, j, e] = dvt[e, j]


# ------------------------------------------------------------------ entry points
def _heads(x):
    """x (..., n, d) as a 4-D (A, H, n, d) view: 2-D and 3-D get leading 1s; more
    leading dims are merged into A, which copies when their strides do not allow
    a view (numpy's reshape; rare: attention has batch and head dims)."""
    if x.ndim == 4:
        return x
    if x.ndim < 4:
        return x.reshape((1,) * (4 - x.ndim) + x.shape)
    return x.reshape((-1,) + x.shape[-3:])


def _check(q, k, v, masked):
    op = "attention kernel"
    if q.ndim < 2 or not (q.ndim == k.ndim == v.ndim):
        raise ValueError(f"{op}: q, k, v must be (..., T, E), (..., S, E), (..., S, Ev) of one "
                         f"rank, got shapes {q.shape}, {k.shape}, {v.shape}")
    if q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2] \
            or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{op}: q, k, v must be (..., T, E), (..., S, E), (..., S, Ev) with "
                         f"the same leading dims, got shapes {q.shape}, {k.shape}, {v.shape}")
    if q.dtype not in (np.float32, np.float64) or not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"{op}: q, k, v must be all float32 or all float64, got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    scores = q.shape[:-1] + (k.shape[-2],)
    if masked is None:
        return np.zeros((1, 1, 1, 1), bool), False
    if masked.dtype != np.bool_:
        raise TypeError(f"{op}: masked must be a bool array, got {masked.dtype}")
    try:
        m = np.broadcast_to(masked, scores)     # 0 strides where it broadcasts, read-only
    except ValueError:
        raise ValueError(f"{op}: masked of shape {masked.shape} does not broadcast to the "
                         f"scores' shape {scores}") from None
    return _heads(m), True


@register("attention_forward", "cpu")
def attention_forward(q, k, v, masked, scale, causal, zero_empty_rows=False):
    """(out (..., T, Ev), lse (..., T)) of softmax(masked_fill(q @ k^T * scale,
    masked, -inf)) @ v; ``masked`` (True: masked out) broadcasts to (..., T, S)
    or is None; ``causal`` also masks key j > query i."""
    mask, has_mask = _check(q, k, v, masked)
    T, S, Ev = q.shape[-2], k.shape[-2], v.shape[-1]
    out = np.empty(q.shape[:-1] + (Ev,), q.dtype)
    lse = np.empty(q.shape[:-1], q.dtype)
    if out.size == 0 and lse.size == 0:
        return out, lse
    if S == 0:      # a softmax over no key: empty rows, out = P @ v = 0, log(0) = -inf
        out[...] = 0.0
        lse[...] = -np.inf
        return out, lse
    q4, k4, v4 = _heads(q), _heads(k), _heads(v)
    heads = q4.shape[0] * q4.shape[1]
    kernel = _pick(_forward, heads, heads * T * S * (q.shape[-1] + Ev))
    kernel(q4, k4, v4, mask, has_mask, float(scale), bool(causal), bool(zero_empty_rows),
           _heads(out), lse.reshape(q4.shape[:3]))
    return out, lse


@register("attention_backward", "cpu")
def attention_backward(dout, q, k, v, out, lse, masked, scale, causal, zero_empty_rows=False):
    """(dq, dk, dv) of ``attention_forward`` from the gradient ``dout`` of its
    output, its inputs and its (out, lse)."""
    mask, has_mask = _check(q, k, v, masked)
    if dout.shape != out.shape or lse.shape != out.shape[:-1]:
        raise ValueError(f"attention kernel: dout {dout.shape}, out {out.shape} and lse "
                         f"{lse.shape} do not match")
    dq = np.empty(q.shape, q.dtype)
    dk = np.empty(k.shape, q.dtype)
    dv = np.empty(v.shape, q.dtype)
    T, S, E, Ev = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    if S == 0 or T == 0 or dq.size + dk.size + dv.size == 0:
        dq[...], dk[...], dv[...] = 0.0, 0.0, 0.0
        return dq, dk, dv
    q4 = _heads(q)
    heads = q4.shape[0] * q4.shape[1]
    kernel = _pick(_backward, heads, 2 * heads * T * S * (E + Ev))
    kernel(_heads(dout.astype(q.dtype, copy=False)), q4, _heads(k), _heads(v),
           _heads(out.astype(q.dtype, copy=False)), lse.astype(q.dtype, copy=False).reshape(
               q4.shape[:3]), mask, has_mask, float(scale), bool(causal), bool(zero_empty_rows),
           _heads(dq), _heads(dk), _heads(dv))
    return dq, dk, dv
