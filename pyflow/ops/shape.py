"""View and copy ops: each view shares storage (and version counter) with its input.

Backward of a view maps the gradient back to the input's shape: reshape for
``view``, the inverse permutation for ``permute``, a sum for ``expand``, and a
zero-filled scatter for slices (``SliceView``), whose own backward is the
slice again, so double backward works.
"""
import functools

import numpy as np

from .. import dtypes as _dt
from ..autograd import GRAD_MODE, Context, Function, record_unary
from ..tensor import Size, Tensor, _pointer, host_tensor
from ._method import tensor_method
from ._util import (array_module, check_tensor, kernel, local, normalize_dims, shape_arg,
                    unbroadcast)
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


def _clone(x):
    """``Clone.apply(x)``, run directly for a local ``x`` (and recorded as apply
    records it)."""
    if not local(x):
        return Clone.apply(x)
    out = host_tensor(np.array(x._data, copy=True, order="C"), x.dtype, x.device)
    if x.requires_grad and GRAD_MODE.enabled:
        record_unary(Clone, Context(), x, out)
    return out


@tensor_method()
@_tensor_op
def clone(input, memory_format=None):
    return _clone(input)


@tensor_method()
@_tensor_op
def contiguous(input, memory_format=None):
    return input if input._data.flags.c_contiguous else _clone(input)


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


def _direct_shape(shape, numel):
    """The shape ``view``/``reshape`` ask for, for the fast paths: ``shape`` (the
    ``*shape`` arguments) as a tuple with its -1 inferred, when it is plain ints
    (or one tuple or Size of them) that fit ``numel`` elements; None for anything
    else, which the general path (``shape_arg``, ``_infer_shape``) explains (also
    no shape at all: ``x.reshape()`` of a 0-d tensor is PyTorch's TypeError)."""
    if not shape:
        return None
    if len(shape) == 1:
        n = shape[0]
        if type(n) is int:          # view(n), the flattening call
            return shape if n == numel else (numel,) if n == -1 else None
        if type(n) is not tuple and type(n) is not Size:
            return None
        shape = n
    known, infer = 1, None
    for i, n in enumerate(shape):
        if type(n) is not int:
            return None
        if n < 0:
            if n != -1 or infer is not None:
                return None
            infer = i
        else:
            known *= n
    if infer is None:
        return tuple(shape) if known == numel else None
    if known == 0 or numel % known:
        return None
    shape = list(shape)
    shape[infer] = numel // known
    return tuple(shape)


def _reshape_view(data, shape):
    """``np.reshape(data, shape, copy=False)`` on any device: a view, or ValueError
    when the layout needs a copy (CuPy's reshape has no ``copy=`` and copies
    silently, so a device copy is detected by its new address)."""
    if type(data) is np.ndarray:
        if data.flags.c_contiguous:     # always a view (and the method is 5x faster)
            return data.reshape(shape)
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


def _is_view(arr, data):
    """Whether ``arr``, ``data.reshape(...)``, views ``data``'s memory (NumPy's
    reshape copies when the strides allow no view).  A view's base is ``data``'s
    owner (NumPy collapses chains of views); a copy is new memory, which the
    last test, by address ranges, tells apart in any other case."""
    base = arr.base
    return base is data or base is not None and base is data.base \
        or np.may_share_memory(arr, data)


def _direct_view(x, shape, arr=None):
    """``View``'s forward run directly (``local(x)``, see _util) for a C-contiguous
    ``x`` and a valid ``shape`` (or ``arr``, ``x``'s data already viewed in
    ``shape``), recorded as ``View.apply`` records it."""
    data = x._data
    out = x._view_of(data.reshape(shape) if arr is None else arr)
    if x.requires_grad and GRAD_MODE.enabled:
        ctx = Context()
        ctx.in_shape = data.shape
        record_unary(View, ctx, x, out, 2)
    return out


def _view(x, shape):
    """``View.apply(x, shape)`` for a valid ``shape``, direct when it can be."""
    if local(x) and x._data.flags.c_contiguous:
        return _direct_view(x, shape)
    return View.apply(x, shape)


@tensor_method()
def view(input, *shape):
    if local(input):
        data = input._data
        s = _direct_shape(shape, data.size)
        if s is not None:
            if s == data.shape and not input.requires_grad:
                return input._view_of(data)
            if data.flags.c_contiguous:
                return _direct_view(input, s)
            arr = data.reshape(s)   # a strided input (q of a split qkv) may still view
            if _is_view(arr, data):
                return _direct_view(input, s, arr)
            # (a copy: the general path raises view's own error)
    elif not isinstance(input, Tensor):
        check_tensor(input, "input", "view")
    if len(shape) == 1 and type(shape[0]) is _dt.dtype:
        raise TypeError("view(dtype) reinterpretation is not supported; use .to(dtype)")
    _no_size("view", shape)
    if input._placement is not None:        # global: logical shapes, the dispatch localizes
        return View.apply(input, _infer_shape(shape_arg(shape, "view"), input.numel(), "view"))
    shape = _infer_shape(shape_arg(shape, "view"), input._data.size, "view")
    if shape == input._data.shape:
        return _whole_view(input)
    return View.apply(input, shape)


def _whole_view(x):
    """A view of all of ``x`` as it is (``view`` to its own shape, ``t()`` of a
    vector, ``transpose`` of a 0-d tensor): a recorded ``View`` when ``x`` requires
    grad, so the gradient passes through it."""
    if x.requires_grad:
        return View.apply(x, tuple(x.shape))
    return x._view_of(x._data)


@tensor_method()
def reshape(input, *shape):
    if local(input):
        data = input._data
        s = _direct_shape(shape, data.size)
        if s is not None:
            if data.flags.c_contiguous:
                return _direct_view(input, s)
            arr = data.reshape(s)
            if _is_view(arr, data):
                return _direct_view(input, s, arr)
            if not (input.requires_grad and GRAD_MODE.enabled):
                # a copy that nothing records (a view's backward of a strided
                # gradient): the general path's Clone + View, as one new array
                return host_tensor(arr, input.dtype, input.device)
    elif not isinstance(input, Tensor):
        check_tensor(input, "input", "reshape")
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
        dims = ctx.dims
        inverse = [0] * len(dims)
        for i, d in enumerate(dims):
            inverse[d] = i
        inverse = tuple(inverse)
        if not GRAD_MODE.enabled and local(g):      # nothing records: the forward, direct
            return g._view_of(g._data.transpose(inverse)), None
        return permute(g, inverse), None


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
    if not local(input):
        return Permute.apply(input, wrapped)
    out = input._view_of(input._data.transpose(wrapped))       # Permute's forward, direct
    if input.requires_grad and GRAD_MODE.enabled:
        ctx = Context()
        ctx.dims = wrapped
        record_unary(Permute, ctx, input, out, 2)
    return out


def _direct_transpose(x, d0, d1):
    """``Permute``'s forward for swapping dims ``d0`` and ``d1`` (in range) of a
    tensor of at least one dim, run directly (``local(x)``) and recorded as
    ``Permute.apply`` records it."""
    data = x._data
    out = x._view_of(data.swapaxes(d0, d1))
    if x.requires_grad and GRAD_MODE.enabled:
        dims = list(range(data.ndim))
        d0, d1 = d0 % data.ndim, d1 % data.ndim
        dims[d0], dims[d1] = dims[d1], dims[d0]
        ctx = Context()
        ctx.dims = dims = tuple(dims)
        record_unary(Permute, ctx, x, out, 2)
    return out


@tensor_method("transpose", "swapaxes")
def transpose(input, dim0, dim1):
    if local(input) and type(dim0) is int and type(dim1) is int:
        n = input._data.ndim
        if -n <= dim0 < n and -n <= dim1 < n:       # (a 0-d tensor: the general path)
            return _direct_transpose(input, dim0, dim1)
    elif not isinstance(input, Tensor):
        check_tensor(input, "input", "transpose")
    n = input.ndim
    d0, d1 = input._wrap_dim(dim0), input._wrap_dim(dim1)   # a 0-d tensor takes -1 and 0
    if n == 0:
        return _whole_view(input)
    dims = list(range(n))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return Permute.apply(input, tuple(dims))


swapaxes = transpose


@tensor_method()
def t(input):
    if local(input):
        n = input._data.ndim
        if n == 2:
            return _direct_transpose(input, 0, 1)
        if n < 2 and not input.requires_grad:
            return input._view_of(input._data)
    elif not isinstance(input, Tensor):
        check_tensor(input, "input", "t")
    if input.ndim > 2:
        raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {input.ndim}D")
    return transpose(input, 0, 1) if input.ndim == 2 else _whole_view(input)


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
        return _whole_view(input)
    order = [d for d in range(input.ndim) if d not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return permute(input, tuple(order))


def _broadcast_view(data, shape):
    """``np.broadcast_to(data, shape)``: a read-only view with stride 0 along the
    broadcast dims.  NumPy's function is Python code (6 us for a small array, the
    most of a reduction's backward); for a C-contiguous host array the view is
    built in one constructor call.  ``shape`` is valid for ``data`` (expand checked)."""
    if type(data) is not np.ndarray or not data.flags.c_contiguous or not data.size:
        return np.broadcast_to(data, shape)
    lead = len(shape) - data.ndim
    strides = [0] * lead
    for n, size, stride in zip(data.shape, shape[lead:], data.strides):
        strides.append(stride if n == size else 0)
    view = np.ndarray(shape, data.dtype, data, 0, tuple(strides))
    view.flags.writeable = False
    return view


class Expand(Function):
    sbp_rule = expand_rule
    @staticmethod
    def forward(ctx, x, shape):
        ctx.in_shape = x._data.shape
        return x._view_of(_broadcast_view(x._data, shape))

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
    out = tuple(out)
    if not local(input):
        return Expand.apply(input, out)
    view = input._view_of(_broadcast_view(input._data, out))    # Expand's forward, direct
    if input.requires_grad and GRAD_MODE.enabled:
        ctx = Context()
        ctx.in_shape = input._data.shape
        record_unary(Expand, ctx, input, view, 2)
    return view


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
    return _view(input, shape[:d] + (1,) + shape[d:])


@tensor_method()
@_tensor_op
def squeeze(input, dim=None):
    shape = input.shape
    if dim is None:
        new = tuple(s for s in shape if s != 1)
    else:
        dims = normalize_dims(dim, input.ndim, "squeeze")
        new = tuple(s for i, s in enumerate(shape) if not (i in dims and s == 1))
    return _view(input, new)


# ------------------------------------------------------------------ slices
def _slice_key(key):
    return tuple(k if not isinstance(k, slice) else (k.start, k.stop, k.step) for k in key)


def basic_view(arr, key):
    """``arr[key]`` for a basic key, always an ndarray view: NumPy returns a scalar
    *copy* for a key of all ints, unless the key holds an Ellipsis."""
    for k in key:
        if k is Ellipsis:
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
    """``input[key]`` for a basic key (a tuple of ints, slices, None, Ellipsis)."""
    if not local(input):
        return SliceView.apply(input, key)
    data = input._data                      # SliceView's forward, run directly
    out = input._view_of(basic_view(data, key))
    if input.requires_grad and GRAD_MODE.enabled:
        ctx = Context()
        ctx.in_shape, ctx.key, ctx.dtype = data.shape, key, input.dtype
        record_unary(SliceView, ctx, input, out, 2)
    return out


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
    return slice_view(input, key)


@tensor_method()
@_tensor_op
def select(input, dim, index):
    _at_least_1d(input, "select", IndexError)
    d = input._wrap_dim(dim)
    size = input.shape[d]
    if not -size <= index < size:
        raise IndexError(f"select(): index {index} out of range for dimension {dim} of size {size}")
    return slice_view(input, (slice(None),) * d + (int(index) % size,))
