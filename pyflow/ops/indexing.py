"""Indexing syntax: ``t[key]``, ``t[key] = value``, ``index_put``, ``masked_select``.

A key is parsed once into two phases, which is exactly PyTorch's rule:

1. *basic*: ints, slices, None and Ellipsis make a view (``shape.SliceView``);
   every advanced entry is replaced by a full slice there;
2. *advanced*: integer index arrays (bool masks become their ``nonzero``
   columns) gather from that view with NumPy's placement rule: the broadcast
   index dims replace the indexed dims in place when those are adjacent, and
   go first otherwise.

Because ints are applied in phase 1, ``x[0, :, [1, 2]]`` has shape ``(n, 2)``
as in PyTorch (NumPy would give ``(2, n)``).  Basic keys return views sharing
storage and version counter; advanced keys return copies whose backward
scatter-adds, so duplicate indices accumulate their gradients.

Lists used as keys are index tensors (``x[[0, 2]]``), also nested lists (the
meaning PyTorch announced for its deprecated nested-list-as-tuple case).
"""
import math
import numbers
import operator

import numpy as np

from .. import dtypes as _dt
from ..autograd import Function, is_grad_enabled
from ..tensor import Tensor
from ._method import tensor_method
from ._util import (array_module, broadcast_shapes, check_allocation, check_scalar_fits,
                    check_tensor, compute_array, has_global, kernel, stored_elements, unbroadcast,
                    whole_globals, wrap)
from .creation import full, tensor
from .index import IndexKeyTypeError
from .inplace import _inplace
from .shape import SliceView, basic_view, expand, slice_view

__all__ = ["masked_select", "index_put"]


# ------------------------------------------------------------------ masks
@tensor_method()
def masked_select(input, mask):
    """The elements of ``input`` where ``mask`` is True, as a 1-D tensor (both broadcast)."""
    check_tensor(input, "input", "masked_select")
    check_tensor(mask, "mask", "masked_select")
    if mask.dtype is not _dt.bool:
        raise RuntimeError(f"masked_select(): expected a bool mask, got {mask.dtype}")
    shape = broadcast_shapes(tuple(input.shape), tuple(mask.shape), op="masked_select")
    x = input if tuple(input.shape) == shape else expand(input, shape)
    xp = array_module(mask._data)
    m = xp.broadcast_to(mask._data, shape)
    key = _Key(None, tuple(xp.nonzero(m))) if shape else _Key((None,), (m.reshape(1).nonzero()[0],))
    return _take(x, key)


# ------------------------------------------------------------------ key parsing
class _Key:
    """A parsed key: ``basic`` (tuple for a view, or None when it is the whole
    tensor) then ``adv`` (tuple of full slices / int64 arrays over the view's
    dims, or None when the key is basic only)."""
    __slots__ = ("basic", "adv")

    def __init__(self, basic, adv):
        self.basic, self.adv = basic, adv


def _index_array(obj, what="index"):
    """An int64 or bool NumPy array from a Tensor / ndarray / (nested) list, else None."""
    if isinstance(obj, Tensor):
        arr, dt = obj._data, obj.dtype
        if dt.is_floating_point:
            raise IndexError(f"tensors used as indices must be long, int or bool tensors, "
                             f"got a tensor of dtype {dt}")
        return arr
    arr = np.asarray(obj)
    if arr.dtype.kind in "SU":       # ["a"]: what PyTorch cannot make a tensor of
        raise IndexKeyTypeError(f"{what}: strings are not valid indices (got {obj!r})")
    if arr.dtype == object:
        raise IndexError(f"{what}: could not convert {obj!r} to an index tensor")
    if arr.size == 0 and arr.dtype.kind == "f":  # x[[]] indexes nothing, like PyTorch
        return arr.astype(np.int64)
    if arr.dtype.kind not in "biu":
        raise IndexError(f"tensors used as indices must be long, int or bool tensors, "
                         f"got {arr.dtype} values in {obj!r}")
    return arr


def _slice(s):
    def bound(v, name):
        if v is None:
            return None
        try:
            return operator.index(v)
        except TypeError:
            raise TypeError(f"slice {name} must be an int or None, got {v!r}") from None
    start, stop, step = bound(s.start, "start"), bound(s.stop, "stop"), bound(s.step, "step")
    if step is not None and step <= 0:
        raise ValueError(f"step must be greater than zero (got slice step {step}; "
                         f"use flip() to reverse)")
    return slice(start, stop, step)


def _classify(k):
    """One key entry -> (kind, value) with kind in int/slice/none/ellipsis/array/mask/bool."""
    if k is None:
        return "none", None
    if k is Ellipsis:
        return "ellipsis", None
    if isinstance(k, (bool, np.bool_)):
        return "bool", bool(k)
    if isinstance(k, (int, np.integer)):
        return "int", int(k)
    if isinstance(k, slice):
        return "slice", _slice(k)
    if isinstance(k, (str, bytes)):
        raise IndexKeyTypeError(f"only integers, slices (`:`), ellipsis (`...`), None and long "
                                f"or bool tensors are valid indices (got {type(k).__name__})")
    if isinstance(k, (Tensor, np.ndarray, list, tuple)):
        arr = _index_array(k)
        if arr.dtype == np.bool_:
            return ("bool", bool(arr)) if arr.ndim == 0 else ("mask", arr.astype(bool, copy=False))
        if arr.ndim == 0 and isinstance(k, Tensor):   # x[tensor(1)] is x[1]: a view
            return "int", int(arr)
        return "array", arr.astype(np.int64, copy=False)
    raise IndexError(f"only integers, slices (`:`), ellipsis (`...`), None and long or bool "
                     f"tensors are valid indices (got {type(k).__name__})")


def _is_array(k):
    """An advanced-key entry that is an index array (host or device), not a slice."""
    return not isinstance(k, slice)


def _parse(shape, key, xp=np):
    """Parse ``key`` for a tensor of ``shape`` whose data lives in array module
    ``xp`` (numpy, or the device's): index arrays end up in ``xp``."""
    if not isinstance(key, tuple):
        key = (key,)
    entries = [_classify(k) for k in key]
    if sum(kind == "ellipsis" for kind, _ in entries) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(1 if kind in ("int", "slice", "array") else v.ndim if kind == "mask" else 0
                   for kind, v in entries)
    ndim = len(shape)
    if consumed > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim} "
                         f"(got {consumed} indexed dimensions)")
    basic, adv = [], {}
    src = out = 0            # current dim of the tensor / of the phase-1 view
    for kind, v in entries:
        if kind == "ellipsis":
            n = ndim - consumed
            basic += [slice(None)] * n
            src, out = src + n, out + n
        elif kind == "none":
            basic.append(None)
            out += 1
        elif kind == "bool":     # x[True] adds a dim of 1, x[False] one of 0
            basic.append(None)
            adv[out] = xp.zeros(1 if v else 0, np.int64)
            out += 1
        elif kind == "int":
            size = shape[src]
            if not -size <= v < size:
                raise IndexError(f"index {v} is out of bounds for dimension {src} with size {size}")
            basic.append(v % size)
            src += 1
        elif kind == "slice":
            basic.append(v)
            src, out = src + 1, out + 1
        elif kind == "array":
            size = shape[src]
            if xp is not np:
                v = xp.asarray(v)        # a host index (a list) moves to the device
            if v.size:       # (on a device: one copy of min and max to the host, like a device assert)
                stored = stored_elements(v)      # an expanded index: its stored elements
                lo, hi = int(stored.min()), int(stored.max())
                bad = hi if hi >= size else lo
                if hi >= size or lo < -size:
                    raise IndexError(f"index {bad} is out of bounds for dimension {src} "
                                     f"with size {size}")
                if lo < 0:      # wrapped on the stored elements, then expanded again
                    v = xp.broadcast_to(xp.where(stored < 0, stored + size, stored), v.shape)
            basic.append(slice(None))
            adv[out] = v
            src, out = src + 1, out + 1
        else:  # mask: k dims become k index arrays
            k = v.ndim
            if tuple(v.shape) != tuple(shape[src:src + k]):
                for j in range(k):
                    if v.shape[j] != shape[src + j]:
                        raise IndexError(
                            f"The shape of the mask {list(v.shape)} at index {j} does not match "
                            f"the shape of the indexed tensor {list(shape)} at index {src + j}")
            for col in xp.nonzero(xp.asarray(v) if xp is not np else v):
                basic.append(slice(None))
                adv[out] = col.astype(np.int64, copy=False)
                out += 1
            src += k
    if adv:
        arrays = list(adv.values())
        try:
            arrays = xp.broadcast_arrays(*arrays)
        except ValueError:
            raise IndexError("shape mismatch: indexing tensors could not be broadcast together "
                             "with shapes " + ", ".join(str(list(a.shape)) for a in arrays)
                             ) from None
        adv = dict(zip(adv, arrays))
        adv_key = tuple(adv.get(d, slice(None)) for d in range(max(adv) + 1))
    else:
        adv_key = None
    trivial = all(isinstance(b, slice) and b == slice(None) for b in basic)
    return _Key(None if trivial else tuple(basic), adv_key)


def _result_shape(view_shape, adv):
    """Shape of ``view[adv]`` without computing it."""
    dims = [d for d, k in enumerate(adv) if _is_array(k)]
    b = adv[dims[0]].shape
    rest = [s for d, s in enumerate(view_shape) if d not in dims]
    if dims == list(range(dims[0], dims[-1] + 1)):
        return tuple(view_shape[:dims[0]]) + b + tuple(view_shape[dims[-1] + 1:])
    return b + tuple(rest)


def _accumulate_put(dst, adv, vals, device="cpu"):
    """dst[adv] += vals with duplicate indices accumulating (dst modified in place;
    all arrays on ``device``)."""
    xp = array_module(dst)
    dims = [d for d, k in enumerate(adv) if _is_array(k)]
    shape = dst.shape
    sizes = tuple(shape[d] for d in dims)
    rows = xp.ravel_multi_index(tuple(adv[d] for d in dims), sizes).reshape(-1)
    vals = xp.broadcast_to(vals, _result_shape(shape, adv))
    n_b = rows.size
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    if adjacent and dst.flags.c_contiguous:
        outer = int(np.prod(shape[:dims[0]], dtype=np.int64))
        inner = int(np.prod(shape[dims[-1] + 1:], dtype=np.int64))
        dst3 = dst.reshape(outer, int(np.prod(sizes, dtype=np.int64)), inner)
        src3 = xp.ascontiguousarray(vals).reshape(outer, n_b, inner)
        kernel("index_add", device)(dst3, rows, src3)
        return dst
    # General case: move the indexed dims first in a contiguous copy, add, copy back.
    rest = [d for d in range(len(shape)) if d not in dims]
    perm = dims + rest
    tmp = xp.ascontiguousarray(xp.transpose(dst, perm))
    if adjacent:  # the broadcast index dims sit at dims[0] in vals: move them first
        nb = len(adv[dims[0]].shape)
        vals = xp.moveaxis(vals, list(range(dims[0], dims[0] + nb)), list(range(nb)))
    inner = int(np.prod([shape[d] for d in rest], dtype=np.int64))
    kernel("index_add", device)(tmp.reshape(1, -1, inner), rows,
                                xp.ascontiguousarray(vals).reshape(1, n_b, inner))
    dst[...] = xp.transpose(tmp, tuple(int(p) for p in np.argsort(perm)))
    return dst


# ------------------------------------------------------------------ differentiable pieces
class Index(Function):
    """``x[adv]`` for an advanced key over all of ``x``: a copy."""

    @staticmethod
    def forward(ctx, x, adv):
        ctx.shape, ctx.adv, ctx.dtype = x._data.shape, adv, x.dtype
        shape = _result_shape(x._data.shape, adv)      # an expanded index may ask for 10**12
        check_allocation(math.prod(shape) * x.dtype.itemsize,
                         f"the result of shape {list(shape)} ({x.dtype})", "index")
        return Tensor._make(kernel("index", x.device.type)(x._data, adv), x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        return IndexAccumulate.apply(g, ctx.shape, ctx.adv), None


class IndexAccumulate(Function):
    """Zeros of ``shape`` with ``g`` scatter-added at ``adv``: Index's backward."""

    @staticmethod
    def forward(ctx, g, shape, adv):
        ctx.adv = adv
        out = array_module(g._data).zeros(shape, g.dtype.compute)
        _accumulate_put(out, adv, compute_array(g, g.dtype), g.device.type)
        return wrap(out, g.dtype, g.device)

    @staticmethod
    def backward(ctx, gg):
        return Index.apply(gg, ctx.adv), None, None


def _take(t, key):
    """``t[key]`` for a parsed key, recorded for autograd."""
    if key.basic is not None:
        t = SliceView.apply(t, key.basic)
    if key.adv is not None:
        t = Index.apply(t, key.adv)
    return t


def _put_array(dst, key, vals, accumulate, device="cpu"):
    """Write ``vals`` (an array in dst's dtype) into the array ``dst`` (on ``device``) at ``key``."""
    target = basic_view(dst, key.basic) if key.basic is not None else dst
    try:
        if key.adv is None:
            if accumulate:
                target += vals
            else:
                target[...] = vals
        elif accumulate:
            _accumulate_put(target, key.adv, vals, device)
        else:
            target[key.adv] = vals
    except ValueError as e:
        if not dst.flags.writeable or "read-only" in str(e):
            raise RuntimeError(
                "unsupported operation: more than one element of the written-to tensor refers "
                "to a single memory location (an expanded tensor); clone() it before writing"
            ) from None
        res = target.shape if key.adv is None else _result_shape(target.shape, key.adv)
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(np.shape(vals))} cannot "
                           f"be broadcast to indexing result of shape {list(res)}") from None


class IndexPut(Function):
    """Out-of-place ``x[key] = values`` (or ``+=`` with ``accumulate``)."""

    @staticmethod
    def forward(ctx, x, values, key, accumulate):
        ctx.key, ctx.accumulate = key, accumulate
        ctx.v_shape, ctx.v_dtype = tuple(values.shape), values.dtype
        data = x._compute()
        out = array_module(data).array(data, copy=True, order="C")
        _put_array(out, key, compute_array(values, x.dtype), accumulate, x.device.type)
        return wrap(out, x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        gx = gv = None
        if ctx.needs_input_grad[0]:
            gx = g if ctx.accumulate else IndexPut.apply(
                g, Tensor._make(array_module(g._data).zeros((), g.dtype.storage), g.dtype, g.device),
                ctx.key, False)
        if ctx.needs_input_grad[1]:
            gv = unbroadcast(_take(g, ctx.key), ctx.v_shape)
            gv = gv if gv.dtype is ctx.v_dtype else gv.to(ctx.v_dtype)
        return gx, gv, None, None


def _as_value_tensor(value, like, op):
    if isinstance(value, Tensor):
        if value.device != like.device:
            raise RuntimeError(f"{op}: value is on {value.device}, the tensor on {like.device}")
        return value
    if isinstance(value, (numbers.Number, np.number, np.ndarray, list)):
        check_scalar_fits(value, like.dtype, op)      # t[i] = 2**40 / NaN in an int tensor
        return tensor(value, dtype=like.dtype, device=like.device)
    raise TypeError(f"{op}: value must be a Tensor or a number, not {type(value).__name__}")


# ------------------------------------------------------------------ t[key], t[key] = v
def _plain_key(shape, key):
    """``key`` as a tuple when it is only in-range ints and plain slices (the
    common case, a view with nothing to parse), else None."""
    ks = key if type(key) is tuple else (key,)
    if len(ks) > len(shape):
        return None
    for k, n in zip(ks, shape):
        if type(k) is int:
            if not -n <= k < n:
                return None
        elif type(k) is not slice or not (
                (k.start is None or type(k.start) is int) and (k.stop is None or type(k.stop) is int)
                and (k.step is None or type(k.step) is int and k.step > 0)):
            return None
    return ks


@tensor_method("__getitem__")
def getitem(self, key):
    plain = _plain_key(self._data.shape, key)
    if plain is not None:          # a view: on a global tensor, the view's own signatures
        return slice_view(self, plain)     # (its fast path: no Function when nothing records)
    return _advanced_getitem(self, key)


@whole_globals
def _advanced_getitem(self, key):
    return _take(self, _parse(self._data.shape, key, array_module(self._data)))


def _full_mask_fill(self, key, value):
    """``x[mask] = number`` with a mask of x's own shape (the common masking idiom):
    one masked copy instead of nonzero + scatter; True when it handled the write."""
    if not (isinstance(key, Tensor) and key.dtype is _dt.bool and
            key._data.shape == self._data.shape and isinstance(value, (int, float, bool)) and
            not (is_grad_enabled() and self.requires_grad)):
        return False
    fill = full((), value, dtype=self.dtype, device=self.device)._data
    try:
        np.copyto(self._data, fill, where=key._data)
    except ValueError:
        return False        # read-only (expanded) target: let the general path explain
    self._version[0] += 1
    return True


@tensor_method("__setitem__")
def setitem(self, key, value):
    if self._placement is not None or has_global(key) or (
            isinstance(value, Tensor) and value._placement is not None):
        # index_put on the whole tensors, the result written back in self's layout
        key = key if isinstance(key, tuple) else (key,)
        _inplace(self, lambda s, v: index_put(s, key, v),
                 _as_value_tensor(value, self, "__setitem__"))
        return
    if _full_mask_fill(self, key, value):
        return
    parsed = _parse(self._data.shape, key, array_module(self._data))
    value = _as_value_tensor(value, self, "__setitem__")
    if is_grad_enabled() and (self.requires_grad or value.requires_grad):
        _inplace(self, lambda s, v: IndexPut.apply(s, v, parsed, False), value)
        return
    vals = value._data if value.dtype is self.dtype else \
        kernel("cast", value.device.type)(value._data, value.dtype, self.dtype)
    _put_array(self._data, parsed, vals, False, self.device.type)
    self._version[0] += 1


@whole_globals
def index_put(input, indices, values, accumulate=False):
    """``out = input.clone(); out[indices] = values`` (``+=`` with accumulate=True)."""
    check_tensor(input, "input", "index_put")
    if not isinstance(indices, (tuple, list)):
        raise TypeError(f"index_put(): indices must be a tuple of Tensors, got "
                        f"{type(indices).__name__}")
    key = _parse(input._data.shape, tuple(indices), array_module(input._data))
    return IndexPut.apply(input, _as_value_tensor(values, input, "index_put"), key,
                          bool(accumulate))


Tensor.index_put = index_put


@tensor_method()
def index_put_(input, indices, values, accumulate=False):
    return _inplace(input, lambda s, v: index_put(s, indices, v, accumulate),
                    _as_value_tensor(values, input, "index_put_"))
