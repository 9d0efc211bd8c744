"""Dropout: zero each element with probability p, scale the rest by 1/(1-p).

The keep mask is drawn from a ``pyflow.random`` Generator (NumPy Philox), so a
seed fixes it; the backward multiplies the gradient by the same mask and scale,
which is the same Function again (so it is differentiable too).
"""
import numbers

import numpy as np

from ..autograd import Function
from ..random import generator_of
from ._util import check_tensor, compute_array, kernel, wrap

__all__ = ["dropout"]


class Dropout(Function):
    @staticmethod
    def forward(ctx, x, keep, scale):
        ctx.keep, ctx.scale = keep, scale
        out = kernel("dropout", x.device.type)(compute_array(x, x.dtype), keep, scale)
        return wrap(out, x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        return Dropout.apply(g, ctx.keep, ctx.scale), None, None


def dropout(input, p=0.5, training=True, inplace=False, generator=None):
    """During training, zero elements with probability ``p`` and scale by 1/(1-p)."""
    check_tensor(input, "input", "dropout")
    if not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    if not training or p == 0.0:
        return input
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"dropout(): expected a floating point input, got {input.dtype}")
    if p == 1.0:
        keep, scale = np.zeros(input.shape, np.bool_), 0.0
    else:
        draw = generator_of(generator).numpy.random(tuple(input.shape), dtype=np.float32)
        keep, scale = draw >= np.float32(p), 1.0 / (1.0 - p)
    if inplace:
        from .elementwise import _inplace
        return _inplace(input, lambda s: Dropout.apply(s, keep, scale))
    return Dropout.apply(input, keep, scale)
