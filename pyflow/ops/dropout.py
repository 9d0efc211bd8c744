"""Dropout: zero each element with probability p, scale the rest by 1/(1-p).

The keep mask is drawn where the data lives, by the ``dropout_philox`` kernel:
counter-based random numbers (Philox-4x32-10) that are a pure function of
(seed, element index).  Each call takes one fresh 64-bit seed from a
``pyflow.random`` generator, so ``manual_seed`` makes runs reproducible, the
generator state advances from call to call, nothing is drawn on the host and
no mask is uploaded to a GPU, and the same seed gives the same mask on cpu and
cuda (both backends run the same Philox function).

The forward keeps the kernel's boolean mask (on the tensor's device); the
backward multiplies the gradient by the same mask and scale with the
``dropout`` (masked scaling) kernel, itself a Function whose backward is
itself, so dropout is differentiable any number of times.
"""
import numbers

from ..autograd import Function
from ..random import generator_of
from ._util import check_tensor, compute_array, kernel, wrap
from .inplace import _inplace
from ..distributed.signatures import elementwise_rule

__all__ = ["dropout"]


class MaskedScale(Function):
    """x * keep * scale with a mask the caller already has (dropout's backward)."""
    sbp_rule = elementwise_rule()

    @staticmethod
    def forward(ctx, x, keep, scale):
        ctx.keep, ctx.scale = keep, scale
        out = kernel("dropout", x.device.type)(compute_array(x, x.dtype), keep, scale)
        return wrap(out, x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        return MaskedScale.apply(g, ctx.keep, ctx.scale), None, None


class Dropout(Function):
    sbp_rule = elementwise_rule()
    @staticmethod
    def forward(ctx, x, p, seed):
        out, keep = kernel("dropout_philox", x.device.type)(compute_array(x, x.dtype), p, seed)
        ctx.keep, ctx.scale = keep, (0.0 if p == 1.0 else 1.0 / (1.0 - p))
        return wrap(out, x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        return MaskedScale.apply(g, ctx.keep, ctx.scale), None, None


def dropout(input, p=0.5, training=True, inplace=False, generator=None):
    """During training, zero elements with probability ``p`` and scale by 1/(1-p)."""
    check_tensor(input, "input", "dropout")
    if not isinstance(p, numbers.Real):     # PyTorch: a TypeError from its comparison
        raise TypeError(f"dropout(): p must be a number between 0 and 1, got "
                        f"{type(p).__name__}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    gen = generator_of(generator)
    if not training or p == 0.0:
        return input
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"dropout(): expected a floating point input, got {input.dtype}")
    p = float(p)
    seed = gen.draw_seed()   # advances the generator
    if inplace:
        return _inplace(input, lambda s: Dropout.apply(s, p, seed))
    return Dropout.apply(input, p, seed)
