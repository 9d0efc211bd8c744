"""Reductions over dimensions, with ``keepdim``: sum, mean, prod, max/min, amax/amin,
argmax/argmin, var/std, norm, logsumexp, cumsum, all/any.

Signatures and results follow PyTorch 2: ``dim`` may be None (every dim), an int
(negative counts from the end) or a tuple; ``max(x, dim)`` returns a
``(values, indices)`` named tuple; integer sums are int64; ``mean``, ``var``
and ``norm`` need floating inputs; float16/bfloat16 compute in float32 and
return their own dtype.  Which kernels are NumPy and which numba, and why, is
written in ``kernels/cpu/reduce.py``.

Every backward rule is written with pyflow ops, so it can be differentiated
again.  Gradients of max-like reductions follow PyTorch: ``max(x, dim)`` sends
the gradient to the returned index only; ``max(x)``, ``amax`` and the inf-norm
split it evenly among tied maxima.
"""
import builtins
import math
import warnings
from collections import namedtuple

import numpy as np

from .. import dtypes as _dt
from ..autograd import GRAD_MODE, Context, Function, record_unary
from ..tensor import TENSOR_TYPES, Tensor
from ._method import tensor_method
from ._util import (CPU_KERNELS as _CPU, array_module, as_array, check_tensor, compute_array,
                    cpu_kernel as _cpu_kernel, kernel, normalize_dims,
                    trace_state as _trace, wrap)
from .shape import expand, reshape
from . import elementwise
from .elementwise import abs, div, eq, exp, logical_and, mul, pow, sign, sub, where
from .creation import arange
from ..distributed.signatures import reduce_rule

_new = object.__new__

__all__ = ["sum", "mean", "prod", "max", "min", "amax", "amin", "argmax", "argmin", "var",
           "std", "norm", "logsumexp", "cumsum", "all", "any"]

# What max/min with a dim return, like ``torch.return_types.max``.
max_result = namedtuple("max", ["values", "indices"])
min_result = namedtuple("min", ["values", "indices"])


# ------------------------------------------------------------------ shared helpers
def _dims(input, dim, op, empty_is_all=True):
    """Validated, sorted reduced dims.  An empty ``dim`` (``()``/``[]``) means every
    dim for sum, mean, amax, ... and no dim for all/any (PyTorch's rules); a 0-d
    tensor accepts dim 0/-1 and reduces nothing."""
    check_tensor(input, "input", op)
    if isinstance(dim, (tuple, list)) and len(dim) == 0:
        if not empty_is_all:
            return ()
        dim = None
    dims = normalize_dims(dim, input.ndim, op)
    return dims if input.ndim else ()


def _one_dim(input, dim, op):
    """A single int dim, wrapped (a 0-d tensor accepts 0 and -1)."""
    check_tensor(input, "input", op)
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool):
        raise TypeError(f"{op}(): argument 'dim' must be an int, got {dim!r}")
    return normalize_dims(int(dim), input.ndim, op)[0]


def _reduced_shape(shape, dims, keepdim):
    out = []
    for i, s in enumerate(shape):
        if i not in dims:
            out.append(s)
        elif keepdim:
            out.append(1)
    return tuple(out)


def _keep(t, in_shape, dims, keepdim):
    """A reduced tensor with its reduced dims put back as size 1 (broadcastable)."""
    if keepdim or not dims:
        return t
    return reshape(t, _reduced_shape(in_shape, dims, True))


def _expand_back(g, in_shape, dims, keepdim):
    """Broadcast a reduced gradient back over the reduced dims."""
    return expand(_keep(g, in_shape, dims, keepdim), tuple(in_shape))


def _grad_to(g, x):
    """A gradient in ``x``'s dtype (a ``dtype=`` argument may have changed it)."""
    return g if g.dtype is x.dtype else g.to(x.dtype)


def _as_3d(arr, dims):
    """``arr`` as ``(outer, n, inner)`` with ``dims`` folded into ``n``, for the
    numba kernels.  Adjacent dims reshape in place (a view when strides allow);
    scattered dims are moved last first.  Returns the 3-D array and the shape
    its ``(outer, inner)`` result has without keepdim."""
    shape = arr.shape
    kept = tuple(s for i, s in enumerate(shape) if i not in dims)
    if not dims:
        return arr.reshape(-1, 1, 1), kept
    lo, hi = dims[0], dims[-1]
    if hi - lo + 1 != len(dims):
        order = [i for i in range(arr.ndim) if i not in dims] + list(dims)
        arr = np.transpose(arr, order)
        lo, hi = len(kept), arr.ndim - 1
        shape = arr.shape
    outer = math.prod(shape[:lo])
    n = math.prod(shape[lo:hi + 1])
    inner = math.prod(shape[hi + 1:])
    return arr.reshape(outer, n, inner), kept


def _given(dim):
    """amax/amin's default ``dim=()`` means every dim, but not a dim given."""
    return not (isinstance(dim, (tuple, list)) and len(dim) == 0)


def _check_nonempty(input, dims, dim_given, op):
    """max-like reductions have no identity: an empty reduced dim is an error."""
    if input._data.size:
        return
    if not dim_given:
        raise RuntimeError(f"{op}(): Expected reduction dim to be specified for "
                           f"input.numel() == 0. Specify the reduction dim with the 'dim' "
                           f"argument.")
    for d in dims:
        if input._data.shape[d] == 0:
            raise IndexError(f"{op}(): Expected reduction dim {d} to have non-zero size.")


# ------------------------------------------------------------------ sum, mean, prod
class Sum(Function):
    sbp_rule = reduce_rule(linear=True)
    @staticmethod
    def forward(ctx, x, dims, keepdim, dtype):
        ctx.in_shape, ctx.dims, ctx.keepdim, ctx.in_dtype = x._data.shape, dims, keepdim, x.dtype
        out_dtype = dtype or (_dt.int64 if x.dtype.category < 2 else x.dtype)
        arr = kernel("sum", x.device.type)(compute_array(x, x.dtype), dims, keepdim,
                                           out_dtype.compute)
        return wrap(as_array(arr), out_dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        g = _expand_back(g, ctx.in_shape, ctx.dims, ctx.keepdim)
        return (g if g.dtype is ctx.in_dtype else g.to(ctx.in_dtype)), None, None, None


_ALL_DIMS = tuple(tuple(range(n)) for n in range(65))    # ndim -> (0, ..., ndim - 1)


def _direct_sum(x, dim, keepdim):
    """``Sum``'s forward run directly (``local(x)``, see _util) and recorded as
    ``Sum.apply`` records it, for ``dim`` None or one in-range int and no
    ``dtype=``; None for anything else (a tuple of dims, a 0-d or half-precision
    tensor), which takes the general path."""
    data = x._data
    n = data.ndim
    dtype = x.dtype
    if n == 0 or dtype.storage is not dtype.compute:
        return None
    if dim is None:
        dims = _ALL_DIMS[n]
    elif type(dim) is int and -n <= dim < n:
        dims = (dim % n,)
    else:
        return None
    out = _dt.int64 if dtype.category < 2 else dtype
    res = (_CPU.get("sum") or _cpu_kernel("sum"))(data, dims, keepdim, out.compute)
    t = _new(Tensor)                    # host_tensor(res, out, x.device), inline
    t._data = res if type(res) is np.ndarray else np.asarray(res)
    t.dtype = out
    t.device = x.device
    t.requires_grad = False
    t.grad = t.grad_fn = t._accumulator = t._hooks = t._base = None
    t._out_idx = 0
    t._version = [0]
    if x.requires_grad and GRAD_MODE.enabled:
        ctx = Context()
        ctx.in_shape, ctx.dims, ctx.keepdim, ctx.in_dtype = data.shape, dims, keepdim, dtype
        record_unary(Sum, ctx, x, t, 4)        # (x, dims, keepdim, dtype=None)
    return t


@tensor_method()
def sum(input, dim=None, keepdim=False, *, dtype=None):  # noqa: A001
    """Sum over ``dim``; bool and integer inputs sum to int64 (PyTorch's rule)."""
    if dtype is None and (keepdim is False or keepdim is True) and type(input) in TENSOR_TYPES \
            and input._placement is None and type(input._data) is np.ndarray \
            and _trace.tracer is None:                 # (local(input), inline)
        out = _direct_sum(input, dim, keepdim)
        if out is not None:
            return out
    dims = _dims(input, dim, "sum")
    return Sum.apply(input, dims, keepdim, None if dtype is None else _dt.as_dtype(dtype))


class Mean(Function):
    sbp_rule = reduce_rule(linear=True, mean=True)
    @staticmethod
    def forward(ctx, x, dims, keepdim):
        ctx.in_shape, ctx.dims, ctx.keepdim = x._data.shape, dims, keepdim
        ctx.count = int(np.prod([x._data.shape[d] for d in dims])) if dims else 1
        arr = kernel("mean", x.device.type)(compute_array(x, x.dtype), dims, keepdim)
        return wrap(as_array(arr, x.dtype.compute), x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        return div(_expand_back(g, ctx.in_shape, ctx.dims, ctx.keepdim), ctx.count), None, None


@tensor_method()
def mean(input, dim=None, keepdim=False, *, dtype=None):
    dims = _dims(input, dim, "mean")
    if dtype is not None:
        input = input.to(_dt.as_dtype(dtype))
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be floating "
                           f"point, got {input.dtype}; use .float() or pass dtype=")
    return Mean.apply(input, dims, keepdim)


class Prod(Function):
    autocast = "fp32"
    @staticmethod
    def forward(ctx, x, dims, keepdim, dtype):
        ctx.save_for_backward(x)
        ctx.dims, ctx.keepdim = dims, keepdim
        out_dtype = dtype or (_dt.int64 if x.dtype.category < 2 else x.dtype)
        x3, _ = _as_3d(compute_array(x, x.dtype), dims)
        arr = kernel("prod", x.device.type)(x3, out_dtype.compute)
        return wrap(arr.reshape(_reduced_shape(x._data.shape, dims, keepdim)), out_dtype,
                    x.device)

    @staticmethod
    def backward(ctx, g):
        """d prod / d x_i = product of the others.  out / x_i fails at zeros, so:
        no zero in the slice -> prod / x; one zero -> the product of the rest
        at the zero, 0 elsewhere; two or more zeros -> 0 everywhere."""
        (x,) = ctx.saved_tensors
        dims, shape = ctx.dims, tuple(x.shape)
        is_zero = eq(x, 0)
        x_safe = where(is_zero, 1.0, x)
        p_safe = prod_dims(x_safe, dims, keepdim=True)     # product of the non-zeros
        zeros = sum(is_zero, dims, keepdim=True)
        no_zero = eq(zeros, 0).to(x.dtype)
        lone_zero = logical_and(eq(zeros, 1), is_zero).to(x.dtype)
        grad = mul(p_safe, mul(no_zero, div(1.0, x_safe)) + lone_zero)
        return _grad_to(mul(grad, _keep(g, shape, dims, ctx.keepdim)), x), None, None, None


def prod_dims(input, dims, keepdim=False, dtype=None):
    """prod over a tuple of dims (used by backward rules; PyTorch's ``prod`` takes one dim)."""
    return Prod.apply(input, _dims(input, dims, "prod"), keepdim, dtype)


@tensor_method()
def prod(input, dim=None, keepdim=False, *, dtype=None):
    """Product of all elements, or over one ``dim``; integer inputs give int64."""
    check_tensor(input, "input", "prod")
    if dim is None:
        dims = _dims(input, None, "prod")
    else:
        d = _one_dim(input, dim, "prod")     # checked on a 0-d tensor too (0 or -1)
        dims = (d,) if input.ndim else ()
    return Prod.apply(input, dims, keepdim, None if dtype is None else _dt.as_dtype(dtype))


# ------------------------------------------------------------------ amax/amin, max/min
class _AExtreme(Function):
    """amax/amin over dims; the gradient is split evenly among ties (PyTorch)."""
    sbp_rule = reduce_rule(linear=False)
    name = None

    @classmethod
    def forward(cls, ctx, x, dims, keepdim):
        ctx.dims, ctx.keepdim = dims, keepdim
        arr = kernel(cls.name, x.device.type)(compute_array(x, x.dtype), dims, keepdim)
        out = wrap(arr, x.dtype, x.device)
        ctx.save_for_backward(x, out)
        return out

    @classmethod
    def backward(cls, ctx, g):
        x, out = ctx.saved_tensors
        shape = tuple(x.shape)
        hit = eq(x, _keep(out, shape, ctx.dims, ctx.keepdim)).to(g.dtype)
        ties = sum(hit, ctx.dims, keepdim=True)
        share = div(_keep(g, shape, ctx.dims, ctx.keepdim), ties)
        return mul(hit, share), None, None


class AMax(_AExtreme):
    name = "amax"


class AMin(_AExtreme):
    name = "amin"


@tensor_method()
def amax(input, dim=(), keepdim=False):
    dims = _dims(input, dim, "amax")
    _check_nonempty(input, dims, _given(dim), "amax")
    return AMax.apply(input, dims, keepdim)


@tensor_method()
def amin(input, dim=(), keepdim=False):
    dims = _dims(input, dim, "amin")
    _check_nonempty(input, dims, _given(dim), "amin")
    return AMin.apply(input, dims, keepdim)


class _ExtremeDim(Function):
    """max/min over one dim with indices; the gradient goes to the index only."""
    name = None

    @classmethod
    def forward(cls, ctx, x, d, keepdim):
        ctx.in_shape, ctx.d, ctx.keepdim = x._data.shape, d, keepdim
        x3, _ = _as_3d(compute_array(x, x.dtype), (d,) if x.ndim else ())
        vals, idx = kernel(cls.name, x.device.type)(x3)
        shape = _reduced_shape(x._data.shape, (d,) if x.ndim else (), keepdim)
        values = wrap(vals.reshape(shape), x.dtype, x.device)
        indices = wrap(idx.reshape(shape), _dt.int64, x.device)
        ctx.mark_non_differentiable(indices)
        ctx.indices = indices
        return values, indices

    @classmethod
    def backward(cls, ctx, g, _g_indices):
        shape, d = tuple(ctx.in_shape), ctx.d
        if not shape:
            return g, None, None
        dims = (d,)
        position = arange(shape[d], device=g.device).reshape(
            tuple(n if i == d else 1 for i, n in enumerate(shape)))
        one_hot = eq(position, _keep(ctx.indices, shape, dims, ctx.keepdim)).to(g.dtype)
        return mul(one_hot, _keep(g, shape, dims, ctx.keepdim)), None, None


class MaxDim(_ExtremeDim):
    name = "max_dim"


class MinDim(_ExtremeDim):
    name = "min_dim"


def _max_min(input, dim, keepdim, other, op):
    check_tensor(input, "input", op)
    if isinstance(dim, Tensor) or other is not None:     # max(x, other): elementwise
        other = dim if isinstance(dim, Tensor) else other
        check_tensor(other, "other", op)
        return (elementwise.maximum if op == "max" else elementwise.minimum)(input, other)
    if dim is None:                                       # max(x): a 0-d tensor
        if keepdim:
            raise TypeError(f"{op}(): keepdim=True needs a dim argument")
        dims = _dims(input, None, op)
        _check_nonempty(input, dims, False, op)
        return (AMax if op == "max" else AMin).apply(input, dims, False)
    d = _one_dim(input, dim, op)
    _check_nonempty(input, (d,) if input.ndim else (), True, op)
    values, indices = (MaxDim if op == "max" else MinDim).apply(input, d, keepdim)
    return (max_result if op == "max" else min_result)(values, indices)


@tensor_method()
def max(input, dim=None, keepdim=False, *, other=None):  # noqa: A001
    """``max(x)``: the largest element (0-d); ``max(x, dim, keepdim=False)``:
    ``(values, indices)`` with the first index of each maximum;
    ``max(x, other)``: elementwise maximum.  NaN is the largest value (PyTorch)."""
    return _max_min(input, dim, keepdim, other, "max")


@tensor_method()
def min(input, dim=None, keepdim=False, *, other=None):  # noqa: A001
    """Like ``max`` with the smallest element."""
    return _max_min(input, dim, keepdim, other, "min")


def _arg_extreme(input, dim, keepdim, op):
    check_tensor(input, "input", op)
    if input.dtype is _dt.bool:
        raise RuntimeError(f"{op}(): does not support bool input")
    data = compute_array(input, input.dtype)
    if dim is None:                          # over the flattened tensor
        if input._data.size == 0:
            raise IndexError(f"{op}(): Expected reduction dim to be specified for "
                             f"input.numel() == 0.")
        idx = kernel(op, input.device.type)(data.reshape(1, -1, 1))
        shape = (1,) * input.ndim if keepdim else ()
    else:
        d = _one_dim(input, dim, op)
        dims = (d,) if input.ndim else ()
        _check_nonempty(input, dims, True, op)
        x3, _ = _as_3d(data, dims)
        idx = kernel(op, input.device.type)(x3)
        shape = _reduced_shape(input._data.shape, dims, keepdim)
    return wrap(idx.reshape(shape), _dt.int64, input.device)


@tensor_method()
def argmax(input, dim=None, keepdim=False):
    """Index of the first maximum (of the flattened tensor when ``dim`` is None)."""
    return _arg_extreme(input, dim, keepdim, "argmax")


@tensor_method()
def argmin(input, dim=None, keepdim=False):
    return _arg_extreme(input, dim, keepdim, "argmin")


# ------------------------------------------------------------------ var, std
class VarStd(Function):
    """var (or std = sqrt(var)) with ``correction``; one Function for both so std
    computes sqrt in the compute dtype (no float16 round-trip of the variance)."""

    @staticmethod
    def forward(ctx, x, dims, correction, keepdim, take_sqrt):
        count = int(np.prod([x._data.shape[d] for d in dims], dtype=np.int64))
        ctx.dims, ctx.keepdim, ctx.take_sqrt = dims, keepdim, take_sqrt
        ctx.denominator = builtins.max(count - correction, 0)
        if ctx.denominator == 0:
            warnings.warn(f"{'std' if take_sqrt else 'var'}(): degrees of freedom is <= 0 "
                          f"(correction={correction} for {count} elements per result); "
                          f"the result is inf or nan", RuntimeWarning, stacklevel=4)
        arr = kernel("var", x.device.type)(compute_array(x, x.dtype), dims, correction, keepdim)
        if take_sqrt:
            arr = array_module(arr).sqrt(arr)
        out = wrap(arr, x.dtype, x.device)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):
        """d var / d x = 2 (x - mean) / (n - correction); std divides by 2 std,
        with 0 where std == 0 (PyTorch 2's rule: a constant slice gets 0, not NaN)."""
        x, out = ctx.saved_tensors
        shape, dims = tuple(x.shape), ctx.dims
        g = _keep(g, shape, dims, ctx.keepdim)
        if ctx.take_sqrt:
            s = _keep(out, shape, dims, ctx.keepdim)
            is_zero = eq(s, 0)
            g = mul(div(g, where(is_zero, 1.0, s)), (~is_zero).to(g.dtype))
            scale = 1.0
        else:
            scale = 2.0
        centered = sub(x, mean(x, dims, keepdim=True))
        denominator = float(ctx.denominator)
        with np.errstate(divide="ignore"):
            factor = np.divide(scale, denominator) if denominator else np.inf
        return mul(mul(centered, float(factor)), g), None, None, None, None


def _var_args(input, dim, unbiased, keepdim, correction, op):
    check_tensor(input, "input", op)
    if isinstance(dim, bool):            # var(x, unbiased) overload
        if unbiased is not None:
            raise TypeError(f"{op}(): got unbiased twice (positionally as dim and by name)")
        dim, unbiased = None, dim
    if unbiased is not None and correction is not None:
        raise TypeError(f"{op}(): pass either unbiased or correction, not both")
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    if not isinstance(correction, (int, float, np.integer, np.floating)) or \
            isinstance(correction, bool):
        raise TypeError(f"{op}(): correction must be a number, got {correction!r}")
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"{op}(): std and var only support floating point dtypes, "
                           f"got {input.dtype}")
    return _dims(input, dim, op), correction, keepdim


@tensor_method()
def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Variance over ``dim`` divided by ``n - correction`` (``correction=1`` by
    default: Bessel's correction; ``unbiased=False`` means ``correction=0``)."""
    dims, correction, keepdim = _var_args(input, dim, unbiased, keepdim, correction, "var")
    return VarStd.apply(input, dims, correction, keepdim, False)


@tensor_method()
def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """Standard deviation: ``sqrt(var(...))`` with the same arguments."""
    dims, correction, keepdim = _var_args(input, dim, unbiased, keepdim, correction, "std")
    return VarStd.apply(input, dims, correction, keepdim, True)


# ------------------------------------------------------------------ norm
class Norm(Function):
    """Vector p-norm for a finite p (the inf norms are amax/amin of |x|)."""

    @staticmethod
    def forward(ctx, x, p, dims, keepdim):
        ctx.p, ctx.dims, ctx.keepdim = p, dims, keepdim
        x3, _ = _as_3d(compute_array(x, x.dtype), dims)
        arr = kernel("norm", x.device.type)(x3, p)
        out = wrap(arr.reshape(_reduced_shape(x._data.shape, dims, keepdim)), x.dtype, x.device)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):
        """x |x|^(p-2) / norm^(p-1), written to stay finite where x or the norm
        is 0 (the 2-norm's gradient at 0 is 0, as in PyTorch)."""
        x, out = ctx.saved_tensors
        shape, dims, p = tuple(x.shape), ctx.dims, ctx.p
        g = _keep(g, shape, dims, ctx.keepdim)
        if p == 0:
            return mul(x, 0.0), None, None, None
        if p == 1:
            return mul(sign(x), g), None, None, None
        n = _keep(out, shape, dims, ctx.keepdim)
        n_zero = eq(n, 0)
        n_safe = where(n_zero, 1.0, n)
        not_zero = (~n_zero).to(g.dtype)
        if p == 2:
            return mul(x, mul(div(g, n_safe), not_zero)), None, None, None
        x_zero = eq(x, 0)
        abs_safe = where(x_zero, 1.0, abs(x))
        scaled = mul(mul(sign(x), pow(abs_safe, p - 1)), (~x_zero).to(g.dtype))
        return mul(scaled, mul(div(g, pow(n_safe, p - 1)), not_zero)), None, None, None


@tensor_method()
def norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    """Vector norm over ``dim`` (all elements when None): ``p`` = 'fro' or 2
    (Euclidean), 1, inf, -inf, 0 (count of non-zeros) or any other number."""
    check_tensor(input, "input", "norm")
    if dtype is not None:
        input = input.to(_dt.as_dtype(dtype))
    if not input.dtype.is_floating_point:
        raise RuntimeError(f"norm(): Expected a floating point tensor as input, got {input.dtype}")
    if p == "fro" or p is None:
        p = 2
    elif isinstance(p, str):
        raise ValueError(f"norm(): p must be a number or 'fro', got {p!r} "
                         f"(matrix norms such as 'nuc' are not implemented)")
    elif not isinstance(p, (int, float, np.integer, np.floating)) or isinstance(p, bool):
        raise TypeError(f"norm(): p must be a number or 'fro', got {p!r}")
    dims = _dims(input, dim, "norm")
    if np.isinf(p):
        if builtins.any(input._data.shape[d] == 0 for d in dims):
            raise RuntimeError("norm(): cannot compute the inf norm on an empty tensor because "
                               "the operation does not have an identity")
        return (AMax if p > 0 else AMin).apply(abs(input), dims, keepdim)
    return Norm.apply(input, float(p), dims, keepdim)


# ------------------------------------------------------------------ logsumexp
class LogSumExp(Function):
    @staticmethod
    def forward(ctx, x, dims, keepdim):
        ctx.dims, ctx.keepdim = dims, keepdim
        arr = kernel("logsumexp", x.device.type)(compute_array(x, x.dtype), dims, keepdim)
        out = wrap(arr, x.dtype, x.device)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, g):
        """The gradient of logsumexp is softmax: exp(x - logsumexp(x))."""
        x, out = ctx.saved_tensors
        shape = tuple(x.shape)
        softmax = exp(sub(x, _keep(out, shape, ctx.dims, ctx.keepdim)))
        return mul(softmax, _keep(g, shape, ctx.dims, ctx.keepdim)), None, None


@tensor_method()
def logsumexp(input, dim, keepdim=False):
    """log(sum(exp(x))) over ``dim``, computed as m + log(sum(exp(x - m))) with
    m the max, so large inputs do not overflow.  Integer inputs give floats."""
    check_tensor(input, "input", "logsumexp")
    dims = _dims(input, dim, "logsumexp")
    if not input.dtype.is_floating_point:
        input = input.to(_dt.get_default_dtype())
    return LogSumExp.apply(input, dims, keepdim)


# ------------------------------------------------------------------ cumsum
class _Scan(Function):
    """cumsum along one dim (``reverse``: suffix sums).  The backward of a prefix
    sum is the suffix sum of the gradient, and vice versa."""
    reverse = False

    @classmethod
    def forward(cls, ctx, x, d, out_dtype):
        ctx.d, ctx.in_dtype = d, x.dtype
        x3, _ = _as_3d(compute_array(x, x.dtype), (d,) if x.ndim else ())
        arr = kernel("cumsum", x.device.type)(x3, out_dtype.compute, cls.reverse)
        return wrap(arr.reshape(x._data.shape), out_dtype, x.device)

    @classmethod
    def backward(cls, ctx, g):
        back = CumSum if cls.reverse else ReverseCumSum
        g = back.apply(g, ctx.d, g.dtype)
        return (g if g.dtype is ctx.in_dtype else g.to(ctx.in_dtype)), None, None


class CumSum(_Scan):
    reverse = False


class ReverseCumSum(_Scan):
    reverse = True


@tensor_method()
def cumsum(input, dim, *, dtype=None):
    """Running sums along ``dim``; bool/int inputs give int64 (float64 accumulator
    for floats, as PyTorch's CPU kernel)."""
    d = _one_dim(input, dim, "cumsum")
    if dtype is not None:
        input = input.to(_dt.as_dtype(dtype))
    out_dtype = _dt.int64 if input.dtype.category < 2 else input.dtype
    return CumSum.apply(input, d, out_dtype)


# ------------------------------------------------------------------ all, any
def _logical(input, dim, keepdim, op):
    dims = _dims(input, dim, op, empty_is_all=False)
    arr = kernel(op, input.device.type)(compute_array(input, input.dtype), dims, keepdim)
    return wrap(arr, _dt.bool, input.device)


@tensor_method()
def all(input, dim=None, keepdim=False):  # noqa: A001
    """True where every element over ``dim`` is non-zero (not differentiable)."""
    return _logical(input, dim, keepdim, "all")


@tensor_method()
def any(input, dim=None, keepdim=False):  # noqa: A001
    """True where some element over ``dim`` is non-zero (not differentiable)."""
    return _logical(input, dim, keepdim, "any")
