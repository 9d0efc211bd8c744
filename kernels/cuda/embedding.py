"""Embedding lookup (a row gather) and its backward (a row scatter-add) on the
GPU, same signatures as ``kernels/cpu/embedding.py``.

Both run one thread per output element (row index ``t // dim``, column
``t % dim``), so consecutive threads touch consecutive columns of one row:
coalesced reads of ``weight`` and coalesced atomics into the gradient.  The
backward accumulates with ``cuda.atomic.add`` (two indices may name the same
row); with ``scale_grad_by_freq`` a first kernel counts each row's uses with
integer atomics.  Indices are range-checked on the device before either kernel
runs (``index.check_range``), with the op's message.
"""
import numpy as np
from numba import cuda

from ..registry import register
from ._memory import empty, launch_config, stream, zeros
from .copy import contiguous, describe, operand, read_only, size_of
from . import index as _index
from .index import device_index, minmax_rows

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _gather_rows(out, weight, w_off, w_st, idx, dim):
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        r = idx[t // dim]
        c = t % dim
        out[t] = weight[w_off + r * w_st[0] + c * w_st[1]]


def _count_rows(counts, idx):
    for t in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        cuda.atomic.add(counts, idx[t], 1)


def _scatter_add_rows(out, g, idx, dim, padding_idx):
    """out[idx[t // dim], t % dim] += g[t] (rows == padding_idx skipped)."""
    for t in range(cuda.grid(1), g.size, cuda.gridsize(1)):
        r = idx[t // dim]
        if r != padding_idx:
            cuda.atomic.add(out, r * dim + t % dim, g[t])


def _scatter_add_rows_scaled(out, g, idx, dim, padding_idx, counts):
    """As above, each term divided by how often its row occurs (like the CPU, the
    product is formed in float64 and rounded once to out's dtype)."""
    for t in range(cuda.grid(1), g.size, cuda.gridsize(1)):
        r = idx[t // dim]
        if r != padding_idx:
            cuda.atomic.add(out, r * dim + t % dim, g[t] * (1.0 / counts[r]))


KERNEL_FUNCTIONS = {"gather_rows": _gather_rows, "count_rows": _count_rows,
                    "scatter_add_rows": _scatter_add_rows,
                    "scatter_add_rows_scaled": _scatter_add_rows_scaled}
_jitted = {}


def _launch(name, n, *args):
    k = _jitted.get(name)
    if k is None:
        k = _jitted[name] = cuda.jit(KERNEL_FUNCTIONS[name])
    blocks, threads = launch_config(n)
    k[blocks, threads, stream()](*args)


def _check_indices(flat, num, weight_shape, op):
    if _index.CHECK_INDICES and size_of(flat):
        lo, hi = (int(v) for v in minmax_rows(flat.reshape(1, -1))[0])
        if lo < 0 or hi >= num:
            raise IndexError(f"{op}(): index {hi if hi >= num else lo} is out of range for "
                             f"num_embeddings={num} (weight of shape {list(weight_shape)})")


@register("embedding", "cuda")
def embedding(weight, idx):
    """weight (num, dim), idx int64 (any shape) -> idx.shape + (dim,)."""
    w_shape, _, dtype = describe(weight)
    if len(w_shape) != 2:
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, embedding_dim), "
                         f"got shape {tuple(w_shape)}")
    shape = tuple(describe(idx)[0])
    flat = device_index(idx, weight).reshape(-1)
    num, dim = w_shape
    out = empty((size_of(flat), dim), dtype, weight)
    if size_of(out):
        _check_indices(flat, num, w_shape, "embedding")
        view, off, st = operand(weight, what="weight")
        _launch("gather_rows", size_of(out), out.reshape(-1), read_only(view), off, tuple(st),
                read_only(flat), dim)
    return out.reshape(shape + (dim,))


@register("embedding_backward", "cuda")
def embedding_backward(g, idx, num_embeddings, padding_idx, scale_grad_by_freq):
    """Sum the rows of g (idx.shape + (dim,)) into a (num_embeddings, dim) zero array;
    the row ``padding_idx`` (-1: none) gets nothing."""
    g_shape, _, dtype = describe(g)
    if dtype not in _FLOATS:
        raise TypeError(f"embedding_backward: g must be float32 or float64 (CUDA atomic add), "
                        f"got {dtype}")
    i_shape = tuple(describe(idx)[0])
    if len(g_shape) != len(i_shape) + 1 or tuple(g_shape[:-1]) != i_shape:
        raise ValueError(f"embedding_backward: g of shape {tuple(g_shape)} does not match "
                         f"indices of shape {i_shape} (expected indices.shape + (dim,))")
    dim = g_shape[-1]
    out = zeros((num_embeddings, dim), dtype, g)
    flat = device_index(idx, g).reshape(-1)
    if size_of(flat) == 0 or dim == 0:
        return out
    _check_indices(flat, num_embeddings, (num_embeddings, dim), "embedding_backward")
    g_flat = contiguous(g).reshape(-1)
    if scale_grad_by_freq:
        counts = zeros(num_embeddings, np.int64, g)
        _launch("count_rows", size_of(flat), counts, read_only(flat))
        _launch("scatter_add_rows_scaled", size_of(g_flat), out.reshape(-1), read_only(g_flat),
                read_only(flat), dim, int(padding_idx), read_only(counts))
    else:
        _launch("scatter_add_rows", size_of(g_flat), out.reshape(-1), read_only(g_flat),
                read_only(flat), dim, int(padding_idx))
    return out
