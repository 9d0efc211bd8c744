"""View and copy ops: each view shares storage (and version counter) with its input.

Backward of a view maps the gradient back to the input's shape: reshape for
``view``, the inverse permutation for ``permute``, a sum for ``expand``, and a
zero-filled scatter for slices (``SliceView``), whose own backward is the
slice again, so double backward works.
"""
import functools

import numpy as np

from .. import dtypes as _dt
from ..autograd import Function
from ..tensor import Tensor, _pointer
from ._method import tensor_method
from ._util import array_module, check_tensor, kernel, normalize_dims, shape_arg, unbroadcast
from ..distributed.signatures import (expand_rule, permute_rule, slice_rule, unary_linear_rule,
                                      view_rule)

__all__ = ["cast", "clone", "contiguous", "view", "reshape", "transpose", "swapaxes", "permute",
           "t", "expand", "expand_as", "unsqueeze", "squeeze", "flatten", "unflatten",
           "narrow", "select", "movedim", "view_as", "reshape_as",
           "broadcast_to", "slice_view", "detach"]


def _tensor_op(fn):
    """``fn(input, ...)`` that checks ``input`` is a Tensor first, as PyTorch's
    argument parser does: ``pyflow.flatten(None)`` is a TypeError naming the op,
    not an AttributeError from inside it."""
    name = fn.__name__

    @functools.wraps(fn)
    def op(input, *args, **kwargs):
        if not isinstance(input, Tensor):
            check_tensor(input, "input", name)
        return fn(input, *args, **kwargs)
    return op


def _no_size(op, shape, what="shape"):
    """``x.view()``/``x.permute()``: PyTorch's TypeError for the missing argument
    (``x.view(())`` is the 0-d shape and fine)."""
    if not shape:
        raise TypeError(f"{op}() missing 1 required positional argument: '{what}'")


def _at_least_1d(input, op, error=RuntimeError):
    if input.ndim == 0:
        raise error(f"{op}() cannot be applied to a 0-dim tensor")


# ------------------------------------------------------------------ copies
class Cast(Function):
    sbp_rule = unary_linear_rule
    @staticmethod
    def forward(ctx, x, dtype):
        ctx.src = x.dtype
        return Tensor._make(kernel("cast", x.device.type)(x._data, x.dtype, dtype), dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        return (g.to(ctx.src) if ctx.src.is_floating_point else None), None


def cast(x, dtype):
    return Cast.apply(x, dtype)


class Clone(Function):
    sbp_rule = unary_linear_rule
    @staticmethod
    def forward(ctx, x):
        data = x._data
        return Tensor._make(array_module(data).array(data, copy=True, order="C"), x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        return g


@tensor_method()
@_tensor_op
def clone(input, memory_format=None):
    return Clone.apply(input)


@tensor_method()
@_tensor_op
def contiguous(input, memory_format=None):
    return input if input._data.flags.c_contiguous else Clone.apply(input)


def detach(input):
    return input.detach()


# ------------------------------------------------------------------ reshaping views
def _infer_shape(shape, numel, op):
    shape = list(shape)
    neg = [i for i, s in enumerate(shape) if s == -1]
    if len(neg) > 1:
        raise RuntimeError(f"{op}(): only one dimension can be inferred (-1) in {tuple(shape)}")
    if any(s < -1 for s in shape):
        raise RuntimeError(f"{op}(): invalid shape dimension in {tuple(shape)}")
    known = 1
    for s in shape:
        if s != -1:
            known *= s
    if neg:
        if known == 0 or numel % known:
            raise RuntimeError(f"{op}(): shape '{list(shape)}' is invalid for input of size {numel}")
        shape[neg[0]] = numel // known
    elif known != numel:
        raise RuntimeError(f"{op}(): shape '{list(shape)}' is invalid for input of size {numel}")
    return tuple(shape)


def _reshape_view(data, shape):
    """``np.reshape(data, shape, copy=False)`` on any device: a view, or ValueError
    when the layout needs a copy (CuPy's reshape has no ``copy=`` and copies
    silently, so a device copy is detected by its new address)."""
    if type(data) is np.ndarray:
        return np.reshape(data, shape, copy=False)
    arr = data.reshape(shape)
    if data.size and _pointer(arr) != _pointer(data):
        raise ValueError("reshape needs a copy")
    return arr


class View(Function):
    sbp_rule = view_rule
    @staticmethod
    def forward(ctx, x, shape):
        ctx.in_shape = x._data.shape
        try:
            arr = _reshape_view(x._data, shape)
        except ValueError:
            raise RuntimeError(
                f"view size is not compatible with input tensor's size and stride (shape "
                f"{tuple(x.shape)}, strides {x.stride()} to {shape}); at least one dimension "
                f"spans across two contiguous subspaces. Use .reshape(...) instead.") from None
        return x._view_of(arr)

    @staticmethod
    def backward(ctx, g):
        return reshape(g, ctx.in_shape), None


@tensor_method()
@_tensor_op
def view(input, *shape):
    if len(shape) == 1 and type(shape[0]) is _dt.dtype:
        raise TypeError("view(dtype) reinterpretation is not supported; use .to(dtype)")
    _no_size("view", shape)
    if input._placement is not None:        # global: logical shapes, the dispatch localizes
        return View.apply(input, _infer_shape(shape_arg(shape, "view"), input.numel(), "view"))
    shape = _infer_shape(shape_arg(shape, "view"), input._data.size, "view")
    if shape == input._data.shape:
        return View.apply(input, shape) if input.requires_grad else input._view_of(input._data)
    return View.apply(input, shape)


@tensor_method()
@_tensor_op
def reshape(input, *shape):
    _no_size("reshape", shape)
    shape = _infer_shape(shape_arg(shape, "reshape"), input.numel(), "reshape")
    try:        # (global: the piece rarely has the logical shape's size, so it is copied)
        _reshape_view(input._data, shape)
        return View.apply(input, shape)
    except ValueError:
        return View.apply(Clone.apply(input), shape)


@tensor_method()
@_tensor_op
def view_as(input, other):
    return view(input, tuple(other.shape))


@tensor_method()
@_tensor_op
def reshape_as(input, other):
    return reshape(input, tuple(other.shape))


@tensor_method()
@_tensor_op
def flatten(input, start_dim=0, end_dim=-1):
    s, e = input._wrap_dim(start_dim), input._wrap_dim(end_dim)   # 0-d: -1 and 0 only
    if input.ndim == 0:
        return reshape(input, (1,))
    if s > e:
        raise RuntimeError(f"flatten(): start_dim ({start_dim}) cannot come after end_dim ({end_dim})")
    shape = input.shape
    return reshape(input, shape[:s] + (int(np.prod(shape[s:e + 1])),) + shape[e + 1:])


@tensor_method()
@_tensor_op
def unflatten(input, dim, sizes):
    _at_least_1d(input, "unflatten")
    d = input._wrap_dim(dim)
    shape = input.shape
    sizes = _infer_shape(tuple(sizes), shape[d], "unflatten")
    return view(input, shape[:d] + sizes + shape[d + 1:])


class Permute(Function):
    sbp_rule = permute_rule
    @staticmethod
    def forward(ctx, x, dims):
        ctx.dims = dims
        return x._view_of(np.transpose(x._data, dims))

    @staticmethod
    def backward(ctx, g):
        return permute(g, tuple(np.argsort(ctx.dims))), None


@tensor_method()
@_tensor_op
def permute(input, *dims):
    _no_size("permute", dims, "dims")
    dims = shape_arg(dims, "permute")
    n = input.ndim
    if len(dims) != n:
        raise RuntimeError(f"permute(): number of dims {len(dims)} doesn't match the tensor's "
                           f"{n} dimensions")
    wrapped = tuple(input._wrap_dim(d) for d in dims)
    if len(set(wrapped)) != n:
        raise RuntimeError(f"permute(): repeated dim in {dims}")
    return Permute.apply(input, wrapped)


@tensor_method("transpose", "swapaxes")
@_tensor_op
def transpose(input, dim0, dim1):
    n = input.ndim
    d0, d1 = input._wrap_dim(dim0), input._wrap_dim(dim1)   # a 0-d tensor takes -1 and 0
    if n == 0:
        return input._view_of(input._data)
    dims = list(range(n))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return Permute.apply(input, tuple(dims))


swapaxes = transpose


@tensor_method()
@_tensor_op
def t(input):
    if input.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {input.ndim}D")
    return transpose(input, 0, 1) if input.ndim == 2 else input._view_of(input._data)


Tensor.T = property(lambda self: permute(self, tuple(range(self.ndim - 1, -1, -1))))
Tensor.mT = property(lambda self: transpose(self, -2, -1))


@tensor_method()
@_tensor_op
def movedim(input, source, destination):
    src = (source,) if isinstance(source, int) else tuple(source)
    dst = (destination,) if isinstance(destination, int) else tuple(destination)
    src = [input._wrap_dim(d) for d in src]
    dst = [input._wrap_dim(d) for d in dst]
    if input.ndim == 0:     # dims 0 and -1 name the one place there is
        return input._view_of(input._data)
    order = [d for d in range(input.ndim) if d not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return permute(input, tuple(order))


class Expand(Function):
    sbp_rule = expand_rule
    @staticmethod
    def forward(ctx, x, shape):
        ctx.in_shape = x._data.shape
        return x._view_of(np.broadcast_to(x._data, shape))

    @staticmethod
    def backward(ctx, g):
        return unbroadcast(g, ctx.in_shape), None


@tensor_method()
@_tensor_op
def expand(input, *sizes):
    _no_size("expand", sizes, "size")
    sizes = shape_arg(sizes, "expand")
    shape = input.shape
    if len(sizes) < len(shape):
        raise RuntimeError(f"expand(): the number of sizes provided ({len(sizes)}) must be "
                           f"greater or equal to the number of dimensions ({len(shape)})")
    lead = len(sizes) - len(shape)
    out = []
    for i, s in enumerate(sizes):
        cur = shape[i - lead] if i >= lead else None
        if s == -1:
            if cur is None:
                raise RuntimeError("expand(): -1 is not allowed in a leading, new dimension")
            s = cur
        if cur is not None and cur != 1 and cur != s:
            raise RuntimeError(f"expand(): the expanded size {s} must match the existing size "
                               f"{cur} at non-singleton dimension {i}; target sizes {sizes}, "
                               f"tensor shape {tuple(shape)}")
        out.append(s)
    return Expand.apply(input, tuple(out))


@tensor_method()
@_tensor_op
def expand_as(input, other):
    return expand(input, tuple(other.shape))


def broadcast_to(input, shape):
    return expand(input, tuple(shape))


@tensor_method()
@_tensor_op
def unsqueeze(input, dim):
    d = input._wrap_dim(dim, input.ndim + 1)
    shape = input.shape
    return View.apply(input, shape[:d] + (1,) + shape[d:])


@tensor_method()
@_tensor_op
def squeeze(input, dim=None):
    shape = input.shape
    if dim is None:
        new = tuple(s for s in shape if s != 1)
    else:
        dims = normalize_dims(dim, input.ndim, "squeeze")
        new = tuple(s for i, s in enumerate(shape) if not (i in dims and s == 1))
    return View.apply(input, new)


# ------------------------------------------------------------------ slices
def _slice_key(key):
    return tuple(k if not isinstance(k, slice) else (k.start, k.stop, k.step) for k in key)


def basic_view(arr, key):
    """``arr[key]`` for a basic key, always an ndarray view: NumPy returns a scalar
    *copy* for a key of all ints, unless the key holds an Ellipsis."""
    if any(k is Ellipsis for k in key):
        return arr[key]
    return arr[key + (Ellipsis,)]


class SliceView(Function):
    """``x[key]`` for a basic key (ints, slices, None, Ellipsis): a view."""
    sbp_rule = slice_rule

    @staticmethod
    def forward(ctx, x, key):
        ctx.in_shape, ctx.key, ctx.dtype = x._data.shape, key, x.dtype
        return x._view_of(basic_view(x._data, key))

    @staticmethod
    def backward(ctx, g):
        return SliceScatter.apply(g, ctx.in_shape, ctx.key), None


class SliceScatter(Function):
    """Zeros of ``shape`` with ``g`` written at ``key``: the backward of a slice."""

    @staticmethod
    def forward(ctx, g, shape, key):
        ctx.key = key
        out = array_module(g._data).zeros(shape, g._data.dtype)
        basic_view(out, key)[...] = g._data
        return Tensor._make(out, g.dtype, g.device)

    @staticmethod
    def backward(ctx, gg):
        return SliceView.apply(gg, ctx.key), None, None


def slice_view(input, key):
    return SliceView.apply(input, key)


@tensor_method()
@_tensor_op
def narrow(input, dim, start, length):
    _at_least_1d(input, "narrow")
    d = input._wrap_dim(dim)
    size = input.shape[d]
    if isinstance(start, Tensor):
        start = int(start.item())
    if start < 0:
        start += size
    if not (0 <= start <= size) or length < 0 or start + length > size:
        raise IndexError(f"narrow(): start ({start}) + length ({length}) exceeds dimension "
                         f"{dim} of size {size}")
    key = (slice(None),) * d + (slice(start, start + length),)
    return SliceView.apply(input, key)


@tensor_method()
@_tensor_op
def select(input, dim, index):
    _at_least_1d(input, "select", IndexError)
    d = input._wrap_dim(dim)
    size = input.shape[d]
    if not -size <= index < size:
        raise IndexError(f"select(): index {index} out of range for dimension {dim} of size {size}")
    return SliceView.apply(input, (slice(None),) * d + (int(index) % size,))
