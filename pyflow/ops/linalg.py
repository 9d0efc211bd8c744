"""Matrix products: matmul (all of PyTorch's cases), mm, bmm, mv, dot, linear,
addmm, baddbmm.

One differentiable kernel does the work: ``Matmul``, a (..., n, k) @ (..., k, m)
product with broadcast batch dims.  ``matmul`` reduces every other case to it
with views, as PyTorch does: a 1-D operand gets a unit dim that is squeezed
away afterwards, and an N-D @ 2-D product is *folded* into one 2-D GEMM (the
batch dims join the rows), so its weight gradient is one GEMM too instead of a
batched product followed by a sum.  ``linear`` has its own Function for the
same reason: reshape the input to 2-D, one GEMM forward, one GEMM per gradient.

Mixed dtypes promote (``promote_types``); gradients come back in each input's
own dtype.
"""
import math

import numpy as np

from .. import dtypes as _dt
from ..autograd import (AUTOCAST, GRAD_MODE, Context, Function, autocast_op, is_grad_enabled,
                        record)
from ..tensor import Tensor
from ._method import tensor_method
from ..tensor import host_tensor

_new = object.__new__
from ._util import (CPU_KERNELS as _CPU, broadcast_shapes, check_tensor, compute_array,
                    cpu_kernel as _cpu_kernel, kernel, local, trace_state as _trace,
                    unbroadcast, wrap)
from ..tensor import TENSOR_TYPES
from .elementwise import add, mul
from .reduce import sum as _sum
from .shape import reshape, squeeze, unsqueeze
from ..distributed.signatures import linear_rule, matmul_rule

__all__ = ["matmul", "mm", "bmm", "mv", "dot", "linear", "addmm", "baddbmm"]


def _prod(shape):
    """The row count of a fold to 2-D, spelled out: ``reshape(-1, k)`` cannot infer
    it when k is 0 (PyTorch multiplies (n, 0) @ (0, m) into zeros)."""
    return math.prod(shape)


def _fit(g, x):
    """Gradient ``g`` summed over broadcast dims and cast to ``x``'s dtype."""
    g = unbroadcast(g, tuple(x.shape))
    return g if g.dtype is x.dtype else g.to(x.dtype)


def _check_bool(op, *ts):
    """PyTorch has no boolean matrix product (its GEMMs are 'not implemented for
    Bool'); NumPy's would silently give a logical and/or product."""
    for t in ts:
        if t is not None and t.dtype is _dt.bool:
            raise RuntimeError(f"{op}(): not implemented for bool tensors; convert with "
                               f".float() or .long() first")


def _check_device(a, b, op):
    if a.device != b.device:
        raise RuntimeError(f"{op}(): expected all tensors to be on the same device, but found "
                           f"{a.device} and {b.device}")


# ------------------------------------------------------------------ the one product
class Matmul(Function):
    """(..., n, k) @ (..., k, m); the batch dims broadcast like NumPy's."""
    sbp_rule = matmul_rule
    autocast = "lower"

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        dt = _dt.promote_types(a.dtype, b.dtype)
        out = kernel("matmul", a.device.type)(compute_array(a, dt), compute_array(b, dt))
        return wrap(out, dt, a.device)

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        ga = _fit(matmul(g, b.mT), a) if ctx.needs_input_grad[0] else None
        gb = _fit(matmul(a.mT, g), b) if ctx.needs_input_grad[1] else None
        return ga, gb


class Dot(Matmul):
    """1-D x 1-D: the same forward, a backward with elementwise products."""
    autocast = None             # torch's CPU autocast leaves dot in its inputs' dtype

    @staticmethod
    def backward(ctx, g):
        a, b = ctx.saved_tensors
        return (_fit(mul(g, b), a) if ctx.needs_input_grad[0] else None,
                _fit(mul(g, a), b) if ctx.needs_input_grad[1] else None)


def _cannot_multiply(op, a, b, why):
    return RuntimeError(f"{op}(): shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be "
                        f"multiplied ({why})")


@tensor_method("matmul", "__matmul__")
def matmul(input, other):
    """torch.matmul: dot, matrix-vector, vector-matrix, matrix and batched
    products, with the batch dims broadcast."""
    # Fast path: ``Matmul``'s forward run here and recorded as ``Matmul.apply``
    # records it, for local operands (see _util, ``local``) in the plain cases:
    # two matrices, or two stacks of matrices with the same batch dims
    # (attention's per-head products), of one numeric dtype whose sizes agree.
    # Everything else takes the general path below, which also checks.
    if type(input) in TENSOR_TYPES and type(other) in TENSOR_TYPES:
        a, b = input._data, other._data
        dtype = input.dtype
        if type(a) is np.ndarray and type(b) is np.ndarray and other.dtype is dtype \
                and dtype.category and dtype.storage is dtype.compute \
                and input._placement is None and other._placement is None \
                and _trace.tracer is None and not AUTOCAST.enabled:
            sa, sb = a.shape, b.shape
            nd = len(sa)
            if nd == len(sb) and nd >= 2 and sa[-1] == sb[-2] and (nd == 2 or sa[:-2] == sb[:-2]):
                t = _new(Tensor)        # host_tensor(the product, dtype, device), inline
                t._data = (_CPU.get("matmul") or _cpu_kernel("matmul"))(a, b)
                t.dtype = dtype
                t.device = input.device
                t.requires_grad = False
                t.grad = t.grad_fn = t._accumulator = t._hooks = t._base = None
                t._out_idx = 0
                t._version = [0]
                if (input.requires_grad or other.requires_grad) and GRAD_MODE.enabled:
                    ctx = Context()         # save_for_backward(input, other), inline
                    ctx._saved = ((input, input._version[0]), (other, other._version[0]))
                    record(Matmul, ctx, (input, other), t)
                return t
    check_tensor(input, "input", "matmul")
    check_tensor(other, "other", "matmul")
    _check_device(input, other, "matmul")
    da, db = input.ndim, other.ndim
    if da == 0 or db == 0:
        raise RuntimeError(f"matmul(): both arguments need to be at least 1-D, but they are "
                           f"{da}-D and {db}-D")
    k_a = input.shape[-1]
    k_b = other.shape[0] if db == 1 else other.shape[-2]
    if k_a != k_b:
        raise _cannot_multiply("matmul", input, other,
                               f"size {k_a} of input's last dim != size {k_b} of other's "
                               f"{'only' if db == 1 else 'second-to-last'} dim")
    _check_bool("matmul", input, other)
    if da == 1 and db == 1:
        return Dot.apply(input, other)
    if da == 1:                       # (k) @ (..., k, m) -> (..., m)
        return squeeze(matmul(unsqueeze(input, 0), other), -2)
    if db == 1:                       # (..., n, k) @ (k) -> (..., n)
        return squeeze(matmul(input, unsqueeze(other, -1)), -1)
    if db == 2 and da > 2:            # fold the batch into the rows: one 2-D GEMM
        lead = tuple(input.shape[:-1])
        out = Matmul.apply(reshape(input, (_prod(lead), k_a)), other)
        return reshape(out, lead + (other.shape[-1],))
    if da > 2 or db > 2:
        broadcast_shapes(tuple(input.shape[:-2]), tuple(other.shape[:-2]),
                         op="matmul() batch dims")
    return Matmul.apply(input, other)


@tensor_method("__rmatmul__")
def _rmatmul(self, other):
    if not isinstance(other, Tensor):
        return NotImplemented
    return matmul(other, self)


# ------------------------------------------------------------------ strict variants
def _check_ndim(t, name, op, ndim, what):
    check_tensor(t, name, op)
    if t.ndim != ndim:
        raise RuntimeError(f"{op}(): {name} must be {what} ({ndim}-D), got a {t.ndim}-D tensor "
                           f"of shape {tuple(t.shape)}")


@tensor_method()
def mm(input, mat2):
    """(n, k) @ (k, m); no broadcasting."""
    _check_ndim(input, "input", "mm", 2, "a matrix")
    _check_ndim(mat2, "mat2", "mm", 2, "a matrix")
    _check_device(input, mat2, "mm")
    if input.shape[1] != mat2.shape[0]:
        raise _cannot_multiply("mm", input, mat2, f"{input.shape[0]}x{input.shape[1]} and "
                               f"{mat2.shape[0]}x{mat2.shape[1]}")
    _check_bool("mm", input, mat2)
    return Matmul.apply(input, mat2)


@tensor_method()
def bmm(input, mat2):
    """(b, n, k) @ (b, k, m); same batch size, no broadcasting."""
    _check_ndim(input, "input", "bmm", 3, "a batch of matrices")
    _check_ndim(mat2, "mat2", "bmm", 3, "a batch of matrices")
    _check_device(input, mat2, "bmm")
    if input.shape[0] != mat2.shape[0]:
        raise RuntimeError(f"bmm(): batch sizes differ: input {tuple(input.shape)} has "
                           f"{input.shape[0]} matrices, mat2 {tuple(mat2.shape)} has "
                           f"{mat2.shape[0]}")
    if input.shape[2] != mat2.shape[1]:
        raise _cannot_multiply("bmm", input, mat2, f"size {input.shape[2]} of input's last dim "
                               f"!= size {mat2.shape[1]} of mat2's dim 1")
    _check_bool("bmm", input, mat2)
    return Matmul.apply(input, mat2)


@tensor_method()
@autocast_op(None)              # matmul's policy is not mv's: torch leaves mv uncast
def mv(input, vec):
    """(n, k) @ (k,) -> (n,)."""
    _check_ndim(input, "input", "mv", 2, "a matrix")
    _check_ndim(vec, "vec", "mv", 1, "a vector")
    if input.shape[1] != vec.shape[0]:
        raise _cannot_multiply("mv", input, vec, f"size {input.shape[1]} of input's last dim "
                               f"!= size {vec.shape[0]} of vec")
    return matmul(input, vec)


@tensor_method()
def dot(input, other):
    """Inner product of two 1-D tensors of the same size (a 0-d tensor)."""
    _check_ndim(input, "input", "dot", 1, "a vector")
    _check_ndim(other, "other", "dot", 1, "a vector")
    _check_device(input, other, "dot")
    if input.shape[0] != other.shape[0]:
        raise RuntimeError(f"dot(): inconsistent tensor size: input has {input.shape[0]} "
                           f"elements and other has {other.shape[0]}")
    _check_bool("dot", input, other)
    return Dot.apply(input, other)


# ------------------------------------------------------------------ linear
def _save_linear(ctx, x, x2, weight):
    """What Linear's backward needs: ``x`` itself, not only ``x2``, its rows made
    in forward, where nothing records: a double backward must follow the graph
    into ``x`` (the weight's gradient depends on it), and ``x2`` would cut it.
    ``x2`` is kept too when it is a copy (a layout no view could fold), which
    backward then need not make again."""
    ctx.save_for_backward(x, weight, None if x2._version is x._version else x2)


class Linear(Function):
    """input (*, in) @ weight (out, in).T + bias (out,), as one 2-D GEMM."""
    sbp_rule = linear_rule
    autocast = "lower"

    @staticmethod
    def forward(ctx, x, weight, bias):
        in_f, out_f = weight.shape[1], weight.shape[0]
        x2 = reshape(x, (_prod(x.shape[:-1]), in_f))   # a view unless x's layout forbids it
        _save_linear(ctx, x, x2, weight)
        ctx.in_shape, ctx.has_bias = tuple(x.shape), bias is not None
        dt = x.dtype
        for t in (weight, bias):
            dt = dt if t is None else _dt.promote_types(dt, t.dtype)
        ctx.bias_dtype = None if bias is None else bias.dtype
        out = kernel("linear", x.device.type)(
            compute_array(x2, dt), compute_array(weight, dt),
            None if bias is None else compute_array(bias, dt))
        return wrap(out.reshape(ctx.in_shape[:-1] + (out_f,)), dt, x.device)

    @staticmethod
    def backward(ctx, g):
        x, w, x2 = ctx.saved_tensors
        if not GRAD_MODE.enabled and local(g) and local(x) and local(w) \
                and g.dtype is x.dtype is w.dtype and x.dtype.storage is x.dtype.compute:
            return _linear_grads(ctx, g, x, w, x2)
        if x2 is None or is_grad_enabled():    # (a double backward follows x's graph)
            x2 = x if x.ndim == 2 else reshape(x, (_prod(ctx.in_shape[:-1]), x.shape[-1]))
        g2 = reshape(g, (-1, w.shape[0]))
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = reshape(matmul(g2, w), ctx.in_shape)
            gx = gx if gx.dtype is x.dtype else gx.to(x.dtype)
        if ctx.needs_input_grad[1]:
            gw = _fit(matmul(g2.mT, x2), w)          # one GEMM over all rows
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = _sum(g2, 0)
            gb = gb if gb.dtype is ctx.bias_dtype else gb.to(ctx.bias_dtype)
        return gx, gw, gb


def _linear_grads(ctx, g, x, w, x2):
    """``Linear.backward`` by kernel calls, where nothing records (the usual
    ``loss.backward()``) and g, x and w are local host tensors of one dtype: the
    products and the sum the ops below would run, on the arrays, without an op's
    dispatch around each."""
    dtype, device = x.dtype, x.device
    out_f = w._data.shape[0]
    gd = g._data
    g2 = gd if gd.ndim == 2 else gd.reshape(_prod(gd.shape[:-1]), out_f)
    needs = ctx.needs_input_grad
    gx = gw = gb = None
    mm = _CPU.get("matmul") or _cpu_kernel("matmul")
    if needs[0]:
        gx = mm(g2, w._data)
        gx = host_tensor(gx if gd.ndim == 2 else gx.reshape(ctx.in_shape), dtype, device)
    if needs[1]:
        xd = x._data if x2 is None else x2._data    # (x2: forward's copy of x's rows)
        if xd.ndim != 2:
            xd = xd.reshape(_prod(xd.shape[:-1]), xd.shape[-1])
        gw = host_tensor(mm(g2.T, xd), dtype, device)
    if ctx.has_bias and needs[2]:
        gb = (_CPU.get("sum") or _cpu_kernel("sum"))(g2, _ROWS, False, dtype.compute)
        gb = host_tensor(gb, dtype, device)
        if gb.dtype is not ctx.bias_dtype:
            gb = gb.to(ctx.bias_dtype)
    return gx, gw, gb


_ROWS = (0,)


def _direct_linear(input, weight, bias):
    """``Linear``'s forward run directly (``local`` tensors, see _util) and recorded
    as ``Linear.apply`` records it, for a C-contiguous input of rank >= 1, a 2-D
    weight of its dtype and a bias of shape (out,) or none; None otherwise (the
    general path checks and explains)."""
    x, w = input._data, weight._data
    dtype = input.dtype
    if weight.dtype is not dtype or w.ndim != 2 or x.ndim == 0 or x.shape[-1] != w.shape[1] \
            or dtype.category == 0 or dtype.storage is not dtype.compute \
            or not x.flags.c_contiguous:
        return None
    grad = input.requires_grad or weight.requires_grad
    if bias is not None:
        if not local(bias) or bias.dtype is not dtype or bias._data.shape != (w.shape[0],):
            return None
        grad = grad or bias.requires_grad
    lead = x.shape[:-1]
    x2 = x if x.ndim == 2 else x.reshape(_prod(lead), x.shape[-1])     # the rows: a view
    out = (_CPU.get("linear") or _cpu_kernel("linear"))(x2, w, None if bias is None else bias._data)
    out = host_tensor(out if x.ndim == 2 else out.reshape(lead + (w.shape[0],)), dtype,
                      input.device)
    if grad and GRAD_MODE.enabled:
        ctx = Context()
        ctx.save_for_backward(input, weight, None)      # (_save_linear, for a view x2)
        ctx.in_shape, ctx.has_bias = x.shape, bias is not None
        ctx.bias_dtype = None if bias is None else bias.dtype
        record(Linear, ctx, (input, weight, bias), out)
    return out


def linear(input, weight, bias=None):
    """torch.nn.functional.linear: ``input @ weight.T + bias`` for input of any rank >= 1."""
    if local(input) and local(weight) and not AUTOCAST.enabled:
        out = _direct_linear(input, weight, bias)
        if out is not None:
            return out
    check_tensor(input, "input", "linear")
    check_tensor(weight, "weight", "linear")
    if bias is not None:
        check_tensor(bias, "bias", "linear")
    if input.ndim == 0:
        raise RuntimeError("linear(): input must be at least 1-D, got a 0-d tensor")
    if weight.ndim not in (1, 2):
        raise RuntimeError(f"linear(): weight must be 1-D or 2-D, got shape {tuple(weight.shape)}")
    _check_device(input, weight, "linear")
    if input.shape[-1] != weight.shape[-1]:
        w_shape = tuple(weight.shape)
        raise RuntimeError(f"linear(): input and weight shapes cannot be multiplied: input "
                           f"{tuple(input.shape)} has {input.shape[-1]} features, weight "
                           f"{w_shape} expects {w_shape[-1]}")
    _check_bool("linear", input, weight, bias)
    if weight.ndim == 1:
        out = matmul(input, weight)
        return out if bias is None else add(out, bias)
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        return add(Linear.apply(input, weight, None), bias)   # unusual bias: broadcast it
    return Linear.apply(input, weight, bias)


# ------------------------------------------------------------------ fused add + product
def _add_scaled(prod, input, beta, alpha, op):
    try:
        shape = broadcast_shapes(tuple(input.shape), tuple(prod.shape), op=op)
    except RuntimeError:
        shape = None
    if shape != tuple(prod.shape):
        raise RuntimeError(f"{op}(): input of shape {tuple(input.shape)} cannot be broadcast "
                           f"to the product's shape {tuple(prod.shape)}")
    out = prod if alpha == 1 else mul(prod, alpha)
    if beta == 0:                    # like PyTorch: input is ignored, NaNs in it too
        return out
    return add(out, input if beta == 1 else mul(input, beta))


@tensor_method()
@autocast_op("lower")           # the whole op, input included, as in torch
def addmm(input, mat1, mat2, *, beta=1, alpha=1):
    """beta * input + alpha * (mat1 @ mat2)."""
    check_tensor(input, "input", "addmm")
    return _add_scaled(mm(mat1, mat2), input, beta, alpha, "addmm")


@tensor_method()
@autocast_op("lower")
def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    """beta * input + alpha * bmm(batch1, batch2)."""
    check_tensor(input, "input", "baddbmm")
    return _add_scaled(bmm(batch1, batch2), input, beta, alpha, "baddbmm")
