"""Reduction kernels.

Two kinds of kernel live here, each where it is the better tool:

* NumPy for plain reductions (sum, mean, prod, amax/amin, var, norms, all/any):
  NumPy's reductions are SIMD loops, and its float sums are *pairwise*, so a
  float32 sum of a million elements keeps ~1e-7 relative error where a naive
  numba loop (float32 accumulator) drifts to ~1e-4.  A numba loop would only
  match it by re-implementing pairwise blocking.  float32 inputs accumulate in
  float32, like PyTorch.
* numba for reductions NumPy cannot do in one pass: the value *and* index of a
  max/min (NumPy needs argmax + take_along_axis: two passes plus a gather),
  argmax/argmin with PyTorch's first-occurrence and NaN-wins rules, cumsum with
  a float64 accumulator (PyTorch CPU accumulates in double; ``np.cumsum`` in
  float32 drifts), and logsumexp (max and sum-of-exp fused per row, no
  temporaries of the input's size).

The numba kernels take the input as a 3-D array ``(outer, n, inner)`` and reduce
(or scan) the middle axis; the op layer folds any shape and dims into that form.
Loops run ``outer, n, inner`` so the innermost loop walks memory contiguously
for C-ordered inputs, whichever axis is reduced.  Rows of logsumexp (inner == 1)
are spread over cores with ``prange`` when there are enough of them to pay for
waking the threads.
"""
import math

import numpy as np
from numba import njit, prange

from ..registry import register

# Below this many elements a parallel launch costs more than it saves (2 cores).
_PARALLEL_MIN = 1 << 16


# ------------------------------------------------------------------ NumPy reductions
@register("sum", "cpu")
def sum_(x, dims, keepdim, out_dtype):
    return np.asarray(np.sum(x, axis=dims, keepdims=keepdim, dtype=out_dtype))


@register("mean", "cpu")
def mean(x, dims, keepdim):
    """sum / count (an empty reduction gives NaN, like PyTorch, without a warning)."""
    count = 1
    for d in dims:
        count *= x.shape[d]
    s = np.sum(x, axis=dims, keepdims=keepdim)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(s / x.dtype.type(count) if count else s * np.nan, dtype=x.dtype)


@register("prod", "cpu")
def prod(x, dims, keepdim, out_dtype):
    return np.asarray(np.prod(x, axis=dims, keepdims=keepdim, dtype=out_dtype))


@register("amax", "cpu")
def amax(x, dims, keepdim):
    """NaN-propagating max over ``dims`` (np.max is SIMD and already propagates NaN)."""
    return np.asarray(np.max(x, axis=dims, keepdims=keepdim))


@register("amin", "cpu")
def amin(x, dims, keepdim):
    return np.asarray(np.min(x, axis=dims, keepdims=keepdim))


@register("var", "cpu")
def var(x, dims, correction, keepdim):
    """Two-pass variance: sum((x - mean)^2) / max(n - correction, 0).

    Two passes (not a one-pass sum of squares) avoid cancellation when the mean
    is large compared with the spread.  A non-positive denominator gives inf/NaN
    like PyTorch (the op layer warns)."""
    count = 1
    for d in dims:
        count *= x.shape[d]
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = np.sum(x, axis=dims, keepdims=True) / x.dtype.type(count)
        dev = np.subtract(x, mu, dtype=x.dtype)
        np.square(dev, out=dev)
        ss = np.sum(dev, axis=dims, keepdims=keepdim)
        return np.asarray(ss / x.dtype.type(max(count - correction, 0)), dtype=x.dtype)


@register("norm", "cpu")
def norm(x, p, dims, keepdim):
    """Vector p-norm over ``dims`` for a finite p (inf norms are amax/amin of |x|)."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if p == 2:
            sq = np.square(x)
            out = np.sqrt(np.sum(sq, axis=dims, keepdims=keepdim))
        elif p == 1:
            out = np.sum(np.abs(x), axis=dims, keepdims=keepdim)
        elif p == 0:
            out = np.sum(x != 0, axis=dims, keepdims=keepdim, dtype=x.dtype)
        else:
            powered = np.power(np.abs(x), x.dtype.type(p))
            out = np.power(np.sum(powered, axis=dims, keepdims=keepdim), x.dtype.type(1.0 / p))
    return np.asarray(out, dtype=x.dtype)


@register("all", "cpu")
def all_(x, dims, keepdim):
    return np.asarray(np.all(x, axis=dims, keepdims=keepdim))


@register("any", "cpu")
def any_(x, dims, keepdim):
    return np.asarray(np.any(x, axis=dims, keepdims=keepdim))


# ------------------------------------------------------------------ max/min with indices
# ``better(v, best)``: v replaces the running best.  Strict comparison keeps the
# first occurrence of ties; a NaN beats any number and the first NaN wins,
# which is PyTorch's rule for max, min, argmax and argmin.
@njit(nogil=True, cache=True, inline="always")
def _beats_max(v, best):
    return v > best or (v != v and best == best)


@njit(nogil=True, cache=True, inline="always")
def _beats_min(v, best):
    return v < best or (v != v and best == best)


def _make_extreme(beats):
    @njit(nogil=True, cache=True)
    def extreme(x, vals, idx):
        """vals[o, i], idx[o, i] = best of x[o, :, i] and its first index."""
        n_outer, n, n_inner = x.shape
        for o in range(n_outer):
            if n_inner == 1:               # a row: keep the running best in registers
                best = x[o, 0, 0]
                at = 0
                for k in range(1, n):
                    v = x[o, k, 0]
                    if beats(v, best):
                        best = v
                        at = k
                vals[o, 0] = best
                idx[o, 0] = at
                continue
            for i in range(n_inner):
                vals[o, i] = x[o, 0, i]
                idx[o, i] = 0
            for k in range(1, n):
                for i in range(n_inner):   # contiguous walk for C-ordered x
                    v = x[o, k, i]
                    if beats(v, vals[o, i]):
                        vals[o, i] = v
                        idx[o, i] = k
    return extreme


_max_with_indices = _make_extreme(_beats_max)
_min_with_indices = _make_extreme(_beats_min)


def _as_numeric(x):
    """numba compares bools awkwardly; uint8 orders them the same way."""
    return x.view(np.uint8) if x.dtype == np.bool_ else x


def _extreme(fn, x3):
    x = _as_numeric(x3)
    vals = np.empty((x.shape[0], x.shape[2]), x.dtype)
    idx = np.empty((x.shape[0], x.shape[2]), np.int64)
    fn(x, vals, idx)
    return vals.view(x3.dtype), idx


@register("max_dim", "cpu")
def max_dim(x3):
    """(values, indices) of the max over axis 1 of ``x3`` (outer, n, inner); n > 0."""
    return _extreme(_max_with_indices, x3)


@register("min_dim", "cpu")
def min_dim(x3):
    return _extreme(_min_with_indices, x3)


@register("argmax", "cpu")
def argmax(x3):
    return _extreme(_max_with_indices, x3)[1]


@register("argmin", "cpu")
def argmin(x3):
    return _extreme(_min_with_indices, x3)[1]


# ------------------------------------------------------------------ scans
@njit(nogil=True, cache=True)
def _cumsum(x, out, acc):
    """out[o, k, i] = sum of x[o, :k+1, i], accumulated in ``acc``'s dtype."""
    n_outer, n, n_inner = x.shape
    for o in range(n_outer):
        acc[:] = 0
        for k in range(n):
            for i in range(n_inner):
                acc[i] += x[o, k, i]
                out[o, k, i] = acc[i]


@register("cumsum", "cpu")
def cumsum(x3, out_dtype, reverse=False):
    """Inclusive prefix sums along axis 1 of ``x3`` (suffix sums if ``reverse``)."""
    x = _as_numeric(x3)
    out = np.empty(x.shape, out_dtype)
    acc = np.empty(x.shape[2], np.float64 if out.dtype.kind == "f" else np.int64)
    if reverse:
        _cumsum(x[:, ::-1, :], out[:, ::-1, :], acc)
    else:
        _cumsum(x, out, acc)
    return out


# ------------------------------------------------------------------ logsumexp
@njit(nogil=True, cache=True, inline="always")
def _shift(m):
    """The max to subtract: an infinite max would turn x - m into NaN, so use 0
    there (an all -inf row then gives log(0) = -inf, a +inf entry gives +inf)."""
    return m if math.isfinite(m) else m * 0.0 if m != m else 0.0


@njit(nogil=True, cache=True)
def _lse_row(x, out, o):
    n = x.shape[1]
    m = x[o, 0, 0]
    for k in range(1, n):
        v = x[o, k, 0]
        if v > m or v != v:
            m = v
    if m != m:
        out[o, 0] = m
        return
    s = _shift(m)
    total = 0.0
    for k in range(n):
        total += math.exp(x[o, k, 0] - s)
    out[o, 0] = math.log(total) + s


@njit(nogil=True, cache=True)
def _lse_rows_serial(x, out):
    for o in range(x.shape[0]):
        _lse_row(x, out, o)


@njit(nogil=True, cache=True, parallel=True)
def _lse_rows_parallel(x, out):
    for o in prange(x.shape[0]):
        _lse_row(x, out, o)


@njit(nogil=True, cache=True)
def _lse_cols(x, out, m, total):
    """logsumexp over axis 1 with inner > 1: running max per column, then sum."""
    n_outer, n, n_inner = x.shape
    for o in range(n_outer):
        for i in range(n_inner):
            m[i] = x[o, 0, i]
        for k in range(1, n):
            for i in range(n_inner):
                v = x[o, k, i]
                if v > m[i] or v != v:
                    m[i] = v
        for i in range(n_inner):
            m[i] = _shift(m[i])
            total[i] = 0.0
        for k in range(n):
            for i in range(n_inner):
                total[i] += math.exp(x[o, k, i] - m[i])
        for i in range(n_inner):
            out[o, i] = math.log(total[i]) + m[i]


@register("logsumexp", "cpu")
def logsumexp(x3):
    """log(sum(exp(x))) over axis 1 of ``x3`` (outer, n, inner), n > 0, float."""
    out = np.empty((x3.shape[0], x3.shape[2]), x3.dtype)
    if x3.shape[1] == 0:         # an empty sum: log(0)
        out.fill(-np.inf)
    elif x3.shape[2] == 1:
        rows = _lse_rows_parallel if x3.size >= _PARALLEL_MIN and x3.shape[0] > 1 \
            else _lse_rows_serial
        rows(x3, out)
    else:
        _lse_cols(x3, out, np.empty(x3.shape[2], x3.dtype), np.empty(x3.shape[2], np.float64))
    return out
