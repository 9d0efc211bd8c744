"""Reduction and scan CUDA kernels: the ``cuda`` twins of ``kernels/cpu/reduce.py``.

Every registered function has the CPU kernel's signature, argument meaning and
result convention (same shapes, dtypes, NaN/tie rules); only the arrays are
device arrays.

Layout.  The host views the input as *kept* dims (one result each) and
*reduced* dims, both as element (shape, strides) tuples with size-1 dims
dropped and neighbours that are contiguous merged, so most reductions become
one kept and one reduced dim.  Kernels index the input through those strides:
non-contiguous, reversed or expanded inputs need no copy.  Then one of two
kernel shapes runs, chosen so that a warp's loads are contiguous in memory:

* ``row``: the reduced elements are the fast-moving ones (e.g. a sum over the
  last axis).  One block (``T`` threads, T > 32) or one warp (T = 32, several
  rows per block) per result strides over the reduced elements; partial results
  combine with warp shuffles (``cuda.shfl_down_sync``), the per-warp results
  through shared memory.
* ``column``: the kept elements are the fast-moving ones (e.g. a sum over
  axis 0).  A (32, NY) block takes 32 neighbouring results: thread x walks its
  result's reduced elements with stride NY in y, and the NY partial results
  of each column combine through shared memory.

When there are too few results to fill the GPU (a full ``x.sum()``), the
reduced range is cut into ``splits`` chunks reduced by different blocks into
a scratch array of partial states, which a third kernel (``combine``: one warp
per result) folds and finishes.

Every reduction is a *spec*: an accumulator state ``(acc, idx)`` with an
identity, ``step`` (fold in one element), ``combine`` (merge two states; any
order, so the index breaks ties: first index wins) and ``finish`` (state ->
result).  float32 inputs accumulate in float32 and float64 in float64, like the
CPU kernel (prod, cumsum and the 1-/2-norms accumulate in float64 there, so here
too).  var and logsumexp are two launches: the mean (max) per result into a
``center`` array, then the sum of squared deviations (of ``exp(x - max)``).

cumsum: one block per row when the scanned axis is long and contiguous
(chunks of ``T`` elements: warp scans with ``cuda.shfl_up_sync``, the warp
totals scanned in shared memory, a running carry between chunks), otherwise
one thread per row walking it sequentially (rows side by side in memory load
coalesced).  The accumulator is float64/int64 as on the CPU.

numba's simulator has no warp shuffles; ``_install_simulated_shuffles``
adds them to it.  Emulation needs every thread of a warp to shuffle at the
same time, so kernels here call the shuffles warp-uniformly (never under a
branch that depends on the thread), which ``*_sync`` with a full mask needs
on a real GPU anyway.

Kernels are compiled lazily, once per (spec, kernel shape, partial), and cached;
numba specialises them per input dtype and number of kept/reduced dims.
"""
import math
from builtins import max as builtins_max, min as builtins_min

import numpy as np
from numba import cuda
from numba import types as nbt

from ..registry import register
from ._memory import MAX_BLOCKS, SIM_MAX_BLOCKS, empty, simulated
from ._memory import stream as _stream
from . import layout

FULL_MASK = 0xFFFFFFFF
WARP = 32
ROW_THREADS = 256         # threads per result when one block reduces a long row
ROWS_PER_BLOCK = 8        # results per block when one warp reduces a (short) row
WARP_ROW_MAX = 1024       # rows up to this many elements get a warp, longer ones a block
COL_ROWS = 8              # most NY of the (32, NY) column blocks (compile-time constant)
COL_PER_THREAD = 32       # NY grows by one per this many reduced elements per result
SPLIT_CHUNK = 4096        # a split (multi-block) row reduction gives each block >= this many
COL_SPLIT_CHUNK = 1024    # ... and a column reduction each (32, NY) block this many per result
TARGET_BLOCKS = 512       # blocks worth having in flight (a few per SM)
MAX_SPLITS = 1024
SHORT_ROW = 8             # rows up to this long go to the column kernel (thread per row)
ROW_SCAN_MIN = 64         # scans of contiguous rows at least this long get a block per row

_NB = {np.dtype(t): getattr(nbt, np.dtype(t).name)
       for t in (np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_)}
_NB[np.dtype(np.bool_)] = nbt.boolean
_INPUT_DTYPES = tuple(np.dtype(t) for t in
                      (np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_))




# ------------------------------------------------------------------ device helpers
def _offset_function():
    """offset(i, shape, strides): element offset of flat C-order index ``i``."""
    def offset(i, shape, strides):
        p = 0
        for d in range(len(shape) - 1, 0, -1):
            q = i // shape[d]
            p += (i - q * shape[d]) * strides[d]
            i = q
        return p + i * strides[0]
    return cuda.jit(device=True, inline=True)(offset)


def _warp_reduce_function(combine):
    """Fold the 32 states of a warp into lane 0 (tree of shuffles)."""
    def warp_reduce(acc, idx):
        delta = 16
        while delta > 0:
            other = cuda.shfl_down_sync(FULL_MASK, acc, delta)
            other_idx = cuda.shfl_down_sync(FULL_MASK, idx, delta)
            acc, idx = combine(acc, idx, other, other_idx)
            delta //= 2
        return acc, idx
    return cuda.jit(device=True, inline=True)(warp_reduce)


# ------------------------------------------------------------------ specs
class Spec:
    """One reduction: accumulator dtype, output dtype and its device functions.

    ``make()`` builds fresh device functions (identity, step, combine, finish):
    PTX compilation for several targets must not reuse one target's cache."""

    def __init__(self, key, acc, out, make, writes_val=True, writes_idx=False,
                 uses_center=False):
        self.key, self.acc, self.out, self.make = key, np.dtype(acc), np.dtype(out), make
        self.writes_val, self.writes_idx, self.uses_center = writes_val, writes_idx, uses_center


def _sum_spec(acc, out, kind):
    """kind: 'sum', 'mean', 'prod', 'nonzero_sum' (bool result of np.sum(dtype=bool)),
    'norm1', 'norm2', 'norm0', 'normp', 'sqdev' (var's 2nd pass), 'expdev' (logsumexp's)."""
    acc_t, out_t = _NB[np.dtype(acc)], _NB[np.dtype(out)]
    is_prod = kind == "prod"

    def make():
        def identity():
            return acc_t(1) if is_prod else acc_t(0), -1

        if kind in ("sum", "mean"):
            def fold(v, c, p): return acc_t(v)
        elif kind == "prod":
            def fold(v, c, p): return acc_t(v)
        elif kind in ("nonzero_sum", "norm0"):
            def fold(v, c, p): return acc_t(v != 0)
        elif kind == "norm1":
            def fold(v, c, p): return abs(acc_t(v))
        elif kind == "norm2":
            def fold(v, c, p):
                w = acc_t(v)
                return w * w
        elif kind == "normp":
            def fold(v, c, p): return abs(acc_t(v)) ** acc_t(p)
        elif kind == "sqdev":
            def fold(v, c, p):
                d = acc_t(v) - c
                return d * d
        elif kind == "expdev":
            def fold(v, c, p): return math.exp(acc_t(v) - c)
        else:
            raise ValueError(kind)
        fold = cuda.jit(device=True, inline=True)(fold)

        if is_prod:
            def step(acc, idx, v, k, c, p): return acc * fold(v, c, p), idx

            def combine(a, ai, b, bi): return a * b, ai
        else:
            def step(acc, idx, v, k, c, p): return acc + fold(v, c, p), idx

            def combine(a, ai, b, bi): return a + b, ai

        if kind == "mean":
            def finish(acc, idx, count, c, p): return out_t(acc / acc_t(count))
        elif kind == "nonzero_sum":
            def finish(acc, idx, count, c, p): return acc != 0
        elif kind == "norm2":
            def finish(acc, idx, count, c, p): return out_t(math.sqrt(acc))
        elif kind == "normp":
            def finish(acc, idx, count, c, p): return out_t(acc ** acc_t(1.0 / p))
        elif kind == "sqdev":
            def finish(acc, idx, count, c, p): return out_t(acc / acc_t(p))
        elif kind == "expdev":
            def finish(acc, idx, count, c, p):
                if acc == 0:                       # every exp underflowed or the slice is empty
                    return out_t(-math.inf)
                return out_t(math.log(acc) + c)
        else:
            def finish(acc, idx, count, c, p): return out_t(acc)
        jit = cuda.jit(device=True, inline=True)
        return jit(identity), jit(step), jit(combine), jit(finish)

    return Spec((kind, np.dtype(acc).name, np.dtype(out).name), acc, out, make,
                uses_center=kind in ("sqdev", "expdev"))


def _extreme_spec(acc, out, is_max, result):
    """max/min with the first index; NaN beats every number and the first NaN wins.
    result: 'value' (amax), 'both' (max_dim), 'index' (argmax), 'shift' (the
    logsumexp shift: the max, or 0 where it is infinite or the slice empty)."""
    acc_t, out_t = _NB[np.dtype(acc)], _NB[np.dtype(out)]

    def make():
        def beats(v, best):
            better = v > best if is_max else v < best
            return better or (v != v and best == best)
        beats = cuda.jit(device=True, inline=True)(beats)

        def identity():
            return acc_t(0), -1

        def step(acc, idx, v, k, c, p):
            w = acc_t(v)
            if idx < 0 or beats(w, acc):           # a loop in k order: strictly better only
                return w, k
            return acc, idx

        def combine(a, ai, b, bi):
            if bi < 0:
                return a, ai
            if ai < 0 or beats(b, a):
                return b, bi
            if beats(a, b) or ai < bi:             # a tie (equal, or both NaN): first index
                return a, ai
            return b, bi

        if result == "shift":
            def finish(acc, idx, count, c, p):
                if idx < 0 or acc == math.inf or acc == -math.inf:
                    return out_t(0)
                return out_t(acc)
        else:
            def finish(acc, idx, count, c, p): return out_t(acc)
        jit = cuda.jit(device=True, inline=True)
        return jit(identity), jit(step), jit(combine), jit(finish)

    return Spec(("max" if is_max else "min", result, np.dtype(acc).name, np.dtype(out).name),
                acc, out, make, writes_val=result != "index",
                writes_idx=result in ("both", "index"))


def _logical_spec(is_all):
    def make():
        def identity(): return nbt.int32(1 if is_all else 0), -1

        def step(acc, idx, v, k, c, p):
            return (acc & nbt.int32(v != 0)) if is_all else (acc | nbt.int32(v != 0)), idx

        def combine(a, ai, b, bi): return (a & b) if is_all else (a | b), ai

        def finish(acc, idx, count, c, p): return acc != 0
        jit = cuda.jit(device=True, inline=True)
        return jit(identity), jit(step), jit(combine), jit(finish)
    return Spec(("all" if is_all else "any",), np.int32, np.bool_, make)


# ------------------------------------------------------------------ kernel templates
def kernel_function(spec, shape, partial=False):
    """The plain Python kernel of ``spec`` for kernel shape 'row', 'column' or
    'combine' (not yet ``cuda.jit``-ed; ``compile_ptx`` takes this).  ``partial``:
    write raw states to scratch (a split reduction) instead of results."""
    identity, step, combine, finish = spec.make()
    warp_reduce = _warp_reduce_function(combine)
    offset = _offset_function()
    acc_t = _NB[spec.acc]
    uses_center, writes_val, writes_idx = spec.uses_center, spec.writes_val, spec.writes_idx

    if shape == "row":
        def row_kernel(x, x_off, kept_shape, kept_st, red_shape, red_st, n_out, n_red,
                       splits, chunk, count, param, center, out_val, out_idx):
            tx = cuda.threadIdx.x
            ty = cuda.threadIdx.y
            T = cuda.blockDim.x
            R = cuda.blockDim.y
            lane = tx % WARP
            warp = (ty * T + tx) // WARP
            warps_per_row = T // WARP
            s_acc = cuda.shared.array(WARP, acc_t)
            s_idx = cuda.shared.array(WARP, nbt.int64)
            n_virtual = n_out * splits
            for base in range(cuda.blockIdx.x * R, n_virtual, cuda.gridDim.x * R):
                v = base + ty                      # (result o, split s) = divmod(v, splits)
                o = v // splits
                acc, idx = identity()
                c = center[o] if uses_center and v < n_virtual else center[0]
                if v < n_virtual:
                    p0 = x_off + offset(o, kept_shape, kept_st)
                    k_lo = (v - o * splits) * chunk
                    k_hi = min(k_lo + chunk, n_red)
                    for k in range(k_lo + tx, k_hi, T):
                        acc, idx = step(acc, idx, x[p0 + offset(k, red_shape, red_st)], k,
                                        c, param)
                acc, idx = warp_reduce(acc, idx)
                if warps_per_row > 1:              # block-uniform
                    if lane == 0:
                        s_acc[warp] = acc
                        s_idx[warp] = idx
                    cuda.syncthreads()
                    if lane < warps_per_row:
                        acc = s_acc[ty * warps_per_row + lane]
                        idx = s_idx[ty * warps_per_row + lane]
                    else:
                        acc, idx = identity()
                    acc, idx = warp_reduce(acc, idx)   # every warp, so shuffles stay uniform
                    cuda.syncthreads()
                if tx == 0 and v < n_virtual:
                    if partial:
                        out_val[v] = acc
                        out_idx[v] = idx
                    else:
                        if writes_val:
                            out_val[o] = finish(acc, idx, count, c, param)
                        if writes_idx:
                            out_idx[o] = idx
        return row_kernel

    if shape == "column":
        def column_kernel(x, x_off, kept_shape, kept_st, red_shape, red_st, n_out, n_red,
                          splits, chunk, count, param, center, out_val, out_idx):
            tx = cuda.threadIdx.x
            ty = cuda.threadIdx.y
            NY = cuda.blockDim.y
            s_acc = cuda.shared.array((COL_ROWS, WARP), acc_t)
            s_idx = cuda.shared.array((COL_ROWS, WARP), nbt.int64)
            n_groups = (n_out + WARP - 1) // WARP
            for g in range(cuda.blockIdx.x, n_groups * splits, cuda.gridDim.x):
                group = g // splits
                s = g - group * splits
                o = group * WARP + tx
                acc, idx = identity()
                c = center[o] if uses_center and o < n_out else center[0]
                if o < n_out:
                    p0 = x_off + offset(o, kept_shape, kept_st)
                    k_lo = s * chunk
                    k_hi = min(k_lo + chunk, n_red)
                    for k in range(k_lo + ty, k_hi, NY):
                        acc, idx = step(acc, idx, x[p0 + offset(k, red_shape, red_st)], k,
                                        c, param)
                s_acc[ty, tx] = acc
                s_idx[ty, tx] = idx
                cuda.syncthreads()
                if ty == 0 and o < n_out:
                    for j in range(1, NY):
                        acc, idx = combine(acc, idx, s_acc[j, tx], s_idx[j, tx])
                    if partial:
                        out_val[o * splits + s] = acc
                        out_idx[o * splits + s] = idx
                    else:
                        if writes_val:
                            out_val[o] = finish(acc, idx, count, c, param)
                        if writes_idx:
                            out_idx[o] = idx
                cuda.syncthreads()
        return column_kernel

    if shape == "combine":
        def combine_kernel(part_val, part_idx, n_out, splits, count, param, center,
                           out_val, out_idx):
            tx = cuda.threadIdx.x
            R = cuda.blockDim.y
            for base in range(cuda.blockIdx.x * R, n_out, cuda.gridDim.x * R):
                o = base + cuda.threadIdx.y
                acc, idx = identity()
                if o < n_out:
                    for s in range(tx, splits, WARP):
                        acc, idx = combine(acc, idx, part_val[o * splits + s],
                                           part_idx[o * splits + s])
                acc, idx = warp_reduce(acc, idx)
                if tx == 0 and o < n_out:
                    c = center[o] if uses_center else center[0]
                    if writes_val:
                        out_val[o] = finish(acc, idx, count, c, param)
                    if writes_idx:
                        out_idx[o] = idx
        return combine_kernel
    raise ValueError(f"kernel shape must be 'row', 'column' or 'combine', got {shape!r}")


def kernel_signature(spec, shape, in_dtype=None, partial=False, kept_ndim=1, red_ndim=1):
    """numba argument types of ``kernel_function(spec, shape, partial)``."""
    acc = _NB[spec.acc][::1]
    i64 = nbt.int64
    out_val = acc if partial else _NB[spec.out][::1]
    center = acc
    if shape == "combine":
        return (acc, i64[::1], i64, i64, i64, nbt.float64, center, _NB[spec.out][::1],
                i64[::1])
    x = _NB[np.dtype(in_dtype)][::1]
    kept, red = nbt.UniTuple(i64, kept_ndim), nbt.UniTuple(i64, red_ndim)
    return (x, i64, kept, kept, red, red, i64, i64, i64, i64, i64, nbt.float64, center,
            out_val, i64[::1])


_kernels = {}


def _kernel(spec, shape, partial=False):
    key = (spec.key, shape, partial)
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = cuda.jit(kernel_function(spec, shape, partial))
    return k


# ------------------------------------------------------------------ host side
def _input(x, what="x"):
    """(span, element offset, shape, element strides) of a device array."""
    shape, strides, dtype = layout.describe(x)
    if dtype not in _INPUT_DTYPES and dtype != np.uint8:
        raise TypeError(f"{what}: no CUDA reduction kernel for dtype {dtype}; supported: "
                        f"{[str(d) for d in _INPUT_DTYPES]}")
    if any(s % dtype.itemsize for s in strides):
        raise ValueError(f"{what}: byte strides {strides} are not multiples of the item "
                         f"size {dtype.itemsize}")
    el = tuple(s // dtype.itemsize for s in strides)
    if math.prod(shape) == 0:                  # nothing is read: any 1-element array will do
        return empty((1,), dtype, x), 0, tuple(shape), el
    span, off = layout.span(x, shape, strides, dtype)
    if isinstance(span, np.ndarray):           # simulator: copy in only (may be read-only)
        span = cuda.In(span)
    return span, off, tuple(shape), el


def _merge(dims):
    """(shape, strides) of [(size, stride)] with size-1 dims dropped and neighbours
    contiguous in memory merged; at least one dim (size 1, stride 0)."""
    dims = [(n, s) for n, s in dims if n != 1]
    merged = []
    for n, s in dims:
        if merged and merged[-1][1] == s * n:
            merged[-1] = (merged[-1][0] * n, s)
        else:
            merged.append((n, s))
    if not merged:
        merged = [(1, 0)]
    return tuple(n for n, _ in merged), tuple(s for _, s in merged)


def _check_dims(dims, ndim, op):
    if not isinstance(dims, tuple) or \
            not all(isinstance(d, (int, np.integer)) and 0 <= d < builtins_max(ndim, 1)
                    for d in dims):
        raise ValueError(f"{op}: dims must be a tuple of dims in [0, {ndim}), got {dims!r}")
    if ndim == 0 and dims:
        dims = ()
    return tuple(sorted(set(int(d) for d in dims)))


def _use_column(n_out, n_red, kept_st, red_st):
    """The column kernel when results lie closer together in memory than reduced
    elements (a warp then loads 32 neighbouring results' elements at once), or
    when rows are so short that a warp per row would mostly idle."""
    return n_out > 1 and (n_red <= SHORT_ROW or
                          builtins_min(map(abs, kept_st)) < builtins_min(map(abs, red_st)))


def _plan(n_out, n_red, column):
    """(splits, chunk, blocks, threads) of a reduction."""
    if column:
        groups = -(-n_out // WARP)
        splits = 1
        if groups < TARGET_BLOCKS and n_red > COL_SPLIT_CHUNK:
            splits = builtins_min(-(-n_red // COL_SPLIT_CHUNK), -(-TARGET_BLOCKS // groups),
                                  MAX_SPLITS)
        chunk = -(-n_red // splits) if n_red else 0
        splits = -(-n_red // chunk) if chunk else 1
        ny = builtins_max(1, builtins_min(COL_ROWS, -(-chunk // COL_PER_THREAD)))
        if simulated():  # few simulated threads per launch (see _memory.SIM_THREADS)
            return splits, chunk, builtins_min(groups * splits, SIM_MAX_BLOCKS), (WARP, 2)
        return splits, chunk, builtins_min(groups * splits, MAX_BLOCKS), (WARP, ny)
    splits = 1
    if n_out < TARGET_BLOCKS and n_red > SPLIT_CHUNK:
        splits = builtins_min(-(-n_red // SPLIT_CHUNK), -(-TARGET_BLOCKS // n_out), MAX_SPLITS)
    chunk = -(-n_red // splits) if n_red else 0
    splits = -(-n_red // chunk) if chunk else 1
    n_virtual = n_out * splits
    if chunk > WARP_ROW_MAX:
        threads = (ROW_THREADS, 1)
    else:
        threads = (WARP, builtins_min(ROWS_PER_BLOCK, n_virtual))
    if simulated():     # few simulated threads per launch (see _memory.SIM_THREADS)
        threads = (2 * WARP, 1) if chunk > WARP_ROW_MAX else (WARP, 2)   # both kernel paths
        return (splits, chunk, builtins_min(-(-n_virtual // threads[1]), SIM_MAX_BLOCKS),
                threads)
    return splits, chunk, builtins_min(-(-n_virtual // threads[1]), MAX_BLOCKS), threads


def _reduce(spec, x, dims, *, center=None, param=0.0, op="reduce"):
    """Run ``spec`` over ``dims`` of device array ``x``.  Returns (values, indices)
    as flat arrays of the kept elements (C order), each None if not written."""
    span, off, shape, st = _input(x, op)
    dims = _check_dims(dims, len(shape), op)
    kept_shape, kept_st = _merge([(shape[d], st[d]) for d in range(len(shape))
                                  if d not in dims])
    red_shape, red_st = _merge([(shape[d], st[d]) for d in dims])
    n_out = math.prod(shape[d] for d in range(len(shape)) if d not in dims)
    n_red = math.prod(shape[d] for d in dims)
    out_val = empty((n_out,), spec.out, x) if spec.writes_val else None
    out_idx = empty((n_out,), np.int64, x) if spec.writes_idx else None
    if n_out == 0:
        return out_val, out_idx
    dummy_idx = out_idx if out_idx is not None else empty((1,), np.int64, x)
    dummy_val = out_val if out_val is not None else empty((1,), spec.out, x)
    if center is None:
        center = empty((1,), spec.acc, x)
    column = _use_column(n_out, n_red, kept_st, red_st)
    splits, chunk, blocks, threads = _plan(n_out, n_red, column)
    shape_name = "column" if column else "row"
    partial = splits > 1
    if partial:
        part_val = empty((n_out * splits,), spec.acc, x)
        part_idx = empty((n_out * splits,), np.int64, x)
        targets = (part_val, part_idx)
    else:
        targets = (dummy_val, dummy_idx)
    _kernel(spec, shape_name, partial)[blocks, threads, _stream()](
        span, off, kept_shape, kept_st, red_shape, red_st, n_out, n_red, splits, chunk,
        n_red, float(param), center, *targets)
    if partial:
        rows = builtins_min(ROWS_PER_BLOCK, n_out)
        _kernel(spec, "combine")[builtins_min(-(-n_out // rows), MAX_BLOCKS), (WARP, rows),
                                 _stream()](
            part_val, part_idx, n_out, splits, n_red, float(param), center, dummy_val,
            dummy_idx)
    return out_val, out_idx


def _array(x, op):
    """``x`` if it is a device array (NumPy under the simulator), else a TypeError."""
    try:
        dtype = layout.describe(x)[2]
    except TypeError as e:
        raise TypeError(f"{op}: {e}") from None
    if dtype not in _INPUT_DTYPES:
        raise TypeError(f"{op}: no CUDA reduction kernel for dtype {dtype}; supported: "
                        f"{[str(d) for d in _INPUT_DTYPES]}")
    return x


def _result_shape(shape, dims, keepdim):
    return tuple(1 if i in dims else n for i, n in enumerate(shape)
                 if keepdim or i not in dims)


def _float_acc(dtype, op):
    dtype = np.dtype(dtype)
    if dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"{op}: expected a float16/float32/float64 input, got {dtype}")
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _as_numeric(x):
    """Order bools as uint8 (the CPU kernel does the same)."""
    return x.view(np.uint8) if x.dtype == np.bool_ else x


def _extreme_acc(dtype):
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return np.dtype(np.float32)
    return dtype if dtype in (np.float32, np.float64) else np.dtype(np.int64)


def _check_3d(x3, op):
    if len(layout.describe(x3)[0]) != 3:
        raise ValueError(f"{op}: expected a 3-D (outer, n, inner) array, got shape "
                         f"{tuple(layout.describe(x3)[0])}")


# ------------------------------------------------------------------ registered kernels
_specs = {}


def _spec(key, build):
    s = _specs.get(key)
    if s is None:
        s = _specs[key] = build()
    return s


@register("sum", "cuda")
def sum_(x, dims, keepdim, out_dtype):
    """Sum over ``dims`` accumulated in ``out_dtype`` (int64 for integer results)."""
    _array(x, "sum")
    out_dtype = np.dtype(out_dtype)
    if out_dtype == np.bool_:                  # np.sum(dtype=bool): logical or
        spec = _spec(("nonzero_sum",), lambda: _sum_spec(np.int64, np.bool_, "nonzero_sum"))
    else:
        if out_dtype.kind not in "fiu":
            raise TypeError(f"sum: no CUDA kernel for out_dtype {out_dtype}")
        acc = np.dtype(np.float32) if out_dtype == np.float16 else \
            out_dtype if out_dtype.kind == "f" else np.dtype(np.int64)
        spec = _spec(("sum", acc, out_dtype), lambda: _sum_spec(acc, out_dtype, "sum"))
    vals, _ = _reduce(spec, x, dims, op="sum")
    return vals.reshape(_result_shape(x.shape, _check_dims(dims, x.ndim, "sum"), keepdim))


@register("mean", "cuda")
def mean(x, dims, keepdim):
    """sum / count in the input's float dtype (NaN for an empty reduction)."""
    _array(x, "mean")
    acc = _float_acc(x.dtype, "mean")
    out = np.dtype(x.dtype)
    spec = _spec(("mean", acc, out), lambda: _sum_spec(acc, out, "mean"))
    vals, _ = _reduce(spec, x, dims, op="mean")
    return vals.reshape(_result_shape(x.shape, _check_dims(dims, x.ndim, "mean"), keepdim))


@register("prod", "cuda")
def prod(x3, out_dtype):
    """Product over axis 1 of ``x3`` (outer, n, inner), float64/int64 accumulator."""
    _array(x3, "prod")
    _check_3d(x3, "prod")
    out_dtype = np.dtype(out_dtype)
    acc = np.dtype(np.float64 if out_dtype.kind == "f" else np.int64)
    spec = _spec(("prod", acc, out_dtype), lambda: _sum_spec(acc, out_dtype, "prod"))
    vals, _ = _reduce(spec, _as_numeric(x3), (1,), op="prod")
    return vals.reshape(x3.shape[0], x3.shape[2])


def _extreme_values(x, dims, keepdim, is_max, op):
    _array(x, op)
    xn = _as_numeric(x)
    acc = _extreme_acc(xn.dtype)
    spec = _spec((op, acc, xn.dtype), lambda: _extreme_spec(acc, xn.dtype, is_max, "value"))
    dims = _check_dims(dims, x.ndim, op)
    if x.size == 0 and any(x.shape[d] == 0 for d in dims):
        raise ValueError(f"{op}: cannot reduce an empty dim (no identity)")
    vals, _ = _reduce(spec, xn, dims, op=op)
    return vals.view(x.dtype).reshape(_result_shape(x.shape, dims, keepdim))


@register("amax", "cuda")
def amax(x, dims, keepdim):
    """NaN-propagating max over ``dims``."""
    return _extreme_values(x, dims, keepdim, True, "amax")


@register("amin", "cuda")
def amin(x, dims, keepdim):
    return _extreme_values(x, dims, keepdim, False, "amin")


@register("var", "cuda")
def var(x, dims, correction, keepdim):
    """Two-pass variance: the mean per result, then sum((x - mean)^2) / max(n - correction, 0)."""
    _array(x, "var")
    acc = _float_acc(x.dtype, "var")
    dims = _check_dims(dims, x.ndim, "var")
    count = math.prod(x.shape[d] for d in dims)
    mean_spec = _spec(("mean", acc, acc), lambda: _sum_spec(acc, acc, "mean"))
    mu, _ = _reduce(mean_spec, x, dims, op="var")
    spec = _spec(("sqdev", acc, x.dtype), lambda: _sum_spec(acc, x.dtype, "sqdev"))
    vals, _ = _reduce(spec, x, dims, center=mu, param=builtins_max(count - correction, 0),
                      op="var")
    return vals.reshape(_result_shape(x.shape, dims, keepdim))


@register("norm", "cuda")
def norm(x3, p):
    """Vector p-norm over axis 1 of ``x3`` (outer, n, inner) for a finite p."""
    _array(x3, "norm")
    _check_3d(x3, "norm")
    dtype = np.dtype(x3.dtype)
    _float_acc(dtype, "norm")
    if not np.isfinite(p):
        raise ValueError(f"norm: p must be finite (the inf norms are amax/amin), got {p}")
    if p == 2:
        key, acc = "norm2", np.dtype(np.float64)
    elif p == 1:
        key, acc = "norm1", np.dtype(np.float64)
    elif p == 0:
        key, acc = "norm0", _float_acc(dtype, "norm")
    else:
        key, acc = "normp", _float_acc(dtype, "norm")
    spec = _spec((key, acc, dtype), lambda: _sum_spec(acc, dtype, key))
    vals, _ = _reduce(spec, x3, (1,), param=float(p), op="norm")
    return vals.reshape(x3.shape[0], x3.shape[2])


@register("all", "cuda")
def all_(x, dims, keepdim):
    _array(x, "all")
    vals, _ = _reduce(_spec(("all",), lambda: _logical_spec(True)), x, dims, op="all")
    return vals.reshape(_result_shape(x.shape, _check_dims(dims, x.ndim, "all"), keepdim))


@register("any", "cuda")
def any_(x, dims, keepdim):
    _array(x, "any")
    vals, _ = _reduce(_spec(("any",), lambda: _logical_spec(False)), x, dims, op="any")
    return vals.reshape(_result_shape(x.shape, _check_dims(dims, x.ndim, "any"), keepdim))


def _extreme(x3, is_max, result, op):
    _array(x3, op)
    _check_3d(x3, op)
    if x3.shape[1] == 0:
        raise ValueError(f"{op}: cannot reduce an empty dim (n = 0)")
    xn = _as_numeric(x3)
    acc = _extreme_acc(xn.dtype)
    spec = _spec((op, acc, xn.dtype), lambda: _extreme_spec(acc, xn.dtype, is_max, result))
    vals, idx = _reduce(spec, xn, (1,), op=op)
    shape = (x3.shape[0], x3.shape[2])
    return (None if vals is None else vals.view(x3.dtype).reshape(shape)), idx.reshape(shape)


@register("max_dim", "cuda")
def max_dim(x3):
    """(values, first indices) of the max over axis 1 of ``x3`` (outer, n, inner); n > 0."""
    return _extreme(x3, True, "both", "max_dim")


@register("min_dim", "cuda")
def min_dim(x3):
    return _extreme(x3, False, "both", "min_dim")


@register("argmax", "cuda")
def argmax(x3):
    return _extreme(x3, True, "index", "argmax")[1]


@register("argmin", "cuda")
def argmin(x3):
    return _extreme(x3, False, "index", "argmin")[1]


@register("logsumexp", "cuda")
def logsumexp(x, dims, keepdim):
    """shift + log(sum(exp(x - shift))), shift = the max (0 where it is infinite):
    one launch for the shift, one for the sum (-inf for an empty or all -inf slice)."""
    _array(x, "logsumexp")
    acc = _float_acc(x.dtype, "logsumexp")
    dims = _check_dims(dims, x.ndim, "logsumexp")
    shift_spec = _spec(("lse_shift", acc), lambda: _extreme_spec(acc, acc, True, "shift"))
    shift, _ = _reduce(shift_spec, x, dims, op="logsumexp")
    spec = _spec(("expdev", acc, x.dtype), lambda: _sum_spec(acc, x.dtype, "expdev"))
    vals, _ = _reduce(spec, x, dims, center=shift, op="logsumexp")
    return vals.reshape(_result_shape(x.shape, dims, keepdim))


def kernel_specs():
    """(label, spec, input dtype) of every reduction spec the registered kernels
    build for the dtypes the op layer passes them (for PTX compilation tests)."""
    f32, f64, i32, i64, u8, b = (np.dtype(t) for t in
                                 (np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_))
    cases = [("sum f32", _sum_spec(f32, f32, "sum"), f32),
             ("sum f64", _sum_spec(f64, f64, "sum"), f64),
             ("sum i32->i64", _sum_spec(i64, i64, "sum"), i32),
             ("sum bool->i64", _sum_spec(i64, i64, "sum"), b),
             ("sum f16->f32", _sum_spec(f32, f32, "sum"), np.dtype(np.float16)),
             ("sum ->bool", _sum_spec(i64, b, "nonzero_sum"), i64),
             ("mean f32", _sum_spec(f32, f32, "mean"), f32),
             ("mean f64", _sum_spec(f64, f64, "mean"), f64),
             ("prod f32", _sum_spec(f64, f32, "prod"), f32),
             ("prod bool->i64", _sum_spec(i64, i64, "prod"), u8),
             ("var sqdev f32", _sum_spec(f32, f32, "sqdev"), f32),
             ("var sqdev f64", _sum_spec(f64, f64, "sqdev"), f64),
             ("logsumexp expdev f32", _sum_spec(f32, f32, "expdev"), f32),
             ("logsumexp shift f64", _extreme_spec(f64, f64, True, "shift"), f64),
             ("all f32", _logical_spec(True), f32),
             ("any bool", _logical_spec(False), b)]
    for kind in ("norm2", "norm1", "norm0", "normp"):
        acc = f64 if kind in ("norm2", "norm1") else f32
        cases.append((f"norm {kind} f32", _sum_spec(acc, f32, kind), f32))
    cases.append(("norm normp f64", _sum_spec(f64, f64, "normp"), f64))
    extremes = [("amax", True, "value", f32), ("amin", False, "value", i64),
                ("min_dim", False, "both", f64), ("argmax", True, "index", f32),
                ("argmin", False, "index", i64)]
    extremes += [("max_dim", True, "both", dtype) for dtype in (f32, f64, i32, i64, u8)]
    for op, is_max, result, dtype in extremes:
        acc = _extreme_acc(dtype)
        cases.append((f"{op} {dtype}", _extreme_spec(acc, dtype, is_max, result), dtype))
    return cases


# ------------------------------------------------------------------ cumsum
def scan_kernel_function(acc_dtype, out_dtype, shape):
    """Plain Python cumsum kernel: shape 'row' (a block per row) or 'column'
    (a thread per row)."""
    acc_t, out_t = _NB[np.dtype(acc_dtype)], _NB[np.dtype(out_dtype)]

    if shape == "column":
        def column_scan(x, x_off, s0, s1, s2, outer, n, inner, reverse, out):
            for r in range(cuda.grid(1), outer * inner, cuda.gridsize(1)):
                o = r // inner
                i = r - o * inner
                p0 = x_off + o * s0 + i * s2
                q0 = o * n * inner + i
                total = acc_t(0)
                for j in range(n):
                    k = n - 1 - j if reverse else j
                    total += acc_t(x[p0 + k * s1])
                    out[q0 + k * inner] = out_t(total)
        return column_scan

    if shape == "row":
        def row_scan(x, x_off, s0, s1, s2, outer, n, inner, reverse, out):
            tx = cuda.threadIdx.x
            T = cuda.blockDim.x
            lane = tx % WARP
            warp = tx // WARP
            n_warps = T // WARP
            s_tot = cuda.shared.array(WARP, acc_t)
            for r in range(cuda.blockIdx.x, outer * inner, cuda.gridDim.x):
                o = r // inner
                i = r - o * inner
                p0 = x_off + o * s0 + i * s2
                q0 = o * n * inner + i
                carry = acc_t(0)
                for base in range(0, n, T):        # block-uniform chunks of T elements
                    j = base + tx
                    k = n - 1 - j if reverse else j
                    v = acc_t(x[p0 + k * s1]) if j < n else acc_t(0)
                    delta = 1                      # inclusive scan within the warp
                    while delta < WARP:
                        y = cuda.shfl_up_sync(FULL_MASK, v, delta)
                        if lane >= delta:
                            v += y
                        delta *= 2
                    if lane == WARP - 1:
                        s_tot[warp] = v
                    cuda.syncthreads()
                    t = s_tot[lane] if lane < n_warps else acc_t(0)
                    delta = 1                      # every warp scans the warp totals
                    while delta < WARP:
                        y = cuda.shfl_up_sync(FULL_MASK, t, delta)
                        if lane >= delta:
                            t += y
                        delta *= 2
                    cuda.syncthreads()
                    if warp == 0 and lane < n_warps:
                        s_tot[lane] = t            # inclusive prefix of warp totals
                    cuda.syncthreads()
                    if warp > 0:
                        v += s_tot[warp - 1]
                    if j < n:
                        out[q0 + k * inner] = out_t(carry + v)
                    carry += s_tot[n_warps - 1]
                    cuda.syncthreads()
        return row_scan
    raise ValueError(f"scan shape must be 'row' or 'column', got {shape!r}")


def scan_kernel_signature(in_dtype, out_dtype):
    i64 = nbt.int64
    return (_NB[np.dtype(in_dtype)][::1], i64, i64, i64, i64, i64, i64, i64, nbt.boolean,
            _NB[np.dtype(out_dtype)][::1])


def _scan_kernel(acc, out, shape):
    key = ("cumsum", acc, out, shape)
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = cuda.jit(scan_kernel_function(acc, out, shape))
    return k


@register("cumsum", "cuda")
def cumsum(x3, out_dtype, reverse=False):
    """Inclusive prefix sums along axis 1 of ``x3`` (suffix sums if ``reverse``)."""
    _array(x3, "cumsum")
    _check_3d(x3, "cumsum")
    out_dtype = np.dtype(out_dtype)
    if out_dtype.kind not in "fiu":
        raise TypeError(f"cumsum: no CUDA kernel for out_dtype {out_dtype}")
    acc = np.dtype(np.float64 if out_dtype.kind == "f" else np.int64)
    xn = _as_numeric(x3)
    span, off, shape, (s0, s1, s2) = _input(xn, "cumsum")
    outer, n, inner = shape
    out = empty(shape, out_dtype, x3)
    rows = outer * inner
    if rows * n == 0:
        return out
    max_blocks = SIM_MAX_BLOCKS if simulated() else MAX_BLOCKS
    if inner == 1 and n >= ROW_SCAN_MIN:
        threads = builtins_min(ROW_THREADS, -(-n // WARP) * WARP)
        _scan_kernel(acc, out_dtype, "row")[builtins_min(rows, max_blocks), threads, _stream()](
            span, off, s0, s1, s2, outer, n, inner, bool(reverse), out.reshape(-1))
    else:
        threads = WARP if simulated() else builtins_min(ROW_THREADS, -(-rows // WARP) * WARP)
        blocks = builtins_min(-(-rows // threads), max_blocks)
        _scan_kernel(acc, out_dtype, "column")[blocks, threads, _stream()](
            span, off, s0, s1, s2, outer, n, inner, bool(reverse), out.reshape(-1))
    return out
