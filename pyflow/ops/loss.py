"""Loss functions with PyTorch's signatures.

cross_entropy with class indices is one fused kernel (log_softmax + NLL +
label smoothing) returning one loss per sample; nll_loss likewise.  The
reduction ('mean' divides by the summed weights of the non-ignored targets,
as PyTorch does) is then written with ops, so autograd carries the gradient
of the reduction into the fused backward.  The other losses are short
compositions of ops.  Inputs of shape (N, C, d1, ...) are moved to
(N * d1 * ..., C) rows first.
"""
import numbers

import numpy as np

from .. import dtypes as _dt
from ..autograd import Function, autocast_op, is_grad_enabled
from ..tensor import Tensor
from ._util import (array_module, as_array, broadcast_shapes, check_same_device, check_tensor,
                    compute_array, kernel, unbroadcast, wrap)
from .elementwise import sigmoid, where
from .softmax import log_softmax, softmax
from ..distributed.signatures import loss_rule

__all__ = ["cross_entropy", "nll_loss", "mse_loss", "l1_loss",
           "binary_cross_entropy_with_logits", "binary_cross_entropy"]

_REDUCTIONS = ("none", "mean", "sum")


def _reduction(size_average, reduce, reduction):
    """PyTorch's legacy size_average/reduce arguments override ``reduction``."""
    if size_average is not None or reduce is not None:
        size_average = True if size_average is None else size_average
        reduce = True if reduce is None else reduce
        return "mean" if size_average and reduce else "sum" if reduce else "none"
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{reduction!r} is not a valid value for reduction; expected one of "
                         f"{_REDUCTIONS}")
    return reduction


def _reduce(loss, reduction):
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    return loss


# ------------------------------------------------------------------ class-index targets
def _check_target_shape(input, target, op):
    """The target's shape against the input's, each mismatch reported with the
    exception PyTorch raises for it: a batch size mismatch (a ValueError) before
    the wrong number of dims or any other difference (a RuntimeError)."""
    if input.ndim == 0:
        raise ValueError(f"{op}(): input must have at least 1 dim (C) or (N, C, ...), got a "
                         f"0-dim tensor")
    if input.ndim == 1:     # unbatched (C,): a 0-d target, or one of shape (1,)
        if target.ndim > 1:
            raise RuntimeError(f"{op}(): for an unbatched input of shape {list(input.shape)} "
                               f"the target must be 0-dim, got shape {list(target.shape)}")
        if target.ndim == 1 and target.shape[0] != 1:
            raise ValueError(f"{op}(): for an unbatched input of shape {list(input.shape)} "
                             f"the target must be 0-dim (or of size 1), got shape "
                             f"{list(target.shape)}")
        return ()
    out_shape = (input.shape[0],) + tuple(input.shape[2:])
    if target.shape[:1] != input.shape[:1]:
        raise ValueError(f"{op}(): expected input batch_size ({input.shape[0]}) to match target "
                         f"batch_size ({target.shape[0] if target.ndim else 'a 0-dim target'})")
    if tuple(target.shape) != out_shape:
        raise RuntimeError(f"{op}(): expected target of shape {list(out_shape)} for input of "
                           f"shape {list(input.shape)}, got {list(target.shape)}")
    return out_shape


def _rows(input, target, op):
    """(N, C, d1..) / (C,) input and (N, d1..) / () target -> (M, C) rows, (M,) target
    rows, the unreduced loss shape and the number of classes."""
    check_tensor(input, "input", op)
    check_tensor(target, "target", op)
    check_same_device(op, ("input", input), target=target)
    out_shape = _check_target_shape(input, target, op)
    if input.ndim == 1:
        return input.reshape(1, -1), target.reshape(1), (), input.shape[0]
    C = input.shape[1]
    rows = input if input.ndim == 2 else input.movedim(1, -1).reshape(-1, C)
    return rows, target.reshape(-1), out_shape, C


def _check_target_dtype(target, op):
    if np.dtype(target.dtype.storage).kind not in "iu":
        raise TypeError(f"{op}(): class-index target must be an integer tensor (int64), got "
                        f"{target.dtype}")


def check_targets(t, C, ignore_index, op):
    """Class indices ``t`` (an int array) in [0, C) or ``ignore_index``.  Runs in the
    loss Function's forward, so a graph checks every call's targets too."""
    valid = t[t != ignore_index]
    # (on a device: min and max come to the host, like PyTorch's device-side assert)
    if valid.size and (int(valid.min()) < 0 or int(valid.max()) >= C):
        bad = valid[(valid < 0) | (valid >= C)][0]
        raise IndexError(f"{op}(): target {int(bad)} is out of bounds for {C} classes "
                         f"(expected 0 <= target < {C}, or ignore_index={ignore_index})")
    return t.astype(np.int64, copy=False)


def _check_weight(weight, C, op, input):
    """``weight`` checked: C elements, on ``input``'s device."""
    if weight is None:
        return None
    check_tensor(weight, "weight", op)
    if tuple(weight.shape) != (C,):
        raise RuntimeError(f"{op}(): weight must be a 1-D tensor of {C} elements (one per "
                           f"class), got shape {list(weight.shape)}")
    check_same_device(op, ("input", input), weight=weight)
    return weight


def target_array(target):
    if isinstance(target, Tensor):
        return array_module(target._data).asarray(target._data, np.int64).reshape(-1)
    return target


class TargetWeightSum(Function):
    """The 'mean' denominator of a class-index loss: the sum of weight[target] over
    the targets that are not ``ignore_index`` (their count without weights),
    computed on the host in float64, as one node a graph traces.  No gradient."""
    reads_on_host = True        # a CUDA graph cannot hold it (pyflow.graph.cuda_graph)

    @staticmethod
    def forward(ctx, target, weight, ignore_index, dtype):
        t = target_array(target)
        kept = t[t != ignore_index]
        if weight is None:
            total = float(kept.size)
        else:
            w = weight._compute()
            total = float(array_module(w).asarray(w, np.float64)[kept].sum())
        out = wrap(array_module(t).asarray(total, dtype.compute), dtype, target.device)
        ctx.mark_non_differentiable(out)
        return out

    @staticmethod
    def backward(ctx, g):
        return None, None, None, None


def _global_weight_sum(tg, weight, ignore_index, dtype):
    """TargetWeightSum for global tensors, with ops, so a split target gives a
    partial sum of per-rank counts instead of being gathered."""
    keep = tg != ignore_index
    if weight is None:
        return keep.sum().to(dtype)
    return (weight[where(keep, tg, 0)] * keep).sum().to(dtype)


def _finish(loss_rows, tg, weight, ignore_index, reduction, out_shape):
    if reduction == "none":
        return loss_rows.reshape(out_shape)
    if reduction == "sum":
        return loss_rows.sum()
    # a mean of half-precision losses is summed and divided in float32: a float16
    # sum overflows at 65,504 (about 50,000 rows of loss 1.3), and a count rounds
    # in bfloat16; the mean itself fits
    half = loss_rows.dtype.itemsize < 4
    total = (loss_rows.float() if half else loss_rows).sum()
    if loss_rows._placement is not None or tg._placement is not None:
        den = _global_weight_sum(tg, weight, ignore_index, total.dtype)
    else:
        den = TargetWeightSum.apply(tg, weight, int(ignore_index), total.dtype)
    with np.errstate(invalid="ignore", divide="ignore"):  # all ignored: 0 / 0 = NaN, silently
        mean = total / den
    return mean.to(loss_rows.dtype) if half else mean


class CrossEntropy(Function):
    """Per-row loss of fused log_softmax + NLL with label smoothing."""
    autocast = "fp32"
    reads_on_host = True        # check_targets: a CUDA graph cannot hold it
    sbp_rule = loss_rule

    @staticmethod
    def forward(ctx, x, target, weight, ignore_index, smoothing):
        target = check_targets(target_array(target), x.shape[1], ignore_index, "cross_entropy")
        dt = x.dtype
        xa = compute_array(x, dt)
        w = None if weight is None else compute_array(weight, dt)
        loss, lse = kernel("cross_entropy", x.device.type)(xa, target, w, ignore_index, smoothing)
        ctx.args = (target, w, ignore_index, smoothing, lse)
        ctx.save_for_backward(x)
        return wrap(loss, dt, x.device)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        target, w, ignore_index, smoothing, lse = ctx.args
        dt = x.dtype
        if is_grad_enabled():  # differentiable form: softmax from ops
            p = softmax(x, 1)
            C = x.shape[1]
            xp = array_module(target)           # numpy, or the device's
            wt = xp.ones(C) if w is None else xp.asarray(w, np.float64)
            keep = (target != ignore_index)
            onehot = xp.zeros((target.size, C))
            onehot[xp.nonzero(keep)[0], target[keep]] = 1.0
            a = (1 - smoothing) * wt[xp.where(keep, target, 0)] * keep       # per row
            b = smoothing / C * keep
            coef_p = wrap((a + b * wt.sum())[:, None], dt, x.device)
            const = wrap(a[:, None] * onehot + b[:, None] * wt[None, :], dt, x.device)
            return (g.reshape(-1, 1) * (p * coef_p - const)), None, None, None, None
        dx = kernel("cross_entropy_backward", x.device.type)(
            compute_array(g, dt), compute_array(x, dt), target, w, ignore_index, smoothing, lse)
        return wrap(dx, dt, x.device), None, None, None, None


@autocast_op("fp32")     # the whole loss, its soft-target and composite forms too
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """Cross entropy of logits ``input`` (C), (N, C) or (N, C, d1, ...) against class
    indices (int64, shape without C) or class probabilities (same shape as input)."""
    reduction = _reduction(size_average, reduce, reduction)
    check_tensor(input, "input", "cross_entropy")
    check_tensor(target, "target", "cross_entropy")
    if not isinstance(label_smoothing, numbers.Real) or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy(): label_smoothing must be between 0.0 and 1.0, got "
                         f"{label_smoothing!r}")
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"cross_entropy(): expected floating point logits, got {input.dtype}")
    if target.dtype.is_floating_point:
        if ignore_index >= 0:   # PyTorch refuses it rather than ignore it silently
            raise RuntimeError(f"cross_entropy(): ignore_index ({ignore_index}) is not "
                               f"supported for a floating point (class probability) target")
        return _cross_entropy_probs(input, target, weight, reduction, label_smoothing)
    if tuple(target.shape) == tuple(input.shape) and input.ndim == 1:
        # (C,) logits and a (C,) target: PyTorch reads class probabilities
        raise RuntimeError(f"cross_entropy(): a target of the input's shape "
                           f"{list(input.shape)} holds class probabilities and must be floating "
                           f"point, got {target.dtype}")
    _check_target_dtype(target, "cross_entropy")
    x, tg, out_shape, C = _rows(input, target, "cross_entropy")
    weight = _check_weight(weight, C, "cross_entropy", input)
    loss = CrossEntropy.apply(x, tg, weight, int(ignore_index), float(label_smoothing))
    return _finish(loss, tg, weight, ignore_index, reduction, out_shape)


def _cross_entropy_probs(input, target, weight, reduction, smoothing):
    """Soft targets: -sum_c w_c * q_c * log_softmax(x)_c, mean over samples."""
    if tuple(target.shape) != tuple(input.shape):
        # Not probabilities: PyTorch then reads it as class indices, so a batch size
        # mismatch is its ValueError; any other difference is the RuntimeError below.
        try:
            _check_target_shape(input, target, "cross_entropy")
        except RuntimeError:
            pass
        raise RuntimeError(f"cross_entropy(): a floating point (probability) target must have "
                           f"the input's shape {list(input.shape)}, got {list(target.shape)}; "
                           f"class indices must be an integer tensor")
    class_dim = 0 if input.ndim == 1 else 1
    C = input.shape[class_dim]
    weight = _check_weight(weight, C, "cross_entropy", input)
    q = target if smoothing == 0 else target * (1.0 - smoothing) + smoothing / C
    wq = q if weight is None else q * weight.reshape((C,) + (1,) * (input.ndim - class_dim - 1))
    loss = -(log_softmax(input, class_dim) * wq).sum(class_dim)
    return _reduce(loss, reduction)


class NLLLoss(Function):
    sbp_rule = loss_rule
    autocast = "fp32"
    reads_on_host = True        # check_targets: a CUDA graph cannot hold it
    @staticmethod
    def forward(ctx, x, target, weight, ignore_index):
        target = check_targets(target_array(target), x.shape[1], ignore_index, "nll_loss")
        dt = x.dtype
        w = None if weight is None else compute_array(weight, dt)
        loss = kernel("nll_loss", x.device.type)(compute_array(x, dt), target, w, ignore_index)
        ctx.args = (target, w, ignore_index, x.shape[1])
        ctx.dt = dt
        return wrap(loss, dt, x.device)

    @staticmethod
    def backward(ctx, g):
        return NLLLossBackward.apply(g, *ctx.args), None, None, None


class NLLLossBackward(Function):
    """Scatter -w[t] * g into the target columns; linear in g, so its own
    backward is the gather of the forward."""

    @staticmethod
    def forward(ctx, g, target, w, ignore_index, C):
        ctx.args = (target, w, ignore_index)
        dx = kernel("nll_loss_backward", g.device.type)(compute_array(g, g.dtype), target, w,
                                                         ignore_index, C)
        return wrap(dx, g.dtype, g.device)

    @staticmethod
    def backward(ctx, gg):
        target, w, ignore_index = ctx.args
        loss = kernel("nll_loss", gg.device.type)(compute_array(gg, gg.dtype), target, w,
                                                  ignore_index)
        return wrap(loss, gg.dtype, gg.device), None, None, None, None


@autocast_op("fp32")
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    """Negative log likelihood of log-probabilities ``input`` at class indices ``target``."""
    reduction = _reduction(size_average, reduce, reduction)
    x, tg, out_shape, C = _rows(input, target, "nll_loss")
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"nll_loss(): expected a floating point input, got {input.dtype}")
    _check_target_dtype(target, "nll_loss")
    weight = _check_weight(weight, C, "nll_loss", input)
    loss = NLLLoss.apply(x, tg, weight, int(ignore_index))
    return _finish(loss, tg, weight, ignore_index, reduction, out_shape)


# ------------------------------------------------------------------ regression losses
def _check_pair(input, target, op):
    """``input`` and ``target`` in their common dtype.  PyTorch broadcasts the two
    before the arithmetic, so a 0-d operand's dtype counts in full (float32 input,
    float64 0-d target: a float64 loss), unlike in plain elementwise promotion."""
    check_tensor(input, "input", op)
    check_tensor(target, "target", op)
    if tuple(input.shape) != tuple(target.shape):
        broadcast_shapes(tuple(input.shape), tuple(target.shape), op=op)
    if input.dtype is not target.dtype:
        dt = _dt.promote_types(input.dtype, target.dtype)
        input, target = input.to(dt), target.to(dt)
    return input, target


@autocast_op("fp32")
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """(input - target) ** 2, reduced."""
    reduction = _reduction(size_average, reduce, reduction)
    input, target = _check_pair(input, target, "mse_loss")
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"mse_loss(): expected floating point input and target, got "
                           f"{input.dtype}")
    d = input - target
    return _reduce(d * d, reduction)


@autocast_op("fp32")
def l1_loss(input, target, size_average=None, reduce=None, reduction="mean"):
    """|input - target|, reduced."""
    reduction = _reduction(size_average, reduce, reduction)
    input, target = _check_pair(input, target, "l1_loss")
    return _reduce((input - target).abs(), reduction)


# ------------------------------------------------------------------ binary losses
class BCEWithLogits(Function):
    """Elementwise loss w * ((1-y)*x + (1 + (pw-1)*y) * softplus(-x))."""
    autocast = "fp32"

    @staticmethod
    def forward(ctx, x, y, weight, pos_weight):
        dt = _dt.promote_types(x.dtype, y.dtype)
        xa, ya = compute_array(x, dt), compute_array(y, dt)
        pw = None if pos_weight is None else compute_array(pos_weight, dt)
        loss, sp = kernel("bce_with_logits", x.device.type)(xa, ya, pw)
        ctx.save_for_backward(x, y, weight, pos_weight)
        ctx.unweighted, ctx.softplus_neg = loss, sp
        if weight is not None:
            loss = loss * compute_array(weight, dt)
        return wrap(as_array(loss), dt, x.device)

    @staticmethod
    def backward(ctx, g):
        x, y, w, pw = ctx.saved_tensors
        gw = g if w is None else g * w
        gx = gy = gwt = gpw = None
        if ctx.needs_input_grad[0]:
            s = sigmoid(x)
            gx = gw * (s - y) if pw is None else gw * (s * (1 + (pw - 1) * y) - pw * y)
            gx = unbroadcast(gx, x.shape)
        sp = None
        if ctx.needs_input_grad[1] or (pw is not None and ctx.needs_input_grad[3]):
            sp = (-x).relu() + (1 + (-(x.abs())).exp()).log()
        if ctx.needs_input_grad[1]:
            gy = unbroadcast(gw * (-x) if pw is None else gw * ((pw - 1) * sp - x), y.shape)
        if w is not None and ctx.needs_input_grad[2]:
            gwt = unbroadcast(g * wrap(ctx.unweighted, g.dtype, g.device), w.shape)
        if pw is not None and ctx.needs_input_grad[3]:
            gpw = unbroadcast(gw * y * sp, pw.shape)
        return gx, gy, gwt, gpw


@autocast_op("fp32")
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None):
    """Sigmoid + binary cross entropy in the numerically stable log-sum-exp form."""
    reduction = _reduction(size_average, reduce, reduction)
    check_tensor(input, "input", "binary_cross_entropy_with_logits")
    check_tensor(target, "target", "binary_cross_entropy_with_logits")
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"binary_cross_entropy_with_logits(): target size "
                         f"({list(target.shape)}) must be the same as input size "
                         f"({list(input.shape)})")
    if not input.dtype.is_floating_point or not target.dtype.is_floating_point:
        raise RuntimeError(f"binary_cross_entropy_with_logits(): expected floating point input "
                           f"and target, got {input.dtype} and {target.dtype}")
    for name, t in (("weight", weight), ("pos_weight", pos_weight)):
        if t is not None:
            check_tensor(t, name, "binary_cross_entropy_with_logits")
            if broadcast_shapes(tuple(t.shape), tuple(input.shape),
                                op=f"binary_cross_entropy_with_logits ({name})") != \
                    tuple(input.shape):
                raise RuntimeError(f"binary_cross_entropy_with_logits(): {name} of shape "
                                   f"{list(t.shape)} must broadcast to the input's shape "
                                   f"{list(input.shape)}")
    return _reduce(BCEWithLogits.apply(input, target, weight, pos_weight), reduction)


@autocast_op("fp32")
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None,
                         reduction="mean"):
    """-(y * log(p) + (1 - y) * log(1 - p)) with each log clamped at -100 like PyTorch."""
    reduction = _reduction(size_average, reduce, reduction)
    check_tensor(input, "input", "binary_cross_entropy")
    check_tensor(target, "target", "binary_cross_entropy")
    if tuple(target.shape) != tuple(input.shape):
        raise ValueError(f"binary_cross_entropy(): target size ({list(target.shape)}) must be "
                         f"the same as input size ({list(input.shape)})")
    p = input.detach()._compute()
    xp = array_module(p)
    if p.size and (float(xp.nanmin(p)) < 0 or float(xp.nanmax(p)) > 1):
        raise RuntimeError("binary_cross_entropy(): all elements of input should be between "
                           "0 and 1")
    with np.errstate(divide="ignore"):   # log(0) = -inf, clamped like PyTorch
        loss = -(target * input.log().clamp(min=-100)
                 + (1 - target) * (1 - input).log().clamp(min=-100))
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)
