"""softmax and log_softmax along one dim, forward and backward side by side.

Both run one numba row kernel forward and save their output: the backward
needs only y (softmax: ``y * (g - sum(g * y))``, log_softmax:
``g - exp(y) * sum(g)``), computed by one fused kernel, or by pyflow ops when
the backward itself is being recorded (double backward).

``fused_scale_mask_softmax(x, mask, scale, fill_value)`` is OneFlow's fused op of
that name: ``softmax(where(mask, x * scale, fill_value), dim=-1)`` with a bool
``mask`` broadcasting to x (True: keep), in one row kernel that reads the mask
through per-row offsets (never broadcast in memory) and makes no scaled or
filled copy of x.  Semantics are exactly the composition's: a row the mask
keeps nothing of, with the default fill -inf, is NaN (the softmax of nothing,
as PyTorch's ``softmax(masked_fill(...))`` gives); with a finite fill it is
uniform.  Backward ``dx = scale * mask * y * (g - sum(g * y))``: masked positions
get exactly 0 (NaN rows included), the mask gets no gradient.

``fused_scale_mask_softmax_dropout`` also returns ``dropout(y, p)``, drawn by
the ``dropout_philox`` kernel with one seed from the generator, as
``nn.functional.dropout`` draws it: under one ``manual_seed`` the pair equals
softmax-then-dropout bit for bit.  Its backward folds the dropped output's
gradient (``g * keep / (1 - p)``) into the softmax output's, then runs the
masked backward kernel once.
"""
import numbers

import numpy as np

from .. import dtypes as _dt
from ..autograd import GRAD_MODE, Context, Function, is_grad_enabled, record_unary
from ..tensor import host_tensor
from ._method import tensor_method
from ._util import (CPU_KERNELS, broadcast_shapes, check_same_device, check_tensor,
                    compute_array, cpu_kernel, is_number, kernel, local, wrap)
from ..distributed.sbp import broadcast as _B
from ..distributed.sbp import split as _S
from ..distributed.signatures import Candidate, softmax_rule
from ..random import generator_of
from .dropout import MaskedScale

__all__ = ["softmax", "log_softmax", "fused_scale_mask_softmax",
           "fused_scale_mask_softmax_dropout"]


class _SoftmaxBase(Function):
    """softmax(x * scale) along ``dim``; ``causal`` (last dim only) masks each
    query row of the (..., L, S) scores past its position.  scale and causal
    are attention's (``scaled_dot_product_attention``); plain softmax has 1 and
    False."""
    sbp_rule = softmax_rule
    log = False

    @classmethod
    def forward(cls, ctx, x, dim, scale=1.0, causal=False):
        name = "log_softmax" if cls.log else "softmax"
        if causal and cls.log:      # its composed backward below assumes y == 0 when masked
            raise ValueError("log_softmax: no causal mask (attention's is a softmax)")
        y = wrap(kernel(name, x.device.type)(compute_array(x, x.dtype), dim, scale=scale,
                                             causal=causal), x.dtype, x.device)
        ctx.dim, ctx.scale, ctx.causal = dim, scale, causal
        ctx.save_for_backward(y)
        return y

    @classmethod
    def backward(cls, ctx, g):
        (y,) = ctx.saved_tensors
        dim, scale = ctx.dim, ctx.scale
        if is_grad_enabled():
            # masked entries: y == 0 (softmax) zeroes them; log_softmax is never masked
            if cls.log:
                dx = g - y.exp() * g.sum(dim, keepdim=True)
            else:
                dx = y * (g - (g * y).sum(dim, keepdim=True))
            return (dx if scale == 1.0 else dx * scale), None, None, None
        name = "log_softmax_backward" if cls.log else "softmax_backward"
        dx = kernel(name, y.device.type)(compute_array(g, y.dtype), compute_array(y, y.dtype), dim,
                                         scale=scale, causal=ctx.causal)
        return wrap(dx, y.dtype, y.device), None, None, None


class Softmax(_SoftmaxBase):
    log = False


class LogSoftmax(_SoftmaxBase):
    log = True


def _prepare(input, dim, dtype, op):
    check_tensor(input, "input", op)
    if dim is None:  # PyTorch's legacy implicit dim: 0 for 0-D, 1-D and 3-D inputs, else 1
        raise TypeError(f"{op}(): argument 'dim' must be an int, got None (the implicit "
                        f"dim choice is deprecated in PyTorch; pass dim explicitly)")
    d = input._wrap_dim(dim, max(input.ndim, 1))     # the dim first, as PyTorch checks
    if dtype is not None:
        input = input.to(_dt.as_dtype(dtype))
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"{op}(): expected a floating point input (or pass dtype=), got "
                           f"{input.dtype}")
    return input, d


def _direct(cls, input, dim):
    """``cls``'s forward (softmax or log_softmax, no scale, no mask) run directly
    and recorded as ``cls.apply(input, dim)`` records it, for a local float tensor
    of at least one dim and an int ``dim`` in range; None otherwise (the general
    path checks and explains)."""
    if not local(input) or type(dim) is not int:
        return None
    data = input._data
    dtype = input.dtype
    n = data.ndim
    if dtype.category != 2 or dtype.storage is not dtype.compute or not -n <= dim < n:
        return None
    dim %= n
    name = "log_softmax" if cls.log else "softmax"
    res = (CPU_KERNELS.get(name) or cpu_kernel(name))(data, dim, scale=1.0, causal=False)
    if res.dtype != data.dtype:
        return None                     # (never: the row kernels keep the dtype)
    y = host_tensor(res, dtype, input.device)
    if input.requires_grad and GRAD_MODE.enabled:
        ctx = Context()
        ctx.dim, ctx.scale, ctx.causal = dim, 1.0, False
        ctx._saved = ((y, 0),)          # ctx.save_for_backward(y)
        record_unary(cls, ctx, input, y, 2)
    return y


@tensor_method()
def softmax(input, dim, dtype=None):
    """exp(x) / sum(exp(x)) along ``dim`` (computed as exp(x - max) for stability)."""
    if dtype is None:
        out = _direct(Softmax, input, dim)
        if out is not None:
            return out
    input, d = _prepare(input, dim, dtype, "softmax")
    if input.ndim == 0:
        return Softmax.apply(input.reshape(1), 0).reshape(())
    return Softmax.apply(input, d)


@tensor_method()
def log_softmax(input, dim, dtype=None):
    """x - log(sum(exp(x))) along ``dim``."""
    if dtype is None:
        out = _direct(LogSoftmax, input, dim)
        if out is not None:
            return out
    input, d = _prepare(input, dim, dtype, "log_softmax")
    if input.ndim == 0:
        return LogSoftmax.apply(input.reshape(1), 0).reshape(())
    return LogSoftmax.apply(input, d)


# ------------------------------------------------------------------ scale + bool mask
def _scale_mask_rule(args):
    """Rows are independent: x split on any dim but the last (the mask split
    alike where it has that dim with size > 1, else broadcast), the outputs on
    it.  The dropout form draws its keep mask from each piece's own element
    indices, as ``Dropout``'s elementwise splits do."""
    x, mask = args[0], args[1]
    n_out = 2 if len(args) > 4 else 1
    cands = []
    for d in range(x.ndim - 1):
        m = d - (x.ndim - mask.ndim)
        cands.append(Candidate((_S(d), _S(m) if m >= 0 and mask.shape[m] != 1 else _B),
                               (_S(d),) * n_out))
    cands.append(Candidate((_B, _B), (_B,) * n_out))
    return cands


def _masked_backward(ctx, y, g):
    """scale * mask * y * (g - sum(g * y)): by the kernel, or by ops when the
    backward itself is recorded."""
    mask, scale = ctx.mask, ctx.scale
    if is_grad_enabled():
        dx = (y * (g - (g * y).sum(-1, keepdim=True))).masked_fill(mask.logical_not(), 0.0)
        return dx if scale == 1.0 else dx * scale
    dx = kernel("scale_mask_softmax_backward", y.device.type)(
        compute_array(g, y.dtype), compute_array(y, y.dtype), mask._data, scale)
    return wrap(dx, y.dtype, y.device)


def _masked_forward(ctx, x, mask, scale, fill_value):
    y = wrap(kernel("scale_mask_softmax", x.device.type)(
        compute_array(x, x.dtype), mask._data, scale, fill_value), x.dtype, x.device)
    ctx.mask, ctx.scale = mask, scale
    return y


class FusedScaleMaskSoftmax(Function):
    """``apply(x, mask, scale, fill_value)``: softmax(where(mask, x * scale,
    fill_value), -1); mask a bool tensor broadcasting to x (True: keep)."""
    sbp_rule = _scale_mask_rule

    @staticmethod
    def forward(ctx, x, mask, scale, fill_value):
        y = _masked_forward(ctx, x, mask, scale, fill_value)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return _masked_backward(ctx, y, g), None, None, None


class FusedScaleMaskSoftmaxDropout(Function):
    """``apply(x, mask, scale, fill_value, p, seed)`` -> ``(dropout(y), y)`` with
    y as FusedScaleMaskSoftmax's and the keep mask ``dropout_philox`` draws for
    ``seed``; gradients flow from both outputs."""
    sbp_rule = _scale_mask_rule

    @staticmethod
    def forward(ctx, x, mask, scale, fill_value, p, seed):
        y = _masked_forward(ctx, x, mask, scale, fill_value)
        dropped, keep = kernel("dropout_philox", x.device.type)(compute_array(y, y.dtype), p, seed)
        ctx.keep, ctx.drop_scale = keep, (0.0 if p == 1.0 else 1.0 / (1.0 - p))
        ctx.save_for_backward(y)
        ctx.set_materialize_grads(False)
        return wrap(dropped, x.dtype, x.device), y

    @staticmethod
    def backward(ctx, g_dropped, g_y):
        (y,) = ctx.saved_tensors
        if g_dropped is None and g_y is None:
            return None, None, None, None, None, None
        g = g_y
        if g_dropped is not None:
            if is_grad_enabled():
                gd = MaskedScale.apply(g_dropped, ctx.keep, ctx.drop_scale)
            else:
                gd = wrap(kernel("dropout", y.device.type)(compute_array(g_dropped, y.dtype),
                                                           ctx.keep, ctx.drop_scale),
                          y.dtype, y.device)
            g = gd if g is None else g + gd
        return _masked_backward(ctx, y, g), None, None, None, None, None


def _check_masked(op, x, mask, scale, fill_value):
    check_tensor(x, "x", op)
    check_tensor(mask, "mask", op)
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"{op}(): expected a floating point x, got {x.dtype}")
    if x.ndim == 0:
        raise RuntimeError(f"{op}(): x must have at least one dim (the softmax runs over "
                           f"the last), got a 0-d tensor")
    if mask.dtype is not _dt.bool:
        raise TypeError(f"{op}(): mask must be a bool tensor (True: keep), got {mask.dtype}")
    try:
        shape = broadcast_shapes(tuple(mask.shape), tuple(x.shape), op=op)
    except RuntimeError:
        shape = None
    if shape != tuple(x.shape):
        raise RuntimeError(f"{op}(): mask of shape {list(mask.shape)} must broadcast to x's "
                           f"shape {list(x.shape)}")
    for name, v in (("scale", scale), ("fill_value", fill_value)):
        if not is_number(v) or isinstance(v, (bool, complex)):
            raise TypeError(f"{op}(): {name} must be a real number, got {type(v).__name__}")
    check_same_device(op, ("x", x), mask=mask)
    return float(scale), float(fill_value)


def fused_scale_mask_softmax(x, mask, scale=1.0, fill_value=-np.inf):
    """softmax(where(mask, x * scale, fill_value), dim=-1) in one kernel
    (OneFlow's fused_scale_mask_softmax).  ``mask``: bool, broadcasting to x,
    True keeps.  A row masked entirely is NaN with fill -inf (as the
    composition), uniform with a finite fill; masked positions get 0 gradient."""
    scale, fill_value = _check_masked("fused_scale_mask_softmax", x, mask, scale, fill_value)
    return FusedScaleMaskSoftmax.apply(x, mask, scale, fill_value)


def fused_scale_mask_softmax_dropout(x, mask, scale=1.0, fill_value=-np.inf, p=0.0,
                                     training=True, generator=None):
    """``(dropout(y, p), y)`` with y = fused_scale_mask_softmax(x, mask, scale,
    fill_value) (OneFlow's fused_scale_mask_softmax_dropout).  The keep mask is
    the one ``nn.functional.dropout(y, p, generator=generator)`` would draw from
    the same generator state; with ``p == 0`` or ``training=False`` nothing is
    drawn and both outputs are y."""
    op = "fused_scale_mask_softmax_dropout"
    scale, fill_value = _check_masked(op, x, mask, scale, fill_value)
    if isinstance(p, bool) or not isinstance(p, numbers.Real):
        raise TypeError(f"{op}(): p must be a number between 0 and 1, got {type(p).__name__}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{op}(): dropout probability has to be between 0 and 1, but got {p}")
    gen = generator_of(generator)
    if not training or p == 0.0:
        y = FusedScaleMaskSoftmax.apply(x, mask, scale, fill_value)
        return y, y
    return FusedScaleMaskSoftmaxDropout.apply(x, mask, scale, fill_value, float(p),
                                              gen.draw_seed())
