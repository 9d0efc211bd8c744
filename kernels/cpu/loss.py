"""Loss kernels: fused log_softmax + NLL (cross entropy), NLL gather/scatter
(numba), and binary cross entropy with logits (NumPy).

Cross entropy never materializes log-probabilities: per row it finds the max,
the log-sum-exp (saved for the backward), the target logit and, with label
smoothing, the weighted logit sum; the backward rebuilds softmax from the
saved log-sum-exp in the same pass that writes the gradient.

binary_cross_entropy_with_logits is elementwise with broadcasting and its cost
is exp and log1p, which NumPy's SIMD ufuncs do best (see kernels/cpu/__init__).
"""
import math

import numpy as np
from numba import prange

from ..registry import register
from .fastmath import fast_exp
from .softmax import FASTMATH, row_max
from .twin import twin

JIT = dict(nogil=True, cache=True, fastmath=FASTMATH, error_model="numpy")


# ------------------------------------------------------------------ cross entropy
@twin(**JIT)
def _cross_entropy_forward(x, target, w, ignore_index, smoothing, loss, lse):
    """loss_i = (1-e) * w[t] * (lse - x[t]) + e/C * sum_c w[c] * (lse - x[c])."""
    rows, C = x.shape
    wsum = 0.0
    for c in range(C):
        wsum += w[c]
    for i in prange(rows):
        m = row_max(x[i])
        s = x.dtype.type(0.0)
        for c in range(C):
            s += fast_exp(x[i, c] - m)
        l = m + math.log(s)
        lse[i] = l
        t = target[i]
        if t == ignore_index:
            loss[i] = 0.0
            continue
        v = (1.0 - smoothing) * w[t] * (l - x[i, t])
        if smoothing > 0.0:
            wx = 0.0
            for c in range(C):
                wx += w[c] * x[i, c]
            v += smoothing / C * (wsum * l - wx)
        loss[i] = v


@twin(size_of=1, **JIT)
def _cross_entropy_backward(g, x, target, w, ignore_index, smoothing, lse, dx):
    """dx = g_i * ((1-e) * w[t] * (p - onehot(t)) + e/C * (sum(w) * p - w))."""
    rows, C = x.shape
    wsum = 0.0
    for c in range(C):
        wsum += w[c]
    for i in prange(rows):
        t = target[i]
        if t == ignore_index:
            for c in range(C):
                dx[i, c] = 0.0
            continue
        a = g[i] * (1.0 - smoothing) * w[t]
        b = g[i] * smoothing / C
        pw = a + b * wsum
        l = lse[i]
        for c in range(C):
            dx[i, c] = pw * fast_exp(x[i, c] - l) - b * w[c]
        dx[i, t] -= a


@register("cross_entropy", "cpu")
def cross_entropy(x, target, w, ignore_index, smoothing):
    """x (M, C) logits, target (M,) int64 (validated), w (C,) or None.
    Returns per-row losses (M,) and log-sum-exps (M,)."""
    x = np.ascontiguousarray(x)
    rows, C = x.shape
    w = np.ones(C, x.dtype) if w is None else np.ascontiguousarray(w, x.dtype)
    loss, lse = np.empty(rows, x.dtype), np.empty(rows, x.dtype)
    if rows:
        _cross_entropy_forward(x, np.ascontiguousarray(target, np.int64), w, int(ignore_index),
                               float(smoothing), loss, lse)
    return loss, lse


@register("cross_entropy_backward", "cpu")
def cross_entropy_backward(g, x, target, w, ignore_index, smoothing, lse):
    x = np.ascontiguousarray(x)
    C = x.shape[1]
    w = np.ones(C, x.dtype) if w is None else np.ascontiguousarray(w, x.dtype)
    dx = np.empty_like(x)
    if x.shape[0]:
        _cross_entropy_backward(np.ascontiguousarray(g, x.dtype), x,
                                np.ascontiguousarray(target, np.int64), w, int(ignore_index),
                                float(smoothing), lse, dx)
    return dx


# ------------------------------------------------------------------ nll
@twin(nogil=True, cache=True)
def _nll_forward(x, target, w, ignore_index, loss):
    for i in prange(x.shape[0]):
        t = target[i]
        loss[i] = 0.0 if t == ignore_index else -w[t] * x[i, t]


@twin(size_of=4, nogil=True, cache=True)
def _nll_backward(g, target, w, ignore_index, dx):
    for i in prange(dx.shape[0]):
        for c in range(dx.shape[1]):
            dx[i, c] = 0.0
        t = target[i]
        if t != ignore_index:
            dx[i, t] = -w[t] * g[i]


@register("nll_loss", "cpu")
def nll_loss(x, target, w, ignore_index):
    """x (M, C) log-probabilities -> per-row -w[t] * x[t] (0 where ignored)."""
    C = x.shape[1]
    w = np.ones(C, x.dtype) if w is None else np.ascontiguousarray(w, x.dtype)
    loss = np.empty(x.shape[0], x.dtype)
    _nll_forward(x, np.ascontiguousarray(target, np.int64), w, int(ignore_index), loss)
    return loss


@register("nll_loss_backward", "cpu")
def nll_loss_backward(g, target, w, ignore_index, C):
    M = target.shape[0]
    dtype = g.dtype
    w = np.ones(C, dtype) if w is None else np.ascontiguousarray(w, dtype)
    dx = np.empty((M, C), dtype)
    _nll_backward(np.ascontiguousarray(g), np.ascontiguousarray(target, np.int64), w,
                  int(ignore_index), dx)
    return dx


# ------------------------------------------------------------------ bce with logits
@register("bce_with_logits", "cpu")
def bce_with_logits(x, y, pos_weight):
    """Unweighted elementwise loss (1-y)*x + (1 + (pw-1)*y) * softplus(-x), and
    softplus(-x) = log1p(exp(-|x|)) + max(-x, 0), the stable form (no overflow)."""
    softplus_neg = np.log1p(np.exp(-np.abs(x))) + np.maximum(-x, 0)
    log_weight = 1.0 if pos_weight is None else 1.0 + (pos_weight - 1.0) * y
    return ((1.0 - y) * x + log_weight * softplus_neg).astype(x.dtype, copy=False), softplus_neg
