"""Embedding lookup: rows of ``weight`` gathered by integer indices.

The backward scatter-adds the output gradient into a zero (num_embeddings,
dim) gradient (a dense one, also when ``sparse=True`` is asked for); rows at
``padding_idx`` get none.  The scatter is a Function whose own backward is the
gather, so double backward works.
"""
import numpy as np

from .._hooks import recordable
from ..autograd import Function, no_grad
from ..tensor import Tensor
from ._util import (array_module, check_allocation, check_same_device, check_tensor,
                    compute_array, kernel, stored_elements, wrap)
from .index import IndexOutOfBoundsError
from ..distributed.signatures import embedding_rule

__all__ = ["embedding"]


class IndicesDtypeError(TypeError, RuntimeError):
    """Indices that are not integers: PyTorch raises RuntimeError, pyflow raised (and
    code may catch) TypeError, so this is both (as NumPy's AxisError is both
    ValueError and IndexError)."""


class Embedding(Function):
    sbp_rule = embedding_rule
    @staticmethod
    def forward(ctx, weight, idx, padding_idx, scale_grad_by_freq):
        if isinstance(idx, Tensor):     # a global op passes the indices' piece as a Tensor
            idx = array_module(idx._data).asarray(idx._data, np.int64)
        ctx.args = (idx, weight.shape[0], padding_idx, scale_grad_by_freq)
        out = kernel("embedding", weight.device.type)(compute_array(weight, weight.dtype), idx)
        return wrap(out, weight.dtype, weight.device)

    @staticmethod
    def backward(ctx, g):
        return EmbeddingBackward.apply(g, *ctx.args), None, None, None


class EmbeddingBackward(Function):
    @staticmethod
    def forward(ctx, g, idx, num_embeddings, padding_idx, scale_grad_by_freq):
        ctx.args = (idx, padding_idx, scale_grad_by_freq)
        dw = kernel("embedding_backward", g.device.type)(
            compute_array(g, g.dtype), idx, num_embeddings, padding_idx, scale_grad_by_freq)
        return wrap(dw, g.dtype, g.device)

    @staticmethod
    def backward(ctx, gg):
        idx, padding_idx, scale_grad_by_freq = ctx.args
        rows = Embedding.apply(gg, idx, -1, False)
        factor = (idx != padding_idx).astype(np.float64)
        if scale_grad_by_freq:
            counts = array_module(idx).bincount(idx.reshape(-1), minlength=gg.shape[0])
            factor = factor / counts[idx]
        if not factor.all() or scale_grad_by_freq:
            rows = rows * wrap(factor[..., None], gg.dtype, gg.device)
        return rows, None, None, None, None


def _renorm_(weight, idx, max_norm, norm_type):
    """Rescale (in place, outside autograd) the looked-up rows whose norm exceeds max_norm."""
    xp = array_module(idx)            # numpy, or the device's (idx is on weight's device)
    rows = xp.unique(idx)
    w = xp.asarray(weight._compute(), np.float64)
    norms = xp.linalg.norm(w[rows], ord=norm_type, axis=1)
    big = norms > max_norm
    if big.any():
        w = w.copy()
        w[rows[big]] *= (max_norm / (norms[big] + 1e-7))[:, None]
        with no_grad():
            weight._data[...] = wrap(w, weight.dtype, weight.device)._data
            weight._version[0] += 1


def check_indices(indices, weight_shape):
    """Every index stored in ``indices`` (an int array) names a row of a weight
    of ``weight_shape``; returns the stored elements.  Bounds on the elements
    stored, not on every position of an expanded view (on a device: min and
    max come to the host, like PyTorch's device-side assert).  A compiled
    graph's kernel-level embedding checks every call's indices with it too."""
    num = weight_shape[0]
    stored = stored_elements(indices)
    if stored.size and num == 0:        # PyTorch: a RuntimeError, not its IndexError below
        raise RuntimeError(f"embedding(): weight has no rows (shape {list(weight_shape)}), so "
                           f"no index is in range")
    if stored.size and (int(stored.min()) < 0 or int(stored.max()) >= num):
        bad = stored[(stored < 0) | (stored >= num)].reshape(-1)[0]
        # PyTorch: IndexError, or RuntimeError when the rows are empty (dim 0): both
        raise IndexOutOfBoundsError(f"embedding(): index {int(bad)} is out of range for "
                                    f"num_embeddings={num} (weight of shape "
                                    f"{list(weight_shape)})")
    return stored


@recordable(differentiable=True)   # checks the indices on the host
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,
              scale_grad_by_freq=False, sparse=False):
    """``weight[input]``: one row of ``weight`` (num_embeddings, dim) per index."""
    check_tensor(input, "input", "embedding")
    check_tensor(weight, "weight", "embedding")
    if input.dtype.category != 1:
        raise IndicesDtypeError(f"embedding(): argument 'input' (indices) must be an integer "
                                f"tensor (int64 or int32), got {input.dtype}")
    if weight.ndim != 2:
        raise ValueError(f"embedding(): weight must be 2-D (num_embeddings, embedding_dim), "
                         f"got shape {list(weight.shape)}")
    num = weight.shape[0]
    if padding_idx is not None:
        if not -num <= padding_idx < num:
            raise ValueError(f"embedding(): padding_idx must be within num_embeddings "
                             f"(-{num} <= padding_idx < {num}), got {padding_idx}")
        padding_idx = padding_idx % num
    check_same_device("embedding", ("weight", weight), input=input)
    # The output (and the kernels' int64 copy of the indices) first: an index that is
    # a broadcast view may stand for 10**12 lookups of one stored element.
    count = input._data.size
    out_shape = list(input._data.shape) + [weight.shape[1]]
    check_allocation(count * (weight.shape[1] * weight.dtype.itemsize + 8),
                     f"the output of shape {out_shape} ({weight.dtype}) and its indices",
                     "embedding")
    stored = check_indices(input._data, tuple(weight.shape))
    idx = array_module(input._data).asarray(input._data, np.int64)
    if max_norm is not None:
        xp = array_module(stored)
        _renorm_(weight, xp.asarray(stored, np.int64), float(max_norm), float(norm_type))
    if input._placement is not None or weight._placement is not None:
        idx = input                     # global: the dispatch needs the indices' SBP
    return Embedding.apply(weight, idx, -1 if padding_idx is None else padding_idx,
                           bool(scale_grad_by_freq))


# check_indices reads the indices on the host: a CUDA graph cannot hold it
# (pyflow.graph.cuda_graph runs it outside the captured segments).  A traced
# node's target is the function ``recordable`` wraps.
embedding.__wrapped__.reads_on_host = True
