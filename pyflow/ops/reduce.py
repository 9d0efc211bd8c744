"""Reductions over dimensions, with ``keepdim``."""
import numpy as np

from .. import dtypes as _dt
from ..autograd import Function
from ._method import tensor_method
from ._util import compute_array, kernel, normalize_dims, wrap

__all__ = ["sum", "mean"]


def _expand_back(g, in_shape, dims, keepdim):
    """Broadcast a reduced gradient back over the reduced dims."""
    from .shape import expand, reshape
    if not keepdim:
        shape = list(in_shape)
        for d in dims:
            shape[d] = 1
        g = reshape(g, tuple(shape))
    return expand(g, tuple(in_shape))


class Sum(Function):
    @staticmethod
    def forward(ctx, x, dims, keepdim, dtype):
        ctx.in_shape, ctx.dims, ctx.keepdim = x._data.shape, dims, keepdim
        out_dtype = dtype or (_dt.int64 if x.dtype.category < 2 else x.dtype)
        arr = kernel("sum", x.device.type)(compute_array(x, x.dtype), dims, keepdim,
                                           out_dtype.compute)
        return wrap(np.asarray(arr), out_dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        return _expand_back(g, ctx.in_shape, ctx.dims, ctx.keepdim), None, None, None


@tensor_method()
def sum(input, dim=None, keepdim=False, *, dtype=None):  # noqa: A001
    dims = normalize_dims(dim, input.ndim, "sum")
    return Sum.apply(input, dims, keepdim, None if dtype is None else _dt.as_dtype(dtype))


class Mean(Function):
    @staticmethod
    def forward(ctx, x, dims, keepdim):
        if not x.dtype.is_floating_point:
            raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be "
                               f"floating point, got {x.dtype}")
        ctx.in_shape, ctx.dims, ctx.keepdim = x._data.shape, dims, keepdim
        ctx.count = int(np.prod([x._data.shape[d] for d in dims])) if dims else 1
        arr = kernel("mean", x.device.type)(compute_array(x, x.dtype), dims, keepdim)
        return wrap(np.asarray(arr, dtype=x.dtype.compute), x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        from .elementwise import div
        return div(_expand_back(g, ctx.in_shape, ctx.dims, ctx.keepdim), ctx.count), None, None


@tensor_method()
def mean(input, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        input = input.to(dtype)
    return Mean.apply(input, normalize_dims(dim, input.ndim, "mean"), keepdim)
