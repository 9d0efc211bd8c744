"""Index computations: gather / scatter, index_select / index_add, nonzero.

Each op takes its indices as an int64 tensor (checked against the indexed
dim's size, on the host) and has its backward beside it: gather's is a
scatter-add, index_select's an index_add.  The ``t[key]`` syntax that parses
keys into these is ``indexing.py``, one layer up.
"""
import numpy as np

from .. import _hooks
from .. import dtypes as _dt
from ..autograd import Function
from ..tensor import Tensor
from ._method import tensor_method
from ._util import (array_module, broadcast_shapes, check_tensor, compute_array, kernel,
                    stored_elements, whole_globals, wrap)
from .creation import full, zeros
from .inplace import _inplace
from .shape import SliceScatter, expand, reshape

__all__ = ["gather", "scatter", "scatter_add", "index_select", "index_add", "nonzero",
           "take_along_dim", "argwhere"]


# Two errors of two families at once, as NumPy's AxisError is both ValueError and
# IndexError: each is what PyTorch raises in one place and what pyflow raised (and code
# may catch) before, so an ``except`` for either class catches it.
class IndexOutOfBoundsError(IndexError, RuntimeError):
    """An index out of bounds in gather / scatter / index_select / index_add: PyTorch's
    is a RuntimeError from gather and scatter and an IndexError from index_select."""


class IndexKeyTypeError(IndexError, TypeError):
    """A key of a type that cannot index a tensor (a str): PyTorch raises TypeError."""


# ------------------------------------------------------------------ gather / scatter
def _check_index(index, op, name="index"):
    check_tensor(index, name, op)
    if index.dtype not in (_dt.int64, _dt.int32):
        raise RuntimeError(f"{op}(): Expected dtype int64 for {name}, got {index.dtype}")
    return index


def _check_bounds(idx, size, dim, op):
    """Indices must lie in [0, size) (gather/scatter take no negative indices)."""
    if idx.size:
        stored = stored_elements(idx)            # an expanded index: its stored elements
        lo, hi = int(stored.min()), int(stored.max())
        if lo < 0 or hi >= size:
            raise IndexOutOfBoundsError(f"{op}(): index {hi if hi >= size else lo} is out of "
                                        f"bounds for dimension {dim} with size {size}")


def _fold3(arr, d):
    """Reshape a C-contiguous array to (outer, size[d], inner)."""
    shape = arr.shape
    return arr.reshape(int(np.prod(shape[:d], dtype=np.int64)), shape[d],
                       int(np.prod(shape[d + 1:], dtype=np.int64)))


def _region(shape, index_shape, d):
    """Slices restricting every dim but ``d`` to the index's extent."""
    return tuple(slice(None) if i == d else slice(0, index_shape[i]) for i in range(len(shape)))


def _gather_args(input, dim, index, op, other=None):
    check_tensor(input, "input", op)
    check_tensor(index, "index", op)
    d = input._wrap_dim(dim) if input.ndim else input._wrap_dim(dim, 1)   # the dim first
    if index.numel() == 0:
        return d        # an empty index selects nothing: PyTorch checks nothing else
    _check_index(index, op)
    nd = max(input.ndim, 1)
    if max(index.ndim, 1) != nd:
        raise RuntimeError(f"{op}(): Index tensor must have the same number of dimensions as "
                           f"input tensor (index shape {tuple(index.shape)}, input shape "
                           f"{tuple(input.shape)})")
    ishape = input._data.shape or (1,)
    xshape = index._data.shape or (1,)
    for i in range(nd):
        if i != d and xshape[i] > ishape[i]:
            raise RuntimeError(f"{op}(): Size does not match at dimension {i} expected index "
                               f"{list(index.shape)} to be no larger than self "
                               f"{list(input.shape)} apart from dimension {d}")
        if other is not None and xshape[i] > (other._data.shape or (1,))[i]:
            raise RuntimeError(f"{op}(): Expected index {list(index.shape)} to be no larger than "
                               f"src {list(other.shape)} at dimension {i}")
    return d


class Gather(Function):
    @staticmethod
    def forward(ctx, x, d, index):
        ctx.x_shape, ctx.d, ctx.index = x._data.shape, d, index
        data = x._data.reshape(x._data.shape or (1,))
        xp = array_module(data)
        if index._data.size == 0:       # any shape (see _gather_args): the index's
            return Tensor._make(xp.zeros(index._data.shape, data.dtype), x.dtype, x.device)
        idx = xp.ascontiguousarray(index._data.reshape(index._data.shape or (1,)), np.int64)
        _check_bounds(idx, data.shape[d], d, "gather")
        src = xp.ascontiguousarray(data[_region(data.shape, idx.shape, d)])
        out = kernel("gather", x.device.type)(_fold3(src, d), _fold3(idx, d))
        return Tensor._make(out.reshape(index._data.shape), x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        z = zeros(ctx.x_shape, dtype=g.dtype, device=g.device)
        return ScatterAdd.apply(z, ctx.d, ctx.index, g, True), None, None


class ScatterAdd(Function):
    """``out = input.clone(); out[index] (+)= src`` along ``d`` (accumulate or assign)."""

    @staticmethod
    def forward(ctx, x, d, index, src, accumulate):
        ctx.d, ctx.index, ctx.accumulate = d, index, accumulate
        ctx.src_shape = tuple(src.shape)
        shape = x._data.shape or (1,)
        data = x._compute()
        xp = array_module(data)
        out = xp.array(data, copy=True, order="C").reshape(shape)
        if index._data.size == 0:       # nothing to write (src of any shape, see _gather_args)
            return wrap(out.reshape(x._data.shape), x.dtype, x.device)
        idx = xp.ascontiguousarray(index._data.reshape(index._data.shape or (1,)), np.int64)
        _check_bounds(idx, shape[d], d, "scatter_add" if accumulate else "scatter")
        s = compute_array(src, x.dtype)
        s = xp.ascontiguousarray(s.reshape(s.shape or (1,))[_region(s.shape or (1,), idx.shape, d)])
        region = _region(shape, idx.shape, d)
        run = kernel("scatter", x.device.type)
        if out[region].shape == shape:
            run(_fold3(out, d), _fold3(idx, d), _fold3(s, d), accumulate)
        elif accumulate:   # the index covers part of the other dims: scatter into a block
            block = xp.zeros(out[region].shape, out.dtype)
            run(_fold3(block, d), _fold3(idx, d), _fold3(s, d), True)
            out[region] += block
        else:
            block = xp.ascontiguousarray(out[region])
            run(_fold3(block, d), _fold3(idx, d), _fold3(s, d), False)
            out[region] = block
        return wrap(out.reshape(x._data.shape), x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        gx = gs = None
        if ctx.needs_input_grad[0]:
            gx = g if ctx.accumulate else ScatterAdd.apply(
                g, ctx.d, ctx.index,
                Tensor._make(array_module(g._data).zeros(tuple(ctx.index.shape), g.dtype.storage),
                             g.dtype, g.device), False)
        if ctx.needs_input_grad[3] and ctx.index.numel() == 0:     # src was not read
            gs = zeros(ctx.src_shape, dtype=g.dtype, device=g.device)
        elif ctx.needs_input_grad[3]:
            gs = Gather.apply(g, ctx.d, ctx.index)
            if tuple(gs.shape) != ctx.src_shape:   # src larger than index: zeros elsewhere
                gs = SliceScatter.apply(gs, ctx.src_shape,
                                        tuple(slice(0, n) for n in gs.shape))
        return gx, None, None, gs, None


@tensor_method()
@whole_globals
def gather(input, dim, index, *, sparse_grad=False):
    """out[i][j][k] = input[index[i][j][k]][j][k] (for dim=0), shape of ``index``."""
    d = _gather_args(input, dim, index, "gather")
    return Gather.apply(input, d, index)


@tensor_method()
@whole_globals
def take_along_dim(input, indices, dim=None):
    check_tensor(input, "input", "take_along_dim")
    _check_index(indices, "take_along_dim", "indices")
    if dim is None:
        return gather(reshape(input, (-1,)), 0, reshape(indices, (-1,)))
    d = input._wrap_dim(dim)
    if input.ndim != indices.ndim:
        raise RuntimeError(f"take_along_dim(): input and indices should have the same number of "
                           f"dimensions, but got {input.ndim} and {indices.ndim}")
    ishape, xshape = list(input.shape), list(indices.shape)
    ishape[d] = xshape[d] = 1
    b = broadcast_shapes(tuple(ishape), tuple(xshape), op="take_along_dim")
    in_b = list(b)
    in_b[d] = input.shape[d]
    ix_b = list(b)
    ix_b[d] = indices.shape[d]
    return gather(expand(input, tuple(in_b)), d, expand(indices, tuple(ix_b)))


def _scatter_src(input, src, value, op):
    if src is not None and value is not None:
        raise TypeError(f"{op}(): pass either src or value, not both")
    if src is None:
        src = value
    if src is None:
        raise TypeError(f"{op}(): missing argument 'src' (a Tensor) or 'value' (a number)")
    return src


@tensor_method()
@whole_globals
def scatter(input, dim, index, src=None, *, value=None, reduce=None):
    """out = input.clone(); out[index[i][j]][j] = src[i][j] (dim=0); src may be a number."""
    src = _scatter_src(input, src, value, "scatter")
    if reduce is not None:
        if reduce in ("add", "sum"):
            return scatter_add(input, dim, index, src if isinstance(src, Tensor) else
                               _broadcast_value(src, input, index))
        raise NotImplementedError(f"scatter(): reduce={reduce!r} is not supported (use 'add')")
    if not isinstance(src, Tensor):
        src = _broadcast_value(src, input, index)
    d = _gather_args(input, dim, index, "scatter", src)
    return ScatterAdd.apply(input, d, index, src, False)


def _broadcast_value(value, input, index):
    return full(tuple(index.shape), value, dtype=input.dtype, device=input.device)


@tensor_method()
@whole_globals
def scatter_add(input, dim, index, src):
    """out = input.clone(); out[index[i][j]][j] += src[i][j] (dim=0); duplicates accumulate."""
    check_tensor(src, "src", "scatter_add")
    d = _gather_args(input, dim, index, "scatter_add", src)
    return ScatterAdd.apply(input, d, index, src, True)


@tensor_method()
def scatter_(input, dim, index, src=None, *, value=None, reduce=None):
    src = _scatter_src(input, src, value, "scatter_")
    if isinstance(src, Tensor):   # passed through so autograd sees it as an input
        return _inplace(input, lambda s, v: scatter(s, dim, index, v, reduce=reduce), src)
    return _inplace(input, lambda s: scatter(s, dim, index, src, reduce=reduce))


@tensor_method()
def scatter_add_(input, dim, index, src):
    return _inplace(input, lambda s, v: scatter_add(s, dim, index, v), src)


# ------------------------------------------------------------------ index_select / index_add
def _index_vector(index, size, d, op):
    _check_index(index, op)
    if index.ndim > 1:
        raise IndexError(f"{op}(): index must be a vector (0-d or 1-d), got shape "
                         f"{tuple(index.shape)}")
    idx = array_module(index._data).ascontiguousarray(index._data.reshape(-1), np.int64)
    _check_bounds(idx, size, d, op)
    return idx


class IndexSelect(Function):
    @staticmethod
    def forward(ctx, x, d, index):
        ctx.x_shape, ctx.d, ctx.index = x._data.shape, d, index
        data = x._data.reshape(x._data.shape or (1,))
        idx = _index_vector(index, data.shape[d], d, "index_select")
        out = kernel("index_select", x.device.type)(data, d, idx)
        if x.ndim == 0:
            out = out.reshape(())
        return Tensor._make(out, x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        z = zeros(ctx.x_shape, dtype=g.dtype, device=g.device)
        return IndexAdd.apply(z, ctx.d, ctx.index, g, 1), None, None


class IndexAdd(Function):
    @staticmethod
    def forward(ctx, x, d, index, src, alpha):
        ctx.d, ctx.index, ctx.alpha = d, index, alpha
        shape = x._data.shape or (1,)
        idx = _index_vector(index, shape[d], d, "index_add")
        data = x._compute()
        xp = array_module(data)
        out = xp.array(data, copy=True, order="C").reshape(shape)
        s = compute_array(src, x.dtype).reshape(src._data.shape or (1,))
        if alpha != 1:
            s = s * alpha
        kernel("index_add", x.device.type)(_fold3(out, d), idx, _fold3(xp.ascontiguousarray(s), d))
        return wrap(out.reshape(x._data.shape), x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        gs = None
        if ctx.needs_input_grad[3]:
            gs = IndexSelect.apply(g, ctx.d, ctx.index)
            if ctx.alpha != 1:
                gs = gs * ctx.alpha
        return g, None, None, gs, None


@tensor_method()
@whole_globals
def index_select(input, dim, index):
    check_tensor(input, "input", "index_select")
    check_tensor(index, "index", "index_select")
    d = input._wrap_dim(dim) if input.ndim else input._wrap_dim(dim, 1)
    if input.ndim == 0 and index.ndim <= 1 and index.numel() != 1:
        raise RuntimeError(f"index_select(): Index to scalar can have only 1 value, got "
                           f"{index.numel()} value(s)")
    return IndexSelect.apply(input, d, index)


@tensor_method()
@whole_globals
def index_add(input, dim, index, source, *, alpha=1):
    """out = input.clone(); out.select(dim, index[i]) += alpha * source.select(dim, i)."""
    check_tensor(input, "input", "index_add")
    check_tensor(source, "source", "index_add")
    d = input._wrap_dim(dim) if input.ndim else input._wrap_dim(dim, 1)
    expect = list(input.shape or (1,))
    n = index.numel()
    expect[d] = n
    if list(source.shape or (1,)) != expect:
        raise RuntimeError(f"index_add(): source shape {list(source.shape)} must match input "
                           f"shape {list(input.shape)} with dimension {d} of size {n} (the "
                           f"number of indices)")
    return IndexAdd.apply(input, d, index, source, alpha)


@tensor_method()
def index_add_(input, dim, index, source, *, alpha=1):
    return _inplace(input, lambda s, v: index_add(s, dim, index, v, alpha=alpha), source)


# ------------------------------------------------------------------ nonzero
@tensor_method()
@_hooks.data_dependent_shape
def nonzero(input, *, as_tuple=False):
    """Indices of the non-zero elements: an (n, ndim) int64 tensor, or ndim 1-D tensors."""
    check_tensor(input, "input", "nonzero")
    data = input._data if input.dtype is not _dt.bfloat16 else input._compute()
    xp = array_module(data)
    if as_tuple:
        cols = xp.nonzero(data) if data.ndim else xp.nonzero(data.reshape(1))
        return tuple(Tensor._make(c.astype(np.int64), _dt.int64, input.device) for c in cols)
    return Tensor._make(xp.argwhere(data).astype(np.int64), _dt.int64, input.device)


@tensor_method()
def argwhere(input):
    return nonzero(input)
