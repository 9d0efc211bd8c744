"""Dropout's masked scaling (numba): out = x * keep * scale, fused in one pass.

The keep mask itself is drawn by the op from a ``pyflow.random`` generator, so
the same seed gives the same mask on every backend; the backward is this same
kernel applied to the gradient.
"""
import numpy as np
from numba import njit, prange

from ..registry import register


@njit(parallel=True, nogil=True, cache=True)
def _masked_scale(x, keep, scale, out):
    for i in prange(x.size):
        out[i] = x[i] * (scale if keep[i] else 0.0)   # like PyTorch: NaN * 0 stays NaN


@register("dropout", "cpu")
def dropout(x, keep, scale):
    """x * keep * scale; x and keep (bool) have the same shape."""
    x = np.ascontiguousarray(x)
    out = np.empty(x.shape, x.dtype)
    _masked_scale(x.reshape(-1), np.ascontiguousarray(keep).reshape(-1), x.dtype.type(scale),
                  out.reshape(-1))
    return out
