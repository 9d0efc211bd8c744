"""Softmax and log-softmax row kernels (numba.cuda), forward and fused backward.
The block reductions and row helpers every row kernel shares are in ``rows.py``.

Like the CPU module, an input is viewed as (outer, n, inner) around the
softmax dim:

* ``inner == 1`` (the usual case, softmax over the last dim): one block per
  row, its threads striding over the row.  Each thread keeps an *online*
  running (max, sum of exp(x - max)) pair, the pairs are merged across the
  block with warp shuffles and shared memory, and a second pass writes the
  output.  So x is read twice instead of three times (max, sum, write).
* ``inner > 1`` with many columns: one thread per (outer, inner) column walks
  the n elements of its column; neighbouring threads read neighbouring
  memory, so the loads stay coalesced and no copy is made.
* ``inner > 1`` with few columns (too few threads to fill a GPU): the input
  is copied to (outer, inner, n) by the strided copy kernel, the row kernel
  runs, and the result is copied back transposed.

``scale_mask_softmax`` (OneFlow's fused_scale_mask_softmax) is the row kernel
with a bool mask (True: keep) read through per-row offsets into the unbroadcast
mask (``kernels/cpu/softmax.py`` ``mask_rows``): softmax of ``where(mask, x *
scale, fill)``, and its backward, ``scale * y * (g - sum(g * y))`` where the
mask keeps and 0 elsewhere.

Accumulation is in the data's dtype: float32 for float32 (never float64 on a
GPU: constants are typed float32 so nothing is promoted), float64 for float64.
bfloat16/float16 tensors reach these kernels as float32 compute arrays.
"""
import math

import numpy as np
from numba import cuda
from numba import types as nbtypes

from ..cpu.softmax import fused_args, mask_rows
from ..registry import register
from . import layout
from .rows import (FLOAT_DTYPES, MAX_WARPS, NUMBA_FLOAT, as_input, check_float, contiguous, copy_into,
                   device_helpers, row_blocks, row_threads, table)
from ._memory import empty, is_device_array, is_host_array, launch_config, stream, to_device

# softmax over a non-last dim: the per-column kernel when it has this many
# columns (threads) to run, else transpose + row kernel.  A module variable so
# the simulator checks can exercise both paths on tiny shapes.
COLUMN_KERNEL_MIN_COLUMNS = 2048


# ------------------------------------------------------------------ kernel functions
def _softmax_rows(dtype, log):
    """One block per row of x (rows, n): online max/sum, merge, write.  Softmax
    of ``x * scale``; with ``causal`` query rows per matrix, row r keeps the
    keys up to its position (r % causal) and the rest is written as 0 (log:
    -inf) without being read."""
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero, one, neg_inf = acc(0), acc(1), acc(-np.inf)
    helpers = device_helpers(acc)
    block_max_sum, safe_log = helpers["block_max_sum"], helpers["safe_log"]

    def softmax_rows(x, out, scale, causal):
        shm = cuda.shared.array(MAX_WARPS, nb)
        shs = cuda.shared.array(MAX_WARPS, nb)
        rows, n = x.shape
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            nv = n if causal == 0 else min(n, r % causal + 1)
            m, s = neg_inf, zero
            for j in range(tid, nv, nt):
                v = x[r, j] * scale
                if v > m:
                    s = s * math.exp(m - v) + one
                    m = v
                elif m != neg_inf or v != v:   # -inf adds nothing; NaN poisons the sum
                    s += math.exp(v - m)
            m, s = block_max_sum(m, s, shm, shs)
            if log:
                log_s = safe_log(s)
                for j in range(tid, n, nt):
                    out[r, j] = (x[r, j] * scale - m) - log_s if j < nv else neg_inf
            else:
                inv = one / s
                for j in range(tid, n, nt):
                    out[r, j] = math.exp(x[r, j] * scale - m) * inv if j < nv else zero
    softmax_rows.__name__ = f"{'log_' if log else ''}softmax_rows_{dtype.name}"
    return softmax_rows


def _softmax_cols(dtype, log):
    """One thread per column of x (outer, n, inner)."""
    acc = dtype.type
    zero, one, neg_inf = acc(0), acc(1), acc(-np.inf)
    safe_log = device_helpers(acc)["safe_log"]

    def softmax_cols(x, out):
        outer, n, inner = x.shape
        for col in range(cuda.grid(1), outer * inner, cuda.gridsize(1)):
            o = col // inner
            k = col - o * inner
            m, s = neg_inf, zero
            for j in range(n):
                v = x[o, j, k]
                if v > m:
                    s = s * math.exp(m - v) + one
                    m = v
                elif m != neg_inf or v != v:
                    s += math.exp(v - m)
            if log:
                log_s = safe_log(s)
                for j in range(n):
                    out[o, j, k] = (x[o, j, k] - m) - log_s
            else:
                inv = one / s
                for j in range(n):
                    out[o, j, k] = math.exp(x[o, j, k] - m) * inv
    softmax_cols.__name__ = f"{'log_' if log else ''}softmax_cols_{dtype.name}"
    return softmax_cols


# softmax:     dx = y * (g - sum(g * y))
# log_softmax: dx = g - exp(y) * sum(g)
def _backward_rows(dtype, log):
    """The gradient of softmax(x * scale): ``scale`` times the plain one; a
    causally masked tail gets 0 without being read."""
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero = acc(0)
    block_sum = device_helpers(acc)["block_sum"]

    def softmax_backward_rows(g, y, dx, scale, causal):
        sh = cuda.shared.array(MAX_WARPS, nb)
        rows, n = y.shape
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            nv = n if causal == 0 else min(n, r % causal + 1)
            s = zero
            for j in range(tid, nv, nt):
                s += g[r, j] if log else g[r, j] * y[r, j]
            s = block_sum(s, sh)
            for j in range(tid, n, nt):
                if j >= nv:
                    dx[r, j] = zero
                elif log:
                    dx[r, j] = (g[r, j] - math.exp(y[r, j]) * s) * scale
                else:
                    dx[r, j] = y[r, j] * (g[r, j] - s) * scale
    softmax_backward_rows.__name__ = f"{'log_' if log else ''}softmax_backward_rows_{dtype.name}"
    return softmax_backward_rows


def _backward_cols(dtype, log):
    zero = dtype.type(0)

    def softmax_backward_cols(g, y, dx):
        outer, n, inner = y.shape
        for col in range(cuda.grid(1), outer * inner, cuda.gridsize(1)):
            o = col // inner
            k = col - o * inner
            s = zero
            for j in range(n):
                s += g[o, j, k] if log else g[o, j, k] * y[o, j, k]
            for j in range(n):
                if log:
                    dx[o, j, k] = g[o, j, k] - math.exp(y[o, j, k]) * s
                else:
                    dx[o, j, k] = y[o, j, k] * (g[o, j, k] - s)
    softmax_backward_cols.__name__ = f"{'log_' if log else ''}softmax_backward_cols_{dtype.name}"
    return softmax_backward_cols


def _masked_softmax_rows(dtype):
    """One block per row of x (rows, n): softmax of ``where(mask, x * scale,
    fill)``, row r's mask element j at ``m[moff[r] + j * mcol]``."""
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero, one, neg_inf = acc(0), acc(1), acc(-np.inf)
    block_max_sum = device_helpers(acc)["block_max_sum"]

    def masked_softmax_rows(x, out, m, moff, mcol, scale, fill):
        shm = cuda.shared.array(MAX_WARPS, nb)
        shs = cuda.shared.array(MAX_WARPS, nb)
        rows, n = x.shape
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            o = moff[r]
            mx, s = neg_inf, zero
            for j in range(tid, n, nt):
                v = x[r, j] * scale if m[o + j * mcol] else fill
                if v > mx:
                    s = s * math.exp(mx - v) + one
                    mx = v
                elif mx != neg_inf or v != v:   # -inf adds nothing; NaN poisons the sum
                    s += math.exp(v - mx)
            mx, s = block_max_sum(mx, s, shm, shs)
            inv = one / s
            for j in range(tid, n, nt):
                v = x[r, j] * scale if m[o + j * mcol] else fill
                out[r, j] = math.exp(v - mx) * inv
    masked_softmax_rows.__name__ = f"masked_softmax_rows_{dtype.name}"
    return masked_softmax_rows


def _masked_backward_rows(dtype):
    """scale * y * (g - sum(g * y)) where the mask keeps, 0 where it does not
    (the sum runs over the whole row: a finite fill leaves y > 0 there)."""
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero = acc(0)
    block_sum = device_helpers(acc)["block_sum"]

    def masked_softmax_backward_rows(g, y, dx, m, moff, mcol, scale):
        sh = cuda.shared.array(MAX_WARPS, nb)
        rows, n = y.shape
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            o = moff[r]
            s = zero
            for j in range(tid, n, nt):
                s += g[r, j] * y[r, j]
            s = block_sum(s, sh)
            for j in range(tid, n, nt):
                dx[r, j] = y[r, j] * (g[r, j] - s) * scale if m[o + j * mcol] else zero
    masked_softmax_backward_rows.__name__ = f"masked_softmax_backward_rows_{dtype.name}"
    return masked_softmax_backward_rows


_MASKED_FACTORIES = {"masked_rows": _masked_softmax_rows,
                     "masked_backward_rows": _masked_backward_rows}


def _masked_signature(kind, dtype):
    """(arrays..., m bool[::1], moff int64[::1], mcol int64, scale[, fill])."""
    nb = NUMBA_FLOAT[dtype]
    arr = nb[:, ::1]
    arrays = (arr,) * (2 if kind == "masked_rows" else 3)
    tail = (nb, nb) if kind == "masked_rows" else (nb,)
    return arrays + (nbtypes.boolean[::1], nbtypes.int64[::1], nbtypes.int64) + tail


# name -> (factory(dtype, log), ndim of the arrays, number of arrays, row kernel?)
# Row kernels also take (scale, causal): scale in the data's dtype (a float64
# parameter would put float64 instructions in a float32 kernel), causal int64.
_FACTORIES = {"rows": (_softmax_rows, 2, 2, True), "cols": (_softmax_cols, 3, 2, False),
              "backward_rows": (_backward_rows, 2, 3, True),
              "backward_cols": (_backward_cols, 3, 3, False)}


def kernel_specs():
    """Every kernel of this module as (label, fresh Python function, numba
    signature), for compiling to PTX without a GPU."""
    specs = []
    for kind, (factory, ndim, nargs, rows) in _FACTORIES.items():
        for dtype in FLOAT_DTYPES:
            for log in (False, True):
                arr = NUMBA_FLOAT[dtype][(slice(None),) * (ndim - 1) + (slice(None, None, 1),)]
                scalars = (NUMBA_FLOAT[dtype], nbtypes.int64) if rows else ()
                specs.append((f"{kind} {dtype.name} log={log}", factory(dtype, log),
                              (arr,) * nargs + scalars))
    for kind, factory in _MASKED_FACTORIES.items():
        for dtype in FLOAT_DTYPES:
            specs.append((f"{kind} {dtype.name}", factory(dtype), _masked_signature(kind, dtype)))
    return specs


_kernels = {}


def _kernel(kind, dtype, log):
    key = (kind, dtype, log)
    k = _kernels.get(key)
    if k is None:
        if kind in _MASKED_FACTORIES:
            k = _kernels[key] = cuda.jit(_MASKED_FACTORIES[kind](dtype))
        else:
            k = _kernels[key] = cuda.jit(_FACTORIES[kind][0](dtype, log))
    return k


# ------------------------------------------------------------------ entry points
def _split(shape, dim, op):
    if not 0 <= dim < len(shape):
        raise ValueError(f"{op}: dim must be in [0, {len(shape)}) for an array of shape "
                         f"{tuple(shape)}, got {dim}")
    return math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])


def _run(op, arrays, dim, log, backward, scale=1.0, causal=False):
    dtype = check_float(arrays[0], op, "g" if backward else "x")
    shape = tuple(arrays[0].shape)
    if backward:
        a = arrays[1]
        if tuple(a.shape) != shape or np.dtype(a.dtype) != dtype:
            raise ValueError(f"{op}: y must match g ({shape}, {dtype}), got "
                             f"{tuple(a.shape)}, {np.dtype(a.dtype)}")
    outer, n, inner = _split(shape, dim, op)
    causal_rows = fused_args(op, scale, causal, shape, dim, inner)
    out = empty(shape, dtype, arrays[0])
    if out.size == 0:
        return out
    prefix = "backward_" if backward else ""
    arrays = [contiguous(a) for a in arrays]
    if inner == 1:
        ins = [as_input(a.reshape(outer, n)) for a in arrays]
        _kernel(prefix + "rows", dtype, log)[row_blocks(outer), row_threads(n), stream()](
            *ins, out.reshape(outer, n), dtype.type(scale), causal_rows)
    elif outer * inner >= COLUMN_KERNEL_MIN_COLUMNS:
        ins = [as_input(a.reshape(outer, n, inner)) for a in arrays]
        blocks, threads = launch_config(outer * inner)
        _kernel(prefix + "cols", dtype, log)[blocks, threads, stream()](
            *ins, out.reshape(outer, n, inner))
    else:   # few long columns: make them rows, run the row kernel, transpose back
        rows = [contiguous(a.reshape(outer, n, inner).transpose(0, 2, 1)) for a in arrays]
        tmp = empty((outer, inner, n), dtype, out)
        _kernel(prefix + "rows", dtype, log)[row_blocks(outer * inner), row_threads(n),
                                             stream()](
            *[as_input(a.reshape(outer * inner, n)) for a in rows], tmp.reshape(outer * inner, n),
            dtype.type(1), 0)
        copy_into(out.reshape(outer, n, inner).transpose(0, 2, 1), tmp)
    return out


# ``scale`` and ``causal`` (last dim only): attention's fused scale + causal
# mask + softmax (see the CPU module).
@register("softmax", "cuda")
def softmax(x, dim, scale=1.0, causal=False):
    return _run("softmax", [x], dim, False, False, scale, causal)


@register("log_softmax", "cuda")
def log_softmax(x, dim, scale=1.0, causal=False):
    return _run("log_softmax", [x], dim, True, False, scale, causal)


@register("softmax_backward", "cuda")
def softmax_backward(g, y, dim, scale=1.0, causal=False):
    return _run("softmax_backward", [g, y], dim, False, True, scale, causal)


@register("log_softmax_backward", "cuda")
def log_softmax_backward(g, y, dim, scale=1.0, causal=False):
    return _run("log_softmax_backward", [g, y], dim, True, True, scale, causal)


# ------------------------------------------------------------------ scale + bool mask
def _mask_arrays(op, x, mask):
    """The mask as a flat contiguous bool device array, the per-row offsets (on
    x's device) and the column stride (see the CPU module's ``mask_rows``)."""
    mshape, _, mdtype = layout.describe(mask)
    if np.dtype(mdtype) != np.bool_:
        raise TypeError(f"{op}: mask must be bool (True: keep), got {np.dtype(mdtype)}")
    moff, mcol = mask_rows(op, tuple(mshape), tuple(x.shape))
    m = contiguous(mask).reshape(-1)
    if is_host_array(m) and is_device_array(x):
        m = to_device(np.ascontiguousarray(m), x)
    return m, table(moff, np.int64, x), mcol


@register("scale_mask_softmax", "cuda")
def scale_mask_softmax(x, mask, scale=1.0, fill_value=-np.inf):
    """softmax(where(mask, x * scale, fill_value), -1); mask bool, broadcasting to x."""
    op = "scale_mask_softmax"
    dtype = check_float(x, op)
    m, moff, mcol = _mask_arrays(op, x, mask)
    shape = tuple(x.shape)
    out = empty(shape, dtype, x)
    if out.size == 0:
        return out
    n = shape[-1]
    rows = out.size // n
    _kernel("masked_rows", dtype, False)[row_blocks(rows), row_threads(n), stream()](
        as_input(contiguous(x).reshape(rows, n)), out.reshape(rows, n), as_input(m),
        as_input(moff), mcol, dtype.type(scale), dtype.type(fill_value))
    return out


@register("scale_mask_softmax_backward", "cuda")
def scale_mask_softmax_backward(g, y, mask, scale=1.0):
    """The gradient of scale_mask_softmax with respect to x, from its output y."""
    op = "scale_mask_softmax_backward"
    dtype = check_float(g, op, "g")
    shape = tuple(g.shape)
    if tuple(y.shape) != shape or np.dtype(y.dtype) != dtype:
        raise ValueError(f"{op}: y must match g ({shape}, {dtype}), got "
                         f"{tuple(y.shape)}, {np.dtype(y.dtype)}")
    m, moff, mcol = _mask_arrays(op, y, mask)
    dx = empty(shape, dtype, g)
    if dx.size == 0:
        return dx
    n = shape[-1]
    rows = dx.size // n
    _kernel("masked_backward_rows", dtype, False)[row_blocks(rows), row_threads(n), stream()](
        as_input(contiguous(g).reshape(rows, n)), as_input(contiguous(y).reshape(rows, n)),
        dx.reshape(rows, n), as_input(m), as_input(moff), mcol, dtype.type(scale))
    return dx
