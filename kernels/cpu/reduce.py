"""Reduction kernels: NumPy where NumPy is the better tool, numba where it is not.

* NumPy for plain reductions (sum, mean, amax/amin, var, all/any, logsumexp):
  NumPy's reductions are SIMD loops and its float sums are *pairwise*, so a
  float32 sum of a million elements keeps ~1e-7 relative error where a plain
  numba loop with a float32 accumulator drifts to ~1e-4; numba would have to re-implement pairwise blocking to match.  float32 inputs
  accumulate in float32, like PyTorch.  logsumexp's cost is exp, which NumPy
  does with SIMD and numba (no SVML) with a scalar libm call.
* Row max/argmax (reducing the contiguous last axis) is ``np.argmax``: a SIMD
  loop with PyTorch's rules (first occurrence of ties; the first NaN wins).
* numba where NumPy is slow or lacks the operation: max/min *with indices* and
  argmax/argmin over a strided axis (``np.argmax(x, axis=0)`` walks memory
  column by column, ~30x slower than the loop below), and cumsum with a float64
  accumulator (PyTorch's CPU kernel accumulates in double; ``np.cumsum`` in
  float32 drifts, and is 4x slower along rows), and prod and the 1-/2-norms
  (a vectorized fold with a float64 accumulator, 3-4x faster than NumPy).

The numba kernels take the input as a 3-D array ``(outer, n, inner)`` and reduce
(or scan) the middle axis; the op layer folds any shape and dims into that form.
Loops run ``outer, n, inner`` so the innermost loop walks memory contiguously
for C-ordered inputs whichever axis is reduced; rows (inner == 1) keep their
running value in a register.
"""
from builtins import any as builtins_any, max as builtins_max

import numpy as np
from numba import njit

from ..registry import register

# ------------------------------------------------------------------ NumPy reductions
@register("sum", "cpu")
def sum_(x, dims, keepdim, out_dtype):
    # np.sum's own reduction of an ndarray, without its Python wrappers (2 us)
    return np.asarray(np.add.reduce(x, axis=dims, dtype=out_dtype, keepdims=keepdim))


@register("mean", "cpu")
def mean(x, dims, keepdim):
    """sum / count (an empty reduction gives NaN, like PyTorch, without a warning)."""
    count = 1
    for d in dims:
        count *= x.shape[d]
    s = np.sum(x, axis=dims, keepdims=keepdim)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(s / x.dtype.type(count) if count else s * np.nan, dtype=x.dtype)


# ------------------------------------------------------------------ numba folds
# prod and the 1- and 2-norms fold with a float64 (int64 for integers)
# accumulator.  ``fastmath={"reassoc"}`` lets LLVM vectorize the fold (it
# reorders the additions, which a float64 accumulator makes harmless): 3-4x
# faster than NumPy's square + pairwise sum, and more accurate for float32.
# One kernel with a ``step`` code rather than a factory of closures: numba's
# on-disk cache misses on closures over other jitted functions, which would
# recompile them in every process.
_TIMES, _PLUS_ABS, _PLUS_SQUARE = 0, 1, 2


@njit(nogil=True, cache=True, inline="always")
def _step(step, total, v):
    if step == _TIMES:
        return total * v
    if step == _PLUS_ABS:
        return total + abs(v)
    return total + v * v


@njit(nogil=True, cache=True, fastmath={"reassoc"})
def _fold_kernel(x, out, acc, init, step):
    """out[o, i] = ``step``-fold of x[o, :, i], starting from ``init``.  ``step``
    is loop-invariant, so LLVM unswitches the loops and vectorizes each copy."""
    n_outer, n, n_inner = x.shape
    for o in range(n_outer):
        acc[:] = init
        if n_inner == 1:                   # a row: the running value stays in a register
            total = acc[0]
            for k in range(n):
                total = _step(step, total, x[o, k, 0])
            out[o, 0] = total
            continue
        for k in range(n):
            for i in range(n_inner):       # contiguous walk for C-ordered x
                acc[i] = _step(step, acc[i], x[o, k, i])
        for i in range(n_inner):
            out[o, i] = acc[i]


def _fold(step, x3, init, out_dtype):
    x = _as_numeric(x3)
    out = np.empty((x.shape[0], x.shape[2]), out_dtype)
    acc = np.empty(builtins_max(x.shape[2], 1), np.float64 if out.dtype.kind == "f" else np.int64)
    _fold_kernel(x, out, acc, acc.dtype.type(init), step)
    return out


@register("prod", "cpu")
def prod(x3, out_dtype):
    """Product over axis 1 of ``x3`` (outer, n, inner); 1 for an empty axis."""
    return _fold(_TIMES, x3, 1, out_dtype)


def _trailing_extreme(x, dims, keepdim, np_arg, np_reduce):
    """max/min over ``dims``.  When ``dims`` are the trailing axes the slices are
    rows, and ``np.argmax`` + a gather is faster than ``np.max`` (2.3x on
    4096x64 float32: argmax's SIMD loop has less per-row overhead); it keeps
    NaN propagation, since argmax returns the first NaN's index."""
    if dims and dims[-1] == x.ndim - 1 and dims[0] == x.ndim - len(dims) and x.size:
        rows = x.reshape(-1, int(np.prod(x.shape[dims[0]:], dtype=np.int64)))
        best = np.take_along_axis(rows, np_arg(rows, axis=1)[:, None], axis=1)
        return best.reshape(_reduced(x.shape, dims, keepdim))
    return np.asarray(np_reduce(x, axis=dims, keepdims=keepdim))


@register("amax", "cpu")
def amax(x, dims, keepdim):
    """NaN-propagating max over ``dims``."""
    return _trailing_extreme(x, dims, keepdim, np.argmax, np.max)


@register("amin", "cpu")
def amin(x, dims, keepdim):
    return _trailing_extreme(x, dims, keepdim, np.argmin, np.min)


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
        dev = np.square(dev, out=dev) if dev.ndim else dev * dev   # 0-d gives a scalar
        ss = np.sum(dev, axis=dims, keepdims=keepdim)
        return np.asarray(ss / x.dtype.type(max(count - correction, 0)), dtype=x.dtype)


@register("norm", "cpu")
def norm(x3, p):
    """Vector p-norm over axis 1 of ``x3`` (outer, n, inner) for a finite p (the
    inf norms are amax/amin of |x|).  p = 1, 2: the numba folds above; other p
    need a power per element, which NumPy does with SIMD."""
    dtype = x3.dtype
    if p == 2:
        return np.sqrt(_fold(_PLUS_SQUARE, x3, 0, np.float64)).astype(dtype, copy=False)
    if p == 1:
        return _fold(_PLUS_ABS, x3, 0, dtype)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if p == 0:
            return np.sum(x3 != 0, axis=1, dtype=dtype)
        powered = np.power(np.abs(x3), dtype.type(p))
        return np.power(np.sum(powered, axis=1), dtype.type(1.0 / p)).astype(dtype, copy=False)


@register("all", "cpu")
def all_(x, dims, keepdim):
    return np.asarray(np.all(x, axis=dims, keepdims=keepdim))


@register("any", "cpu")
def any_(x, dims, keepdim):
    return np.asarray(np.any(x, axis=dims, keepdims=keepdim))


# ------------------------------------------------------------------ max/min with indices
# A candidate v replaces the running best when it is strictly better (so the
# first occurrence of a tie stays), or when it is the first NaN: NaN beats any
# number and the first NaN wins, PyTorch's rule for max, min, argmax, argmin.
@njit(nogil=True, cache=True, inline="always")
def _beats(is_max, v, best):
    better = v > best if is_max else v < best
    return better or (v != v and best == best)


@njit(nogil=True, cache=True)
def _extreme_kernel(x, vals, idx, is_max):
    """vals[o, i], idx[o, i] = best of x[o, :, i] and its first index."""
    n_outer, n, n_inner = x.shape
    for o in range(n_outer):
        for i in range(n_inner):
            vals[o, i] = x[o, 0, i]
            idx[o, i] = 0
        for k in range(1, n):
            for i in range(n_inner):       # contiguous walk for C-ordered x
                v = x[o, k, i]
                if _beats(is_max, v, vals[o, i]):
                    vals[o, i] = v
                    idx[o, i] = k


def _as_numeric(x):
    """numba compares bools awkwardly; uint8 orders them the same way."""
    return x.view(np.uint8) if x.dtype == np.bool_ else x


def _extreme(is_max, x3):
    """(values, first indices) of the best over axis 1 of ``x3``.

    Rows (inner == 1) go to NumPy's argmax/argmin: they are SIMD loops with the
    same first-occurrence and first-NaN rules, about 6x faster than a scalar
    numba loop (LLVM does not vectorize a compare-and-select reduction that
    also carries an index).  Strided reductions (inner > 1) are the numba
    kernel, whose inner loop runs along contiguous memory where NumPy's argmax
    over a leading axis is ~30x slower."""
    x = _as_numeric(x3)
    if x.shape[2] == 1:
        rows = x[:, :, 0]
        idx = (np.argmax if is_max else np.argmin)(rows, axis=1)
        vals = np.take_along_axis(rows, idx[:, None], axis=1)
        return vals.view(x3.dtype), idx.reshape(-1, 1).astype(np.int64, copy=False)
    vals = np.empty((x.shape[0], x.shape[2]), x.dtype)
    idx = np.empty((x.shape[0], x.shape[2]), np.int64)
    _extreme_kernel(x, vals, idx, is_max)
    return vals.view(x3.dtype), idx


@register("max_dim", "cpu")
def max_dim(x3):
    """(values, indices) of the max over axis 1 of ``x3`` (outer, n, inner); n > 0."""
    return _extreme(True, x3)


@register("min_dim", "cpu")
def min_dim(x3):
    return _extreme(False, x3)


@register("argmax", "cpu")
def argmax(x3):
    return _extreme(True, x3)[1]


@register("argmin", "cpu")
def argmin(x3):
    return _extreme(False, x3)[1]


# ------------------------------------------------------------------ scans
@njit(nogil=True, cache=True)
def _cumsum(x, out, acc):
    """out[o, k, i] = sum of x[o, :k+1, i], accumulated in ``acc``'s dtype."""
    n_outer, n, n_inner = x.shape
    for o in range(n_outer):
        if n_inner == 1:                   # a row: the running sum stays in a register
            total = acc[0] * 0
            for k in range(n):
                total += x[o, k, 0]
                out[o, k, 0] = total
            continue
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
    acc = np.zeros(builtins_max(x.shape[2], 1), np.float64 if out.dtype.kind == "f" else np.int64)
    if reverse:
        _cumsum(x[:, ::-1, :], out[:, ::-1, :], acc)
    else:
        _cumsum(x, out, acc)
    return out


# ------------------------------------------------------------------ logsumexp
@register("logsumexp", "cpu")
def logsumexp(x, dims, keepdim):
    """m + log(sum(exp(x - m))) over ``dims`` with m the max (no overflow).

    NumPy, not a numba row kernel: the cost is exp, and NumPy's SIMD exp is ~5x
    faster than numba's scalar libm call (see kernels/cpu/__init__); a fused
    numba row kernel measured 8 ms against 1.3 ms for these four NumPy passes
    on 1024x1024 float32.  An infinite max is replaced by 0 before the shift,
    so an all -inf slice gives -inf and a +inf entry gives +inf (PyTorch)."""
    if not dims:
        return np.array(x, copy=True)
    if builtins_any(x.shape[d] == 0 for d in dims):      # an empty sum: log(0)
        return np.full(_reduced(x.shape, dims, keepdim), -np.inf, x.dtype)
    m = amax(x, dims, True)
    shift = np.where(np.isinf(m), x.dtype.type(0), m)
    tmp = np.subtract(x, shift, dtype=x.dtype)
    np.exp(tmp, out=tmp)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(tmp, axis=dims, keepdims=True))
    out += shift
    return out if keepdim else out.reshape(_reduced(x.shape, dims, False))


def _reduced(shape, dims, keepdim):
    return tuple(1 if i in dims else s for i, s in enumerate(shape) if keepdim or i not in dims)
