"""layer_norm, rms_norm, fused_add_layer_norm and batch_norm: forward and
backward side by side.

The forward kernels save mean and rstd = 1/sqrt(var + eps) (rms_norm: rstd =
1/sqrt(mean(x^2) + eps) alone); the usual backward is one fused kernel giving
dx, dweight and dbias.  When the backward itself is being recorded (double
backward) the same formulas are written with pyflow ops, recomputing the
statistics from x so they are differentiated too.

fused_add_layer_norm is a pre-LN transformer's ``s = x + residual; y =
layer_norm(s)`` in one pass that writes both y and s (the residual stream
carried on); its backward adds the gradient of s into layer_norm's dx in the
same kernel, and hands that sum to both x and residual.

batch_norm's running statistics are buffers: updated in place (``copy_``
under ``no_grad``), outside autograd.  batch_norm is made of ops only
(BatchNormStats, RunningAverage, BatchNorm), so a graph traces it like any
other code: its running statistics become ``assign`` nodes and its backward
a node of the graph's autograd pass.

fused_batch_norm_add_relu is ``relu(batch_norm(x) + addend)``, the tail of a
ResNet block (OneFlow's ``normalization_add_relu``): batch_norm's statistics
and running-statistic updates, then one kernel pass for the normalization,
the add and the relu (BatchNormAddRelu), whose backward takes the relu mask
from the output inline and writes the addend's gradient and batch_norm's
gradients of it in batch_norm_backward's two passes.  In float32 it rounds op
by op as the unfused ops do: the same bits, forward and backward.
"""
import math
import numbers

import numpy as np

from .. import dtypes as _dt
from ..autograd import GRAD_MODE, Context, Function, is_grad_enabled, no_grad, record
from ..tensor import Tensor, host_tensor
from ._util import (CPU_KERNELS, array_module, check_same_device, check_tensor, compute_array,
                    cpu_kernel, kernel, local, wrap)
from ._util import replicated
from ..distributed.sbp import broadcast as _B
from ..distributed.sbp import split as _S
from ..distributed.signatures import Candidate, layer_norm_rule, rows_rule

__all__ = ["layer_norm", "rms_norm", "group_norm", "fused_add_layer_norm", "batch_norm",
           "fused_batch_norm_add_relu"]


def _maybe(t, dtype):
    return None if t is None else compute_array(t, dtype)


def _grad_as(g, t):
    return g if g.dtype is t.dtype else g.to(t.dtype)


# ------------------------------------------------------------------ layer_norm
def _as_rows(arr, k):
    """(..., *normalized) -> (rows, prod(normalized)), sizes spelled out: a -1
    cannot be inferred when the normalized size is 0 (PyTorch gives an empty result)."""
    nd = arr.ndim
    return arr.reshape(math.prod(arr.shape[:nd - k]), math.prod(arr.shape[nd - k:]))


class LayerNorm(Function):
    sbp_rule = layer_norm_rule
    @staticmethod
    def forward(ctx, x, weight, bias, normalized_shape, eps):
        dt = x.dtype
        x2 = _as_rows(compute_array(x, dt), len(normalized_shape))
        out, mean, rstd = kernel("layer_norm", x.device.type)(
            x2, _maybe(weight, dt), _maybe(bias, dt), eps)
        ctx.k, ctx.eps = len(normalized_shape), eps
        ctx.mean, ctx.rstd = mean, rstd
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        return wrap(out.reshape(x.shape), dt, x.device)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        if is_grad_enabled():
            dx, dw, db = _layer_norm_grads(g, x, w, ctx.k, ctx.eps)
        else:
            dt = x.dtype
            dx, dw, db = kernel("layer_norm_backward", x.device.type)(
                _as_rows(compute_array(g, dt), ctx.k), _as_rows(compute_array(x, dt), ctx.k),
                ctx.mean, ctx.rstd, _maybe(w, dt))
            nshape = x.shape[x.ndim - ctx.k:]
            dx = wrap(dx.reshape(x.shape), dt, x.device)
            # (no reshape when dw, db have their shape: a reshaped array is a view, and
            # a view as a parameter's first gradient is copied (autograd._accumulate))
            dw = wrap(dw if dw.shape == nshape else dw.reshape(nshape), dt, x.device)
            db = wrap(db if db.shape == nshape else db.reshape(nshape), dt, x.device)
        return (dx,
                _grad_as(dw, w) if w is not None and ctx.needs_input_grad[1] else None,
                _grad_as(db, w) if ctx.has_bias and ctx.needs_input_grad[2] else None,
                None, None)


def _layer_norm_grads(g, x, w, k, eps):
    """The backward with ops (differentiable again): statistics recomputed from x."""
    dims = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    xc = x - x.mean(dims, keepdim=True)
    rstd = ((xc * xc).mean(dims, keepdim=True) + eps).rsqrt()
    xhat = xc * rstd
    gw = g if w is None else g * w
    dx = rstd * (gw - gw.mean(dims, keepdim=True) - xhat * (gw * xhat).mean(dims, keepdim=True))
    dw, db = g * xhat, g
    if lead:
        dw, db = dw.sum(lead), db.sum(lead)
    return dx, dw, db


def _direct_layer_norm(input, normalized_shape, weight, bias, eps):
    """``LayerNorm``'s forward run directly and recorded as ``LayerNorm.apply``
    records it, for the usual call: a local float tensor normalized over its last
    dim (``normalized_shape`` an int or a one-int tuple or list), weight and bias
    None or local tensors of its dtype and of that size, a float eps.  None for
    anything else: the general path checks and explains."""
    if not local(input) or type(eps) is not float:
        return None
    data = input._data
    dtype = input.dtype
    if dtype.category != 2 or dtype.storage is not dtype.compute or data.ndim == 0:
        return None
    n = data.shape[-1]
    tn = type(normalized_shape)
    if tn is tuple or tn is list:
        if len(normalized_shape) != 1 or normalized_shape[0] != n \
                or type(normalized_shape[0]) is not int:
            return None
    elif tn is not int or normalized_shape != n:
        return None
    size = (n,)
    for t in (weight, bias):
        if t is not None and (not local(t) or t.dtype is not dtype or t._data.shape != size):
            return None
    rows = data.size // n if n else math.prod(data.shape[:-1])
    out, mean, rstd = (CPU_KERNELS.get("layer_norm") or cpu_kernel("layer_norm"))(
        data.reshape(rows, n), None if weight is None else weight._data,
        None if bias is None else bias._data, eps)
    y = host_tensor(out.reshape(data.shape), dtype, input.device)
    if GRAD_MODE.enabled and (input.requires_grad or weight is not None and weight.requires_grad
                              or bias is not None and bias.requires_grad):
        ctx = Context()
        ctx.k, ctx.eps = 1, eps
        ctx.mean, ctx.rstd = mean, rstd
        ctx.has_bias = bias is not None
        ctx.save_for_backward(input, weight)
        record(LayerNorm, ctx, (input, weight, bias, size, eps), y)
    return y


def _check_norm_args(op, input, normalized_shape, **params):
    """``normalized_shape`` as a tuple of ints, once ``input`` and the weight/bias
    ``params`` (None allowed) are checked against it; errors name the argument."""
    check_tensor(input, "input", op)
    if isinstance(normalized_shape, (int, np.integer)):
        normalized_shape = (int(normalized_shape),)
    normalized_shape = tuple(int(s) for s in normalized_shape)
    k = len(normalized_shape)
    if k == 0 or tuple(input.shape[input.ndim - k:]) != normalized_shape or k > input.ndim:
        raise RuntimeError(
            f"{op}(): given normalized_shape={list(normalized_shape)}, expected input with "
            f"shape [*, {', '.join(map(str, normalized_shape))}], but got input of size "
            f"{list(input.shape)}")
    for name, t in params.items():
        if t is not None:
            check_tensor(t, name, op)
            if tuple(t.shape) != normalized_shape:
                raise RuntimeError(f"{op}(): expected {name} of shape "
                                   f"{list(normalized_shape)}, got {list(t.shape)}")
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"{op}(): expected a floating point input, got {input.dtype}")
    return normalized_shape


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Normalize over the last ``len(normalized_shape)`` dims, then scale and shift."""
    out = _direct_layer_norm(input, normalized_shape, weight, bias, eps)
    if out is not None:
        return out
    normalized_shape = _check_norm_args("layer_norm", input, normalized_shape,
                                        weight=weight, bias=bias)
    return LayerNorm.apply(input, weight, bias, normalized_shape, float(eps))


# ------------------------------------------------------------------ rms_norm
class RMSNorm(Function):
    sbp_rule = rows_rule(lambda a: tuple(range(a[0].ndim - len(a[2]), a[0].ndim)))

    @staticmethod
    def forward(ctx, x, weight, normalized_shape, eps):
        dt = x.dtype
        x2 = _as_rows(compute_array(x, dt), len(normalized_shape))
        out, rstd = kernel("rms_norm", x.device.type)(x2, _maybe(weight, dt), eps)
        ctx.k, ctx.eps, ctx.rstd = len(normalized_shape), eps, rstd
        ctx.save_for_backward(x, weight)
        return wrap(out.reshape(x.shape), dt, x.device)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        if is_grad_enabled():
            dx, dw = _rms_norm_grads(g, x, w, ctx.k, ctx.eps)
        else:
            dt = x.dtype
            dx, dw = kernel("rms_norm_backward", x.device.type)(
                _as_rows(compute_array(g, dt), ctx.k), _as_rows(compute_array(x, dt), ctx.k),
                ctx.rstd, _maybe(w, dt))
            nshape = x.shape[x.ndim - ctx.k:]
            dx = wrap(dx.reshape(x.shape), dt, x.device)
            dw = wrap(dw if dw.shape == nshape else dw.reshape(nshape), dt, x.device)
        return (dx, _grad_as(dw, w) if w is not None and ctx.needs_input_grad[1] else None,
                None, None)


def _rms_norm_grads(g, x, w, k, eps):
    """The backward with ops (differentiable again): rstd recomputed from x."""
    dims = tuple(range(x.ndim - k, x.ndim))
    lead = tuple(range(x.ndim - k))
    rstd = ((x * x).mean(dims, keepdim=True) + eps).rsqrt()
    xhat = x * rstd
    gw = g if w is None else g * w
    dx = rstd * (gw - xhat * (gw * xhat).mean(dims, keepdim=True))
    dw = g * xhat
    return dx, dw.sum(lead) if lead else dw


# machine epsilon per dtype: rms_norm's default eps, as torch.finfo(dtype).eps
_EPS = {_dt.float32: float(np.finfo(np.float32).eps), _dt.float64: float(np.finfo(np.float64).eps),
        _dt.float16: float(np.finfo(np.float16).eps), _dt.bfloat16: 2.0 ** -7}


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """``input * rsqrt(mean(input^2) + eps) * weight``, the mean over the last
    ``len(normalized_shape)`` dims, as ``torch.nn.functional.rms_norm``; ``eps``
    None is the machine epsilon of input's dtype (``torch.finfo(dtype).eps``)."""
    normalized_shape = _check_norm_args("rms_norm", input, normalized_shape, weight=weight)
    eps = _EPS[input.dtype] if eps is None else float(eps)
    return RMSNorm.apply(input, weight, normalized_shape, eps)


# ------------------------------------------------------------------ group_norm
def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """``torch.nn.functional.group_norm``: the channels (dim 1) of each sample split
    into ``num_groups`` groups, each group normalised over its channels and all
    positions, then a per-channel scale and shift.

    A composition, not a kernel of its own: the (N, C, *) input viewed as
    (N, num_groups, C / num_groups * positions) rows is exactly layer_norm's
    case (one fused pass forward and back, on every device), and the affine is
    two broadcast elementwise ops.  So gradients, global tensors and graphs
    come from those ops."""
    op = "group_norm"
    check_tensor(input, "input", op)
    if input.ndim < 2:
        raise RuntimeError(f"{op}(): expected an input of at least 2 dims (N, C, *), got "
                           f"shape {list(input.shape)}")
    n, c = input.shape[0], input.shape[1]
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)) or \
            num_groups <= 0 or c % num_groups:
        raise RuntimeError(f"{op}(): expected the number of channels in input to be divisible "
                           f"by num_groups, but got input of shape {list(input.shape)} and "
                           f"num_groups={num_groups!r}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check_tensor(t, name, op)
            if tuple(t.shape) != (c,):
                raise RuntimeError(f"{op}(): expected {name} of shape [{c}] (one per channel), "
                                   f"got {list(t.shape)}")
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"{op}(): expected a floating point input, got {input.dtype}")
    if input.numel() == 0:
        rows = input.reshape(n, int(num_groups), 0)
    else:
        rows = input.reshape(n, int(num_groups), -1)
    out = layer_norm(rows, (rows.shape[-1],), None, None, eps).reshape(input.shape)
    per_channel = (c,) + (1,) * (input.ndim - 2)
    if weight is not None:
        out = out * weight.reshape(per_channel)
    if bias is not None:
        out = out + bias.reshape(per_channel)
    return out


# ------------------------------------------------------------------ fused_add_layer_norm
def _add_layer_norm_rule(args):
    """Split on a dim neither normalized: x and residual split alike, weight and bias
    replicated, out and sum split like them."""
    x, k = args[0], len(args[4])
    params = (_B,) * sum(1 for p in args[2:4] if p is not None)
    c = [Candidate((_S(d), _S(d)) + params, (_S(d), _S(d))) for d in range(x.ndim - k)]
    c.append(Candidate((_B, _B) + params, (_B, _B)))
    return c


class FusedAddLayerNorm(Function):
    """(layer_norm(x + residual), x + residual); both outputs carry gradients."""
    sbp_rule = _add_layer_norm_rule

    @staticmethod
    def forward(ctx, x, residual, weight, bias, normalized_shape, eps):
        dt, k = x.dtype, len(normalized_shape)
        out, s, mean, rstd = kernel("add_layer_norm", x.device.type)(
            _as_rows(compute_array(x, dt), k), _as_rows(compute_array(residual, dt), k),
            _maybe(weight, dt), _maybe(bias, dt), eps)
        out = wrap(out.reshape(x.shape), dt, x.device)
        total = wrap(s.reshape(x.shape), dt, x.device)
        # s in the compute dtype: float16/bfloat16 statistics were taken before the
        # sum was rounded to storage (for float32/64 it is total's own array)
        ctx.k, ctx.eps, ctx.s, ctx.mean, ctx.rstd = k, eps, s, mean, rstd
        ctx.has_bias = bias is not None
        ctx.set_materialize_grads(False)    # an unused output adds nothing (no zeros pass)
        # the sum itself, not x and residual: double backward reaches both through
        # its gradient, and one tensor is kept instead of two
        ctx.save_for_backward(total, weight)
        return out, total

    @staticmethod
    def backward(ctx, g_out, g_sum):
        s, w = ctx.saved_tensors
        dw = db = None
        if g_out is None:
            ds = g_sum
        elif is_grad_enabled():
            ds, dw, db = _layer_norm_grads(g_out, s, w, ctx.k, ctx.eps)
            if g_sum is not None:
                ds = ds + g_sum
        else:
            dt, k = s.dtype, ctx.k
            ds, dw, db = kernel("add_layer_norm_backward", s.device.type)(
                _as_rows(compute_array(g_out, dt), k),
                None if g_sum is None else _as_rows(compute_array(g_sum, dt), k),
                ctx.s, ctx.mean, ctx.rstd, _maybe(w, dt))
            nshape = s.shape[s.ndim - k:]
            ds = wrap(ds.reshape(s.shape), dt, s.device)
            dw = wrap(dw if dw.shape == nshape else dw.reshape(nshape), dt, s.device)
            db = wrap(db if db.shape == nshape else db.reshape(nshape), dt, s.device)
        # the sum's derivative by x and by residual is the identity: one gradient for both
        return (ds, ds,
                _grad_as(dw, w) if dw is not None and w is not None and ctx.needs_input_grad[2]
                else None,
                _grad_as(db, w) if db is not None and ctx.has_bias and ctx.needs_input_grad[3]
                else None,
                None, None)


def fused_add_layer_norm(input, residual, normalized_shape, weight=None, bias=None, eps=1e-5):
    """``(layer_norm(input + residual, normalized_shape, weight, bias, eps), input +
    residual)`` from one kernel pass.  input and residual must have the same shape,
    dtype and device (no broadcasting: the sum is the residual stream itself)."""
    op = "fused_add_layer_norm"
    normalized_shape = _check_norm_args(op, input, normalized_shape, weight=weight, bias=bias)
    check_tensor(residual, "residual", op)
    if tuple(residual.shape) != tuple(input.shape):
        raise RuntimeError(f"{op}(): expected residual of the shape of input "
                           f"{list(input.shape)}, got {list(residual.shape)}")
    if residual.dtype is not input.dtype:
        raise RuntimeError(f"{op}(): expected residual of input's dtype {input.dtype}, got "
                           f"{residual.dtype}")
    check_same_device(op, ("input", input), residual=residual, weight=weight, bias=bias)
    return FusedAddLayerNorm.apply(input, residual, weight, bias, normalized_shape, float(eps))


# ------------------------------------------------------------------ batch_norm
def _as_ncs(arr):
    return arr.reshape(arr.shape[0], arr.shape[1], -1)


class BatchNorm(Function):
    """(x - mean) / sqrt(var + eps) * weight + bias per channel.  ``mean`` and
    ``var`` are tensors of C values: the batch's (training, from
    BatchNormStats) or the running statistics (eval), decided by the caller.
    No gradient flows to them; the training backward differentiates through
    the batch statistics itself."""

    @staticmethod
    def forward(ctx, x, weight, bias, mean, var, training, eps):
        dt = x.dtype
        # ctx keeps its own copy: the running statistics change in place
        mean_a = compute_array(mean, dt).copy()
        var_a = compute_array(var, dt)
        rstd = (1.0 / array_module(var_a).sqrt(var_a.astype(np.float64) + eps)).astype(
            mean_a.dtype)
        out = kernel("batch_norm_apply", x.device.type)(
            _as_ncs(compute_array(x, dt)), mean_a, rstd, _maybe(weight, dt), _maybe(bias, dt))
        ctx.mean, ctx.rstd, ctx.training, ctx.eps = mean_a, rstd, training, eps
        ctx.has_bias = bias is not None
        ctx.save_for_backward(x, weight)
        return wrap(out.reshape(x.shape), dt, x.device)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        dt = x.dtype
        if is_grad_enabled():
            dx, dw, db = _batch_norm_grads(g, x, w, ctx)
        else:
            dx, dw, db = kernel("batch_norm_backward", x.device.type)(
                _as_ncs(compute_array(g, dt)), _as_ncs(compute_array(x, dt)), ctx.mean,
                ctx.rstd, _maybe(w, dt), ctx.training)
            dx = wrap(dx.reshape(x.shape), dt, x.device)
            dw, db = wrap(dw, dt, x.device), wrap(db, dt, x.device)
        return (dx,
                _grad_as(dw, w) if w is not None and ctx.needs_input_grad[1] else None,
                _grad_as(db, w) if ctx.has_bias and ctx.needs_input_grad[2] else None,
                None, None, None, None)


class BatchNormStats(Function):
    """Per-channel mean and biased variance of an (N, C, ...) batch, in the
    compute dtype.  No gradient flows through them (BatchNorm's training
    backward accounts for them)."""

    @staticmethod
    def forward(ctx, x):
        mean, var = kernel("batch_norm_stats", x.device.type)(
            _as_ncs(compute_array(x, x.dtype)))
        dt = _dt.from_numpy(mean.dtype)
        out = Tensor._make(mean, dt, x.device), Tensor._make(var, dt, x.device)
        ctx.mark_non_differentiable(*out)
        return out

    @staticmethod
    def backward(ctx, g_mean, g_var):
        return (None,)


class RunningAverage(Function):
    """A running statistic's next value: ``(1 - momentum) * running + momentum
    * scale * batch``, computed in float64 and stored in ``running``'s dtype
    (no gradient).  batch_norm writes it back with ``copy_``, which a graph
    records as an ``assign`` of the state tensor."""

    @staticmethod
    def forward(ctx, running, batch, momentum, scale):
        old = running._compute()
        xp = array_module(old)
        new = (1.0 - momentum) * xp.asarray(old, np.float64) + \
            momentum * (xp.asarray(batch._compute(), np.float64) * scale)
        out = wrap(new, running.dtype, running.device)
        ctx.mark_non_differentiable(out)
        return out

    @staticmethod
    def backward(ctx, g):
        return None, None, None, None


def _batch_norm_grads(g, x, w, ctx):
    """The backward with ops (differentiable again)."""
    C = x.shape[1]
    dims = (0,) + tuple(range(2, x.ndim))
    bshape = (1, C) + (1,) * (x.ndim - 2)
    if ctx.training:
        xc = x - x.mean(dims, keepdim=True)
        rstd = ((xc * xc).mean(dims, keepdim=True) + ctx.eps).rsqrt()
    else:
        xc = x - wrap(ctx.mean.reshape(bshape), x.dtype, x.device)
        rstd = wrap(ctx.rstd.reshape(bshape), x.dtype, x.device)
    xhat = xc * rstd
    scale = rstd if w is None else rstd * w.reshape(bshape)
    if ctx.training:
        dx = scale * (g - g.mean(dims, keepdim=True) - xhat * (g * xhat).mean(dims, keepdim=True))
    else:
        dx = scale * g
    return dx, (g * xhat).sum(dims), g.sum(dims)


def _check_batch_norm_args(op, input, running_mean, running_var, weight, bias, momentum):
    check_tensor(input, "input", op)
    if input.ndim < 2:
        raise ValueError(f"{op}(): expected an input of at least 2 dims (N, C, ...), got "
                         f"shape {list(input.shape)}")
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"{op}(): expected a floating point input, got {input.dtype}")
    C = input.shape[1]
    for name, t in (("running_mean", running_mean), ("running_var", running_var),
                    ("weight", weight), ("bias", bias)):
        if t is not None:
            check_tensor(t, name, op)
            if tuple(t.shape) != (C,):
                raise RuntimeError(f"{op}(): expected {name} of shape [{C}] (the channel "
                                   f"dim of input {list(input.shape)}), got {list(t.shape)}")
    if not isinstance(momentum, numbers.Real) or isinstance(momentum, Tensor):
        raise TypeError(f"{op}(): momentum must be a float, got {momentum!r}")


def _batch_norm_statistics(op, input, running_mean, running_var, training, momentum):
    """(input, mean, var) for the normalization: the batch's, with the running
    statistics updated in place (training), or the running statistics (eval);
    input made replicated when training on a global tensor."""
    if training and input._placement is not None:
        # batch statistics need every sample (BatchNormStats and BatchNorm have the
        # all-broadcast signature)
        input = replicated(input)
    if training:
        count = input.shape[0] * math.prod(input.shape[2:])
        if count <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input "
                             f"size {list(input.shape)}")
        mean, var = BatchNormStats.apply(input)
        with no_grad():         # the running estimate of the variance is unbiased (n - 1)
            if running_mean is not None:
                running_mean.copy_(RunningAverage.apply(running_mean, mean, momentum, 1.0))
            if running_var is not None:
                running_var.copy_(RunningAverage.apply(running_var, var, momentum,
                                                       count / (count - 1)))
    else:
        if running_mean is None or running_var is None:
            raise RuntimeError(f"{op}(): running_mean and running_var must be given when "
                               "training=False (evaluation uses the running statistics)")
        mean, var = running_mean, running_var
    return input, mean, var


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False,
               momentum=0.1, eps=1e-5):
    """Batch normalization over (N, C), (N, C, L), (N, C, H, W) ... inputs, per channel C."""
    _check_batch_norm_args("batch_norm", input, running_mean, running_var, weight, bias, momentum)
    input, mean, var = _batch_norm_statistics("batch_norm", input, running_mean, running_var,
                                              training, momentum)
    return BatchNorm.apply(input, weight, bias, mean, var, bool(training), float(eps))


# ------------------------------------------------------------------ fused_batch_norm_add_relu
_S0, _S1 = _S(0), _S(1)


def _batch_norm_add_relu_rule(args):
    """Per channel: input and addend split on C, weight, bias and the statistics
    split alike (the batch statistics were taken over every sample already), out
    split on C; or everything broadcast."""
    tensors = [a for a in args[:6] if a is not None]
    split = tuple(s for a, s in zip(args[:6], (_S1, _S1, _S0, _S0, _S0, _S0)) if a is not None)
    return [Candidate(split, (_S1,)), Candidate((_B,) * len(tensors), (_B,))]


class BatchNormAddRelu(Function):
    """relu(batch_norm(x) + addend) in one kernel pass (OneFlow's
    normalization_add_relu); ``addend`` may be None.  ``mean`` and ``var`` as
    in BatchNorm.  The output is saved: the relu mask is ``y > 0``, taken
    inline by the backward kernel, which writes the addend's gradient (the
    masked gradient) and batch_norm's dx, dweight, dbias of it."""
    sbp_rule = _batch_norm_add_relu_rule

    @staticmethod
    def forward(ctx, x, addend, weight, bias, mean, var, training, eps):
        dt = x.dtype
        # ctx keeps its own copy: the running statistics change in place
        mean_a = compute_array(mean, dt).copy()
        var_a = compute_array(var, dt)
        rstd = (1.0 / array_module(var_a).sqrt(var_a.astype(np.float64) + eps)).astype(
            mean_a.dtype)
        out = kernel("batch_norm_add_relu_apply", x.device.type)(
            _as_ncs(compute_array(x, dt)),
            None if addend is None else _as_ncs(compute_array(addend, dt)),
            mean_a, rstd, _maybe(weight, dt), _maybe(bias, dt))
        y = wrap(out.reshape(x.shape), dt, x.device)
        ctx.mean, ctx.rstd, ctx.training, ctx.eps = mean_a, rstd, training, eps
        ctx.has_addend, ctx.has_bias = addend is not None, bias is not None
        ctx.save_for_backward(x, weight, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, w, y = ctx.saved_tensors
        dt = x.dtype
        addend_grad = ctx.has_addend and ctx.needs_input_grad[1]
        if is_grad_enabled():
            from .elementwise import le, where
            gm = where(le(y, 0), 0.0, g)        # relu's backward, as F.relu records it
            dx, dw, db = _batch_norm_grads(gm, x, w, ctx)
            da = gm
        else:
            dx, da, dw, db = kernel("batch_norm_add_relu_backward", x.device.type)(
                _as_ncs(compute_array(g, dt)), _as_ncs(compute_array(y, dt)),
                _as_ncs(compute_array(x, dt)), ctx.mean, ctx.rstd, _maybe(w, dt),
                ctx.training, addend_grad)
            dx = wrap(dx.reshape(x.shape), dt, x.device)
            if addend_grad:
                da = wrap(da.reshape(x.shape), dt, x.device)
            dw, db = wrap(dw, dt, x.device), wrap(db, dt, x.device)
        return (dx, da if addend_grad else None,
                _grad_as(dw, w) if w is not None and ctx.needs_input_grad[2] else None,
                _grad_as(db, w) if ctx.has_bias and ctx.needs_input_grad[3] else None,
                None, None, None, None)


def fused_batch_norm_add_relu(input, addend, running_mean, running_var, weight=None, bias=None,
                              training=False, momentum=0.1, eps=1e-5):
    """``relu(batch_norm(input, running_mean, running_var, weight, bias, training,
    momentum, eps) + addend)`` (OneFlow's ``normalization_add_relu``, the tail of a
    ResNet block) with the normalization, the add and the relu in one kernel pass
    and their backward in one kernel.  Arguments as ``batch_norm``'s (the running
    statistics are updated alike when training); ``addend`` has input's shape,
    dtype and device, or is None (batch_norm + relu)."""
    op = "fused_batch_norm_add_relu"
    _check_batch_norm_args(op, input, running_mean, running_var, weight, bias, momentum)
    if addend is not None:
        check_tensor(addend, "addend", op)
        if tuple(addend.shape) != tuple(input.shape):
            raise RuntimeError(f"{op}(): expected addend of the shape of input "
                               f"{list(input.shape)}, got {list(addend.shape)}")
        if addend.dtype is not input.dtype:
            raise RuntimeError(f"{op}(): expected addend of input's dtype {input.dtype}, got "
                               f"{addend.dtype}")
    check_same_device(op, ("input", input), addend=addend, running_mean=running_mean,
                      running_var=running_var, weight=weight, bias=bias)
    input, mean, var = _batch_norm_statistics(op, input, running_mean, running_var, training,
                                              momentum)
    return BatchNormAddRelu.apply(input, addend, weight, bias, mean, var, bool(training),
                                  float(eps))
