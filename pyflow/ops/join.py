"""Joining, splitting and layout ops: cat, stack, hstack, vstack, split, chunk,
unbind, tril, triu, one_hot, pad, repeat, tile, flip, roll.

Each is a copy (or, for split, views) whose backward is the inverse data
movement: cat -> slices of the gradient, split -> one cat of the gradients, repeat -> sum of the tiles, flip / roll -> flip / roll back,
constant pad -> crop (a pad with negated widths), reflect / replicate /
circular pad -> index_select along each padded dim (whose backward
scatter-adds, so the reflected border gets both contributions).
"""
import numpy as np

from .. import _hooks
from .. import dtypes as _dt
from ..autograd import Function
from ..tensor import Tensor
from ._method import tensor_method
from ._util import check_tensor, kernel, normalize_dims, shape_arg
from .creation import full, tensor, zeros
from .index import index_select
from .reduce import sum as sum_
from .shape import _at_least_1d, _tensor_op, basic_view, narrow, reshape, select, unsqueeze
from ..distributed.signatures import cat_rule, split_rule

__all__ = ["cat", "concat", "concatenate", "stack", "hstack", "vstack", "tril", "triu",
           "one_hot", "pad", "repeat", "tile", "flip", "roll", "split", "chunk", "unbind"]


def _as_dtype(t, dtype):
    return t if t.dtype is dtype else t.to(dtype)


def _storage_of(t, dtype):
    """``t``'s data in the storage of ``dtype`` (a cast only when the dtypes differ)."""
    if t.dtype is dtype:
        return t._data
    return kernel("cast", t.device.type)(t._data, t.dtype, dtype)


# ------------------------------------------------------------------ cat / stack
class Cat(Function):
    sbp_rule = cat_rule
    @staticmethod
    def forward(ctx, d, dtype, *tensors):
        ctx.d = d
        ctx.meta = [(None if _skipped(t, tensors) else t.shape[d], t.dtype) for t in tensors]
        kept = [_storage_of(t, dtype) for t in tensors if not _skipped(t, tensors)]
        out = kernel("cat", tensors[0].device.type)(kept, d)
        return Tensor._make(out, dtype, tensors[0].device)

    @staticmethod
    def backward(ctx, g):
        grads, start = [], 0
        for size, dtype in ctx.meta:
            if size is None:   # a skipped legacy empty tensor
                grads.append(zeros(0, dtype=dtype, device=g.device))
                continue
            grads.append(_as_dtype(narrow(g, ctx.d, start, size), dtype))
            start += size
        return (None, None) + tuple(grads)


def _skipped(t, tensors):
    """PyTorch still accepts (and skips) 1-D empty tensors in cat with N-d ones."""
    return t.ndim == 1 and t.shape[0] == 0 and any(u.ndim != 1 for u in tensors)


def _tensor_list(tensors, op):
    if isinstance(tensors, Tensor) or not isinstance(tensors, (list, tuple)):
        raise TypeError(f"{op}(): argument 'tensors' must be a tuple or list of Tensors, not "
                        f"{type(tensors).__name__}")
    if len(tensors) == 0:
        raise RuntimeError(f"{op}(): expected a non-empty list of Tensors")
    for i, t in enumerate(tensors):
        if not isinstance(t, Tensor):
            raise TypeError(f"{op}(): expected Tensor as element {i} in argument 'tensors', but "
                            f"got {type(t).__name__}")
        if t.device != tensors[0].device:
            raise RuntimeError(f"{op}(): expected all tensors to be on the same device, but "
                               f"tensor 0 is on {tensors[0].device} and tensor {i} on {t.device}")
    return list(tensors)


def cat(tensors, dim=0):
    """Concatenate along an existing dim; mixed dtypes promote (torch.cat)."""
    tensors = _tensor_list(tensors, "cat")
    real = [(i, t) for i, t in enumerate(tensors) if not _skipped(t, tensors)]
    i0, first = real[0]
    for i, t in real:       # before the dim, as PyTorch checks
        if t.ndim == 0:
            raise RuntimeError(f"cat(): zero-dimensional tensor (at position {i}) cannot be "
                               f"concatenated")
    d = first._wrap_dim(dim)
    for i, t in real[1:]:
        if t.ndim != first.ndim:
            raise RuntimeError(f"cat(): Tensors must have same number of dimensions: got "
                               f"{first.ndim} and {t.ndim} (tensor {i0} has shape "
                               f"{list(first.shape)}, tensor {i} has shape {list(t.shape)})")
        for j in range(first.ndim):
            if j != d and t.shape[j] != first.shape[j]:
                raise RuntimeError(f"cat(): Sizes of tensors must match except in dimension {d}. "
                                   f"Expected size {first.shape[j]} but got size {t.shape[j]} "
                                   f"for tensor number {i} in the list (shape "
                                   f"{list(t.shape)}, tensor {i0} has {list(first.shape)})")
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = _dt.promote_types(dtype, t.dtype)
    return Cat.apply(d, dtype, *tensors)


concat = concatenate = cat


def stack(tensors, dim=0):
    """Join along a new dim; all tensors must have the same shape."""
    tensors = _tensor_list(tensors, "stack")
    shape = tuple(tensors[0].shape)
    d = tensors[0]._wrap_dim(dim, len(shape) + 1)   # the dim first, as PyTorch checks
    for i, t in enumerate(tensors[1:], 1):
        if tuple(t.shape) != shape:
            raise RuntimeError(f"stack expects each tensor to be equal size, but got "
                               f"{list(shape)} at entry 0 and {list(t.shape)} at entry {i}")
    return cat([unsqueeze(t, d) for t in tensors], d)


def hstack(tensors):
    tensors = [reshape(t, (1,)) if t.ndim == 0 else t for t in _tensor_list(tensors, "hstack")]
    return cat(tensors, 0 if all(t.ndim == 1 for t in tensors) else 1)


def vstack(tensors):
    tensors = [reshape(t, (1, -1)) if t.ndim < 2 else t for t in _tensor_list(tensors, "vstack")]
    return cat(tensors, 0)


# ------------------------------------------------------------------ triangles
class _Triangle(Function):
    name = None

    @classmethod
    def forward(cls, ctx, x, k):
        ctx.k = k
        return Tensor._make(kernel(cls.name, x.device.type)(x._data, k), x.dtype, x.device)

    @classmethod
    def backward(cls, ctx, g):
        return cls.apply(g, ctx.k), None


class Tril(_Triangle):
    name = "tril"


class Triu(_Triangle):
    name = "triu"


def _triangle(cls, input, diagonal, op):
    check_tensor(input, "input", op)
    if input.ndim < 2:
        raise RuntimeError(f"{op}: input tensor must have at least 2 dimensions, got shape "
                           f"{tuple(input.shape)}")
    if not isinstance(diagonal, (int, np.integer)) or isinstance(diagonal, bool):
        raise TypeError(f"{op}(): argument 'diagonal' must be an int, got {diagonal!r}")
    return cls.apply(input, int(diagonal))


@tensor_method()
def tril(input, diagonal=0):
    """Lower triangle (elements with col - row <= diagonal); the rest zero."""
    return _triangle(Tril, input, diagonal, "tril")


@tensor_method()
def triu(input, diagonal=0):
    """Upper triangle (elements with col - row >= diagonal); the rest zero."""
    return _triangle(Triu, input, diagonal, "triu")


# ------------------------------------------------------------------ one_hot
def one_hot(tensor, num_classes=-1):
    """int64 tensor of shape ``tensor.shape + (num_classes,)`` (F.one_hot)."""
    if num_classes == -1:
        _hooks.refuse_data_dependent_shape("one_hot(num_classes=-1)")
    return _one_hot(tensor, num_classes)


@_hooks.recordable
def _one_hot(tensor, num_classes):
    check_tensor(tensor, "tensor", "one_hot")
    if tensor.dtype is not _dt.int64:
        raise RuntimeError(f"one_hot is only applicable to index tensor of dtype int64, got "
                           f"{tensor.dtype}")
    idx = tensor._data
    if idx.size == 0 and isinstance(num_classes, (int, np.integer)) and num_classes <= 0:
        # PyTorch: with no values a class count of 0 (or -1, infer) has no width either
        raise RuntimeError("one_hot: Can not infer total number of classes from empty tensor.")
    if num_classes == -1:
        num_classes = int(idx.max()) + 1
    if not isinstance(num_classes, (int, np.integer)) or num_classes < 0:
        raise RuntimeError(f"one_hot: num_classes must be -1 or a non-negative int, got "
                           f"{num_classes!r}")
    if idx.size:
        if int(idx.min()) < 0:
            raise RuntimeError(f"one_hot: Class values must be non-negative (got {int(idx.min())})")
        if int(idx.max()) >= num_classes:
            raise RuntimeError(f"one_hot: Class values must be smaller than num_classes "
                               f"({num_classes}), got {int(idx.max())}")
    out = kernel("one_hot", tensor.device.type)(idx, int(num_classes))
    return Tensor._make(out, _dt.int64, tensor.device)


# ------------------------------------------------------------------ pad
class PadConstant(Function):
    """Constant pad; negative widths crop.  Its backward is the opposite pad."""

    @staticmethod
    def forward(ctx, x, widths, value):
        ctx.widths = widths
        shape = x._data.shape
        out_shape, src, dst = [], [], []
        for n, (lo, hi) in zip(shape, widths):
            out_shape.append(n + lo + hi)
            src.append(slice(max(-lo, 0), n - max(-hi, 0)))
            dst.append(slice(max(lo, 0), max(lo, 0) + max(n - max(-lo, 0) - max(-hi, 0), 0)))
        fill = full((), value, dtype=x.dtype, device=x.device)._data
        out = kernel("pad_constant", x.device.type)(x._data, tuple(out_shape), tuple(src),
                                                    tuple(dst), fill)
        return Tensor._make(out, x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        return PadConstant.apply(g, tuple((-lo, -hi) for lo, hi in ctx.widths), 0), None, None


def _pad_index(n, lo, hi, mode):
    p = np.arange(-lo, n + hi)
    if mode == "reflect":
        p = np.abs(p)
        p = np.where(p >= n, 2 * (n - 1) - p, p)
    elif mode == "replicate":
        p = np.clip(p, 0, n - 1)
    else:  # circular
        p = p % n
    return p


def pad(input, pad, mode="constant", value=None):
    """F.pad: ``pad`` = (left, right) for the last dim, then the one before, ..."""
    check_tensor(input, "input", "pad")
    if not isinstance(pad, (tuple, list)) or not all(
            isinstance(p, (int, np.integer)) and not isinstance(p, bool) for p in pad):
        raise TypeError(f"pad(): argument 'pad' must be a tuple of ints, got {pad!r}")
    if len(pad) % 2:
        raise RuntimeError(f"pad(): Padding length must be divisible by 2, got {len(pad)}")
    if len(pad) // 2 > input.ndim:
        raise RuntimeError(f"pad(): Padding length should be less than or equal to two times the "
                           f"input dimension but got padding length {len(pad)} and input of "
                           f"dimension {input.ndim}")
    nd = input.ndim
    widths = [(0, 0)] * nd
    for i in range(len(pad) // 2):
        widths[nd - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    for d, (n, (lo, hi)) in enumerate(zip(input.shape, widths)):
        if n + lo + hi < 0:
            raise RuntimeError(f"pad(): the input size {n} at dimension {d}, plus negative "
                               f"padding {lo} and {hi}, resulted in a negative output size "
                               f"{n + lo + hi}")
    if mode == "constant":
        return PadConstant.apply(input, tuple(widths), 0 if value is None else value)
    if mode not in ("reflect", "replicate", "circular"):
        raise NotImplementedError(f"pad(): mode must be 'constant', 'reflect', 'replicate' or "
                                  f"'circular', got {mode!r}")
    if value not in (None, 0):
        raise RuntimeError(f"pad(): padding mode '{mode}' doesn't take in value argument")
    out = input
    for d, (lo, hi) in enumerate(widths):
        if lo == 0 and hi == 0:
            continue
        n = input.shape[d]
        if min(lo, hi) < 0:
            raise RuntimeError(f"pad(): negative padding is only supported in constant mode "
                               f"(got {lo}, {hi} at dimension {d})")
        if mode == "reflect" and (lo >= n or hi >= n):
            raise RuntimeError(f"pad(): Padding size should be less than the corresponding input "
                               f"dimension, but got: padding ({lo}, {hi}) at dimension {d} of "
                               f"input {list(input.shape)}")
        if n == 0:
            raise RuntimeError(f"pad(): mode '{mode}' needs a non-empty dimension {d}")
        if mode == "circular" and (lo > n or hi > n):
            raise RuntimeError(f"pad(): Padding value causes wrapping around more than once "
                               f"(padding ({lo}, {hi}) at dimension {d} of size {n})")
        out = index_select(out, d, tensor(_pad_index(n, lo, hi, mode), dtype=_dt.int64,
                                          device=input.device))
    return out


# ------------------------------------------------------------------ repeat / tile
class Repeat(Function):
    @staticmethod
    def forward(ctx, x, reps):
        ctx.in_shape, ctx.reps = x._data.shape, reps
        return Tensor._make(kernel("tile", x.device.type)(x._data, reps), x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        lead = len(ctx.reps) - len(ctx.in_shape)
        sizes = (1,) * lead + tuple(ctx.in_shape)
        split = []
        for r, s in zip(ctx.reps, sizes):
            split += [r, s]
        summed = sum_(reshape(g, tuple(split)), tuple(range(0, len(split), 2)))
        return reshape(summed, ctx.in_shape), None


@tensor_method()
def repeat(input, *sizes):
    """Tile ``input`` ``sizes[i]`` times along dim i (new leading dims allowed)."""
    reps = shape_arg(sizes, "repeat")
    if len(reps) < input.ndim:
        raise RuntimeError(f"repeat(): Number of dimensions of repeat dims ({len(reps)}) can not "
                           f"be smaller than number of dimensions of tensor ({input.ndim})")
    if any(r < 0 for r in reps):
        raise RuntimeError(f"repeat(): repeats can not be negative, got {reps}")
    return Repeat.apply(input, reps)


@tensor_method()
def tile(input, dims):
    reps = shape_arg((dims,), "tile") if not isinstance(dims, int) else (dims,)
    return repeat(input, (1,) * (input.ndim - len(reps)) + tuple(reps))


# ------------------------------------------------------------------ flip / roll
class Flip(Function):
    @staticmethod
    def forward(ctx, x, dims):
        ctx.dims = dims
        return Tensor._make(kernel("flip", x.device.type)(x._data, dims), x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        return Flip.apply(g, ctx.dims), None


@tensor_method()
def flip(input, *dims):
    """A copy with the order of elements reversed along ``dims``."""
    check_tensor(input, "input", "flip")
    dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    if input.ndim == 0:
        dims = ()
    return Flip.apply(input, normalize_dims(tuple(dims), input.ndim, "flip"))


class Roll(Function):
    @staticmethod
    def forward(ctx, x, shifts, dims):
        ctx.shifts, ctx.dims = shifts, dims
        return Tensor._make(kernel("roll", x.device.type)(x._data, shifts, dims), x.dtype,
                            x.device)

    @staticmethod
    def backward(ctx, g):
        return Roll.apply(g, tuple(-s for s in ctx.shifts), ctx.dims), None, None


@tensor_method()
def roll(input, shifts, dims=None):
    """Shift elements cyclically; with ``dims=None`` the tensor is rolled flat."""
    check_tensor(input, "input", "roll")
    shifts = (shifts,) if isinstance(shifts, (int, np.integer)) else tuple(shifts)
    if dims is None:
        if len(shifts) != 1:
            raise RuntimeError(f"roll(): with dims=None, shifts must be a single int, got "
                               f"{shifts}")
        return reshape(Roll.apply(reshape(input, (-1,)), shifts, (0,)), tuple(input.shape))
    dims = (dims,) if isinstance(dims, (int, np.integer)) else tuple(dims)
    if len(shifts) != len(dims):
        raise RuntimeError(f"roll(): shifts and dimensions must align. shifts: {len(shifts)}, "
                           f"dims: {len(dims)}")
    dims = tuple(input._wrap_dim(d) for d in dims)
    return Roll.apply(input, tuple(int(s) for s in shifts), dims)


# ------------------------------------------------------------------ split
@tensor_method()
@_tensor_op
def split(input, split_size_or_sections, dim=0):
    if input.ndim == 0:
        raise RuntimeError("split() expects at least a 1-dimensional tensor")
    if isinstance(split_size_or_sections, int) and split_size_or_sections < 0:
        raise RuntimeError(f"split(): split_size must be non-negative, got "
                           f"{split_size_or_sections}")
    d = input._wrap_dim(dim)
    size = input.shape[d]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        if step == 0 and size:
            raise RuntimeError(f"split(): split_size must be positive (or 0 for a dimension "
                               f"of size 0), got {step} for dimension {dim} of size {size}")
        sizes = [min(step, size - i) for i in range(0, size, step)] if step else []
        sizes = sizes or [0]
    else:
        sizes = list(split_size_or_sections)
        if any(s < 0 for s in sizes):
            raise RuntimeError(f"split(): split_sizes must be non-negative, got {sizes}")
        if sum(sizes) != size:
            raise RuntimeError(f"split(): split_sizes {sizes} must sum to the size of dimension "
                               f"{dim} ({size})")
    return Split.apply(input, d, tuple(sizes))


class Split(Function):
    """``split``/``chunk``: every piece of ``x`` along ``dim`` from one node, each
    a view of ``x``'s storage.  The backward concatenates the pieces' gradients
    once.  One slice node per piece made a zero-filled tensor of ``x``'s shape
    per piece and added them up: for attention's q/k/v split, three such
    tensors and two adds, where one concatenation does."""
    sbp_rule = split_rule

    @staticmethod
    def forward(ctx, x, dim, sizes):
        ctx.dim = dim
        lead = (slice(None),) * dim
        outs, start = [], 0
        for size in sizes:
            outs.append(x._view_of(basic_view(x._data, lead + (slice(start, start + size),))))
            start += size
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        return Cat.apply(ctx.dim, grads[0].dtype, *grads), None, None


@tensor_method()
@_tensor_op
def chunk(input, chunks, dim=0):
    if not isinstance(chunks, int) or chunks <= 0:
        raise RuntimeError(f"chunk(): chunks must be a positive int, got {chunks!r}")
    if input.ndim == 0:
        raise RuntimeError("chunk() expects at least a 1-dimensional tensor")
    size = input.shape[input._wrap_dim(dim)]
    if size == 0:   # PyTorch gives ``chunks`` empty pieces
        return split(input, [0] * chunks, dim)
    step = -(-size // chunks)
    return split(input, step, dim)


@tensor_method()
@_tensor_op
def unbind(input, dim=0):
    _at_least_1d(input, "unbind", IndexError)
    d = input._wrap_dim(dim)
    return tuple(select(input, d, i) for i in range(input.shape[d]))
