"""Softmax and log-softmax row kernels (numba.cuda), forward and fused backward,
and the block-reduction building blocks every row kernel shares.

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

Block reductions (``device_helpers``): each warp reduces with
``shfl_down_sync``, lane 0 of every warp leaves its value in shared memory,
the first warp's worth of slots is reduced again by every warp and lane 0's
result is broadcast with ``shfl_sync``.  Blocks are always a multiple of 32
threads.  numba's CUDA simulator (numba-cuda 0.30) has no warp shuffles;
``_simulator.py`` installs stand-ins, so the kernel code is the same.

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
from . import elementwise as _ew
from ._memory import (SIM_MAX_BLOCKS, SIM_THREADS, empty, is_device_array, is_host_array,  # noqa: F401
                      launch_config, simulated, stream, to_device)

FULL_MASK = 0xFFFFFFFF
WARP = 32
MAX_WARPS = 32                 # 1024 threads per block at most
MAX_ROW_THREADS = 512          # threads per row block
MAX_ROW_BLOCKS = 1 << 16       # rows beyond this many blocks are grid-strided
# softmax over a non-last dim: the per-column kernel when it has this many
# columns (threads) to run, else transpose + row kernel.  A module variable so
# the simulator checks can exercise both paths on tiny shapes.
COLUMN_KERNEL_MIN_COLUMNS = 2048

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
NUMBA_FLOAT = {np.dtype(np.float32): nbtypes.float32, np.dtype(np.float64): nbtypes.float64}


# ------------------------------------------------------------------ checks and host helpers
def check_float(a, op, what="x"):
    """The dtype of float array ``a``, or a TypeError naming the op and argument."""
    dtype = np.dtype(a.dtype)
    if dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: CUDA kernel takes float32 or float64 {what}, got {dtype} "
                        f"(float16/bfloat16 tensors are computed in float32 by the ops)")
    return dtype


def row_threads(n):
    """Threads for a block that strides over ``n`` elements: one per element up
    to MAX_ROW_THREADS, a multiple of 32 (the block reductions need whole warps).
    One warp under the simulator (see _memory.SIM_THREADS)."""
    if simulated():
        return SIM_THREADS
    return min(MAX_ROW_THREADS, max(WARP, -(-n // WARP) * WARP))


def row_blocks(rows):
    """One block per row up to MAX_ROW_BLOCKS (the kernels grid-stride over rows)."""
    return max(1, min(rows, SIM_MAX_BLOCKS if simulated() else MAX_ROW_BLOCKS))


def as_input(a):
    """A kernel argument that is only read.  The simulator copies NumPy arguments
    back after a launch; ``cuda.In`` spares that (and read-only views)."""
    return cuda.In(a) if isinstance(a, np.ndarray) else a


def _c_contiguous(shape, strides, itemsize):
    step = itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != step:
            return False
        step *= n
    return True


def _copy_function():
    def copy_strided(out, out_st, out_off, src, src_st, src_off, n, shape):
        """out[i] = src[i] over a shape, both given as flat spans + element strides;
        the assignment casts (int32 -> int64 targets, float64 -> float32 weights)."""
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            rem = i
            po = out_off
            ps = src_off
            for d in range(len(shape) - 1, -1, -1):
                q = rem // shape[d]
                j = rem - q * shape[d]
                rem = q
                po += j * out_st[d]
                ps += j * src_st[d]
            out[po] = src[ps]
    return copy_strided


_copy_kernel = None


def copy_into(out, src):
    """Copy (and cast) ``src`` into ``out`` of the same shape; either may be any strided view."""
    global _copy_kernel
    out_shape, out_strides, out_dtype = _ew._describe(out)
    src_shape, src_strides, src_dtype = _ew._describe(src)
    if tuple(out_shape) != tuple(src_shape):
        raise ValueError(f"copy: out has shape {tuple(out_shape)}, source {tuple(src_shape)}")
    n = math.prod(out_shape)
    if n == 0:
        return out
    out_view, out_off = _ew._span(out, out_shape, out_strides, out_dtype)
    src_view, src_off = _ew._span(src, src_shape, src_strides, src_dtype)
    strides = [_ew._element_strides(out_shape, out_strides, out_dtype, out_shape, "out"),
               _ew._element_strides(src_shape, src_strides, src_dtype, out_shape, "source")]
    shape, (out_st, src_st) = _ew._coalesce(list(out_shape), strides)
    if not shape:                                   # one element
        shape, out_st, src_st = (1,), (0,), (0,)
    if _copy_kernel is None:
        _copy_kernel = cuda.jit(_copy_function())
    blocks, threads = launch_config(n)
    _copy_kernel[blocks, threads, stream()](out_view, out_st, out_off, as_input(src_view),
                                             src_st, src_off, n, shape)
    return out


def contiguous(a, dtype=None):
    """``a`` as a C-contiguous device array of ``dtype`` (no copy when it already is)."""
    shape, strides, dt = _ew._describe(a)
    dtype = dt if dtype is None else np.dtype(dtype)
    if dtype == dt and _c_contiguous(shape, strides, dt.itemsize):
        return a
    return copy_into(empty(tuple(shape), dtype, a), a)


def table(a, dtype, like):
    """A small parameter array (targets, class weights, statistics) next to
    ``like``, contiguous and of ``dtype``; a host NumPy array is copied over."""
    if is_host_array(a) and is_device_array(like):
        return to_device(np.ascontiguousarray(a, dtype), like)
    if not isinstance(a, np.ndarray) and not is_device_array(a):
        a = np.asarray(a, dtype)                      # a list or a number
    return contiguous(a, dtype)


# ------------------------------------------------------------------ warp shuffles
def _shuffles():
    """Warp shuffles as inlined device functions (the simulator gets its stand-ins
    from ``_simulator.py``)."""
    def shfl_down(value, delta):
        return cuda.shfl_down_sync(FULL_MASK, value, delta)

    def shfl_idx(value, lane):
        return cuda.shfl_sync(FULL_MASK, value, lane)
    dev = cuda.jit(device=True, inline=True)
    return dev(shfl_down), dev(shfl_idx)


# ------------------------------------------------------------------ block reductions
def device_helpers(acc):
    """Fresh ``@cuda.jit(device=True)`` block reductions accumulating in ``acc``
    (np.float32 or np.float64).  Each takes the caller's shared arrays of
    MAX_WARPS slots and ends with a barrier, so they can be called back to back.
    Returns a dict: warp_sum, block_sum, block_max_sum, block_welford, safe_log."""
    zero, neg_inf, nan = acc(0), acc(-np.inf), acc(np.nan)
    shfl_down, shfl_idx = _shuffles()
    dev = cuda.jit(device=True)

    def safe_log(s):
        """log of a sum of exps, s >= 0 or NaN: log(0) = -inf (the simulator's
        Python math.log would raise)."""
        if s > zero:
            return math.log(s)
        return neg_inf if s == zero else nan

    def warp_sum(v):
        off = WARP // 2
        while off > 0:
            v += shfl_down(v, off)
            off //= 2
        return v

    def block_sum(v, sh):
        """Sum of ``v`` over the block, returned to every thread."""
        lane = cuda.threadIdx.x % WARP
        warp = cuda.threadIdx.x // WARP
        v = warp_sum(v)
        if lane == 0:
            sh[warp] = v
        cuda.syncthreads()
        v = sh[lane] if lane < (cuda.blockDim.x + WARP - 1) // WARP else zero
        v = shfl_idx(warp_sum(v), 0)
        cuda.syncthreads()
        return v

    def merge_max_sum(m1, s1, m2, s2):
        """Two (max, sum of exp(x - max)) pairs as one.  (-inf, 0) is the empty
        pair; NaN in a sum propagates."""
        if m2 > m1:
            m1, s1, m2, s2 = m2, s2, m1, s1
        if m1 == neg_inf:
            return m1, s1 + s2
        return m1, s1 + s2 * math.exp(m2 - m1)

    def warp_max_sum(m, s):
        off = WARP // 2
        while off > 0:
            m2 = shfl_down(m, off)
            s2 = shfl_down(s, off)
            m, s = merge_max_sum(m, s, m2, s2)
            off //= 2
        return m, s

    def block_max_sum(m, s, shm, shs):
        lane = cuda.threadIdx.x % WARP
        warp = cuda.threadIdx.x // WARP
        m, s = warp_max_sum(m, s)
        if lane == 0:
            shm[warp] = m
            shs[warp] = s
        cuda.syncthreads()
        if lane < (cuda.blockDim.x + WARP - 1) // WARP:
            m = shm[lane]
            s = shs[lane]
        else:
            m = neg_inf
            s = zero
        m, s = warp_max_sum(m, s)
        m = shfl_idx(m, 0)
        s = shfl_idx(s, 0)
        cuda.syncthreads()
        return m, s

    def merge_welford(c1, m1, q1, c2, m2, q2):
        """Chan et al.: two (count, mean, sum of squared deviations) as one."""
        c = c1 + c2
        if c == zero:
            return c, m1, q1
        d = m2 - m1
        f = c2 / c
        return c, m1 + d * f, q1 + q2 + d * d * c1 * f

    def warp_welford(c, m, q):
        off = WARP // 2
        while off > 0:
            c2 = shfl_down(c, off)
            m2 = shfl_down(m, off)
            q2 = shfl_down(q, off)
            c, m, q = merge_welford(c, m, q, c2, m2, q2)
            off //= 2
        return c, m, q

    def block_welford(c, m, q, shc, shm, shq):
        lane = cuda.threadIdx.x % WARP
        warp = cuda.threadIdx.x // WARP
        c, m, q = warp_welford(c, m, q)
        if lane == 0:
            shc[warp] = c
            shm[warp] = m
            shq[warp] = q
        cuda.syncthreads()
        if lane < (cuda.blockDim.x + WARP - 1) // WARP:
            c = shc[lane]
            m = shm[lane]
            q = shq[lane]
        else:
            c = zero
            m = zero
            q = zero
        c, m, q = warp_welford(c, m, q)
        c = shfl_idx(c, 0)
        m = shfl_idx(m, 0)
        q = shfl_idx(q, 0)
        cuda.syncthreads()
        return c, m, q

    warp_sum = dev(warp_sum)
    merge_max_sum = dev(merge_max_sum)
    warp_max_sum = dev(warp_max_sum)
    merge_welford = dev(merge_welford)
    warp_welford = dev(warp_welford)
    return {"warp_sum": warp_sum, "block_sum": dev(block_sum),
            "block_max_sum": dev(block_max_sum), "block_welford": dev(block_welford),
            "safe_log": dev(safe_log)}


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
    specs = [("copy_strided", _copy_function(),
              (nbtypes.float32[::1], nbtypes.UniTuple(nbtypes.int64, 2), nbtypes.int64,
               nbtypes.float64[::1], nbtypes.UniTuple(nbtypes.int64, 2), nbtypes.int64,
               nbtypes.int64, nbtypes.UniTuple(nbtypes.int64, 2)))]
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
    mshape, _, mdtype = _ew._describe(mask)
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
