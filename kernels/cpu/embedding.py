"""Embedding lookup (a row gather) and its backward (a row scatter-add), numba.

The scatter-add runs serially: two indices may name the same row, and a
parallel loop over indices would race on it.  Indices are validated by the op
before these kernels run, so they never read out of bounds.
"""
import numpy as np
from numba import njit, prange

from ..registry import register
from .twin import twin


@twin(size_of=2, nogil=True, cache=True)
def _gather_rows(weight, idx, out):
    for i in prange(idx.size):
        out[i, :] = weight[idx[i], :]


@njit(nogil=True, cache=True)
def _scatter_add_rows(g, idx, padding_idx, scale_by_freq, out):
    counts = np.zeros(out.shape[0], np.int64)
    if scale_by_freq:
        for i in range(idx.size):
            counts[idx[i]] += 1
    for i in range(idx.size):
        r = idx[i]
        if r == padding_idx:
            continue
        s = 1.0 / counts[r] if scale_by_freq else 1.0
        for j in range(out.shape[1]):
            out[r, j] += g[i, j] * s


@register("embedding", "cpu")
def embedding(weight, idx):
    """weight (num, dim), idx int64 (any shape) -> idx.shape + (dim,)."""
    flat = np.ascontiguousarray(idx, np.int64).reshape(-1)
    out = np.empty((flat.size, weight.shape[1]), weight.dtype)
    _gather_rows(np.ascontiguousarray(weight), flat, out)
    return out.reshape(idx.shape + (weight.shape[1],))


@register("embedding_backward", "cpu")
def embedding_backward(g, idx, num_embeddings, padding_idx, scale_grad_by_freq):
    """Sum the rows of g (idx.shape + (dim,)) into a (num_embeddings, dim) zero array;
    the row ``padding_idx`` (-1: none) gets nothing."""
    dim = g.shape[-1]
    out = np.zeros((num_embeddings, dim), g.dtype)
    flat = np.ascontiguousarray(idx, np.int64).reshape(-1)
    _scatter_add_rows(np.ascontiguousarray(g).reshape(-1, dim), flat, int(padding_idx),
                      bool(scale_grad_by_freq), out)
    return out
