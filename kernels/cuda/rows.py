"""What every CUDA row kernel (softmax, layer/rms/batch norm, cross-entropy)
shares: block sizes, input checks and copies, and the warp/block reductions.

Block reductions (``device_helpers(acc)``): each warp reduces with
``shfl_down_sync``, lane 0 of every warp leaves its value in shared memory,
the first warp's worth of slots is reduced again by every warp and lane 0's
result is broadcast with ``shfl_sync``.  Blocks are always a multiple of 32
threads.  numba's CUDA simulator (numba-cuda 0.30) has no warp shuffles;
``_simulator.py`` installs stand-ins, so the kernel code is the same.
``device_helpers`` returns fresh device functions for accumulator dtype
``acc``: ``warp_sum``, ``block_sum``, ``block_max_sum`` (online max and sum of
exp, merged), ``block_welford`` (mean and M2), ``safe_log``.
"""
import math

import numpy as np
from numba import cuda
from numba import types as nbtypes

from . import layout
from ._memory import (SIM_MAX_BLOCKS, SIM_THREADS, empty, is_device_array, is_host_array,
                      launch_config, simulated, stream, to_device)

FULL_MASK = 0xFFFFFFFF
WARP = 32
MAX_WARPS = 32                 # 1024 threads per block at most
MAX_ROW_THREADS = 512          # threads per row block
MAX_ROW_BLOCKS = 1 << 16       # rows beyond this many blocks are grid-strided

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
    out_shape, out_strides, out_dtype = layout.describe(out)
    src_shape, src_strides, src_dtype = layout.describe(src)
    if tuple(out_shape) != tuple(src_shape):
        raise ValueError(f"copy: out has shape {tuple(out_shape)}, source {tuple(src_shape)}")
    n = math.prod(out_shape)
    if n == 0:
        return out
    out_view, out_off = layout.span(out, out_shape, out_strides, out_dtype)
    src_view, src_off = layout.span(src, src_shape, src_strides, src_dtype)
    strides = [layout.element_strides(out_shape, out_strides, out_dtype, out_shape, "out"),
               layout.element_strides(src_shape, src_strides, src_dtype, out_shape, "source")]
    shape, (out_st, src_st) = layout.coalesce(list(out_shape), strides)
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
    shape, strides, dt = layout.describe(a)
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


def kernel_specs():
    """The strided copy kernel (row kernels copy non-contiguous inputs with it) as
    (label, fresh Python function, numba signature), for compiling to PTX."""
    return [("copy_strided", _copy_function(),
             (nbtypes.float32[::1], nbtypes.UniTuple(nbtypes.int64, 2), nbtypes.int64,
              nbtypes.float64[::1], nbtypes.UniTuple(nbtypes.int64, 2), nbtypes.int64,
              nbtypes.int64, nbtypes.UniTuple(nbtypes.int64, 2)))]
