"""Joining and layout kernels: cat, flip, roll, tile, triangle masks, one-hot,
constant padding.

These are pure data movement.  NumPy's ``concatenate`` / ``copyto`` / ``tile``
run as strided memcpy loops in C, which is the roofline for a copy, and they
work on every storage dtype unchanged (bfloat16 words included, since a copy
never looks at the bits); a numba loop would only add a compile per dtype and
layout.  ``one_hot`` is a numba loop: it is a scatter of ones, one pass.
"""
import numpy as np
from numba import njit

from ..registry import register


@register("cat", "cpu")
def cat(arrays, axis):
    return np.concatenate(arrays, axis=axis)


@register("flip", "cpu")
def flip(x, axes):
    return np.ascontiguousarray(np.flip(x, axes))


@register("roll", "cpu")
def roll(x, shifts, axes):
    return np.roll(x, shifts, axes)


@register("tile", "cpu")
def tile(x, reps):
    return np.tile(x, reps)


@register("tril", "cpu")
def tril(x, k):
    n, m = x.shape[-2:]
    keep = np.tri(n, m, k, dtype=bool)
    return np.where(keep, x, np.zeros((), x.dtype))


@register("triu", "cpu")
def triu(x, k):
    n, m = x.shape[-2:]
    drop = np.tri(n, m, k - 1, dtype=bool)
    return np.where(drop, np.zeros((), x.dtype), x)


@njit(nogil=True, cache=True)
def _one_hot(idx, out):
    for i in range(idx.size):
        out[i, idx[i]] = 1


@register("one_hot", "cpu")
def one_hot(idx, num_classes):
    """``idx`` is int64, already checked to lie in ``[0, num_classes)``."""
    flat = np.ascontiguousarray(idx).reshape(-1)
    out = np.zeros((flat.size, num_classes), np.int64)
    _one_hot(flat, out)
    return out.reshape(idx.shape + (num_classes,))


@register("pad_constant", "cpu")
def pad_constant(x, out_shape, src_key, dst_key, value):
    """A ``value``-filled array of ``out_shape`` with ``x[src_key]`` at ``dst_key``."""
    out = np.full(out_shape, value, x.dtype)
    out[dst_key] = x[src_key]
    return out
