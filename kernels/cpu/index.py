"""Gather / scatter kernels behind indexing, ``gather``, ``scatter_add`` and
``index_select``.

Every kernel sees arrays folded to three axes ``(outer, dim, inner)``: the axes
before the indexed one, the indexed one, the axes after it.  The folding is
done by the op (a reshape of C-contiguous data, no copy), so one numba kernel
serves every rank.  Writes to different ``outer`` rows never collide, which is
what makes the scatter kernels safe to run with ``prange`` over ``outer``;
duplicate indices inside one row are accumulated in order.

Indices reach these kernels already checked and wrapped to ``[0, size)`` by
the op: a numba kernel must never see an out-of-range index (it would read or
write out of bounds silently).

Plain advanced-indexing *forward* (``x[idx]``) uses NumPy's ``take`` / fancy
indexing: it is a C loop of row memcpys that numba cannot beat, and it handles
every NumPy placement rule of advanced indices for free.
"""
import numpy as np
from numba import prange

from ..registry import register
from .twin import twin

_PARALLEL_MIN = 1 << 15   # below this many elements a thread launch costs more than it saves


# Each kernel compiled for the threads and for one (kernels/cpu/twin.py); the
# callers pick with ``_parallel``, which counts the rows prange splits too.
@twin(nogil=True, cache=True)
def _gather3(src, idx, out):
    for o in prange(idx.shape[0]):
        for j in range(idx.shape[1]):
            for i in range(idx.shape[2]):
                out[o, j, i] = src[o, idx[o, j, i], i]


@twin(nogil=True, cache=True)
def _scatter3(dst, idx, src, accumulate):
    for o in prange(idx.shape[0]):
        for j in range(idx.shape[1]):
            for i in range(idx.shape[2]):
                if accumulate:
                    dst[o, idx[o, j, i], i] += src[o, j, i]
                else:
                    dst[o, idx[o, j, i], i] = src[o, j, i]


@twin(nogil=True, cache=True)
def _index_add3(dst, idx, src):
    """dst[o, idx[j], i] += src[o, j, i]: one index shared by all rows."""
    for o in prange(src.shape[0]):
        for j in range(idx.shape[0]):
            r = idx[j]
            for i in range(src.shape[2]):
                dst[o, r, i] += src[o, j, i]


def _parallel(n_outer, n_total):
    return n_outer > 1 and n_total >= _PARALLEL_MIN


@register("gather", "cpu")
def gather(src3, idx3):
    """out[o, j, i] = src3[o, idx3[o, j, i], i] (all C-contiguous, idx int64)."""
    out = np.empty(idx3.shape, src3.dtype)
    if out.size:
        (_gather3.parallel if _parallel(idx3.shape[0], idx3.size) else _gather3.serial)(
            src3, idx3, out)
    return out


@register("scatter", "cpu")
def scatter(dst3, idx3, src3, accumulate):
    """dst3[o, idx3[o, j, i], i] (+)= src3[o, j, i], in place on ``dst3``."""
    if idx3.size:
        fn = _scatter3.parallel if _parallel(idx3.shape[0], idx3.size) else _scatter3.serial
        fn(dst3, idx3, src3, accumulate)
    return dst3


@register("index_add", "cpu")
def index_add(dst3, idx1, src3):
    """dst3[o, idx1[j], i] += src3[o, j, i], in place; duplicates accumulate."""
    if src3.size:
        fn = _index_add3.parallel if _parallel(src3.shape[0], src3.size) else _index_add3.serial
        fn(dst3, idx1, src3)
    return dst3


@register("index_select", "cpu")
def index_select(src, dim, idx1):
    """NumPy ``take``: a C loop of row copies (see the module docstring)."""
    return np.take(src, idx1, axis=dim)


@register("index", "cpu")
def index(src, key):
    """``src[key]`` for a key of full slices and int64 arrays (NumPy's rules)."""
    arrays = [k for k in key if isinstance(k, np.ndarray)]
    if len(arrays) == 1 and isinstance(key[0], np.ndarray) and arrays[0].ndim == 1:
        return np.take(src, key[0], axis=0)    # the embedding-style fast path
    return np.ascontiguousarray(src[key])
