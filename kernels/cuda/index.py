"""Gather / scatter kernels behind indexing, ``gather``, ``scatter(_add)``,
``index_add``, ``index_select`` and ``x[idx]`` (CUDA counterparts of
``kernels/cpu/index.py``, same signatures).

The 3-axis kernels see arrays folded to ``(outer, dim, inner)`` as on the CPU,
but read and write them through element strides, so non-contiguous inputs and
in-place targets work too.  One thread per index element (grid-stride loops).

Index checking happens before launch: a GPU kernel that meets an index out of
range reads or writes someone else's memory silently.  ``check_range`` runs a
min/max reduction over the index table (grid-stride, then a shared-memory tree
per block, then one atomic min and max per block) and the host reads back the
two numbers: one extra small kernel and one device->host sync per call, the
price of a clear ``IndexError`` instead of memory corruption.  The messages are
those of the op that validates the same thing on the CPU (``gather(): index 5
is out of bounds ...``); ``index`` / ``index_select`` follow NumPy's rules
(negative indices wrap, like ``np.take``).

Accumulating scatters (``scatter(..., accumulate=True)``, ``index_add``) use
``cuda.atomic.add`` (float32, float64, int32, int64), so duplicate indices sum
correctly, in an unspecified order (float sums may differ from the CPU's in
the last bits).  bool "sums" are logical or, done with plain stores of True
(every writer writes the same value).  A plain ``scatter`` with duplicate
indices keeps one of the written values, not necessarily the last (PyTorch
documents the same for CUDA).
"""
import numpy as np
from numba import cuda

from ..registry import register
from ._memory import (empty, is_device_array, is_host_array, launch_config, simulated, stream,
                      to_device, to_host)
from .copy import contiguous, copy_into, describe, operand, pad_dims, read_only, size_of

_INT64_MAX = np.int64(np.iinfo(np.int64).max)
_INT64_MIN = np.int64(np.iinfo(np.int64).min)
_REDUCE_THREADS = 128        # a power of two: the shared-memory tree halves it
_MAX_REDUCE_BLOCKS = 1024
_ATOMIC_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64))
_BOOL = np.dtype(np.bool_)

CHECK_INDICES = True         # False skips check_range (and its device->host sync)


# ------------------------------------------------------------------ range check
def _minmax_rows(table, n, res):
    """res[2r], res[2r+1] = min, max of table[r*n:(r+1)*n]; blockIdx.y = r."""
    lo_s = cuda.shared.array(_REDUCE_THREADS, np.int64)
    hi_s = cuda.shared.array(_REDUCE_THREADS, np.int64)
    row = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    lo = _INT64_MAX
    hi = _INT64_MIN
    base = row * n
    for j in range(cuda.blockIdx.x * cuda.blockDim.x + tid, n,
                   cuda.gridDim.x * cuda.blockDim.x):
        v = table[base + j]
        lo = min(lo, v)
        hi = max(hi, v)
    lo_s[tid] = lo
    hi_s[tid] = hi
    cuda.syncthreads()
    step = cuda.blockDim.x // 2
    while step > 0:
        if tid < step:
            lo_s[tid] = min(lo_s[tid], lo_s[tid + step])
            hi_s[tid] = max(hi_s[tid], hi_s[tid + step])
        cuda.syncthreads()
        step //= 2
    if tid == 0:
        cuda.atomic.min(res, 2 * row, lo_s[0])
        cuda.atomic.max(res, 2 * row + 1, hi_s[0])


def minmax_rows(table):
    """Host copy (rows, 2) of each row's (min, max) of a C-contiguous int64
    (rows, n) device array, n >= 1."""
    rows, n = describe(table)[0]
    init = np.empty((rows, 2), np.int64)
    init[:, 0], init[:, 1] = _INT64_MAX, _INT64_MIN
    res = to_device(init.reshape(-1), table)
    # Any power of two up to _REDUCE_THREADS works; the simulator pays an OS
    # thread per CUDA thread (and a barrier per tree level), so it gets 32.
    threads = 32 if simulated() else _REDUCE_THREADS
    blocks = min(-(-n // threads), _MAX_REDUCE_BLOCKS)
    _jit("minmax_rows")[(blocks, rows), threads, stream()](
        read_only(table.reshape(-1)), n, res)
    return to_host(res).reshape(rows, 2)


def check_range(idx, size, op, negative=False, axis=None):
    """Raise IndexError unless every element of the contiguous int64 device array
    ``idx`` lies in [0, size) (or [-size, size) with ``negative``, NumPy's rule)."""
    n = size_of(idx)
    if not CHECK_INDICES or n == 0:
        return
    lo, hi = (int(v) for v in minmax_rows(idx.reshape(1, n))[0])
    low = -size if negative else 0
    if lo < low or hi >= size:
        bad = hi if hi >= size else lo
        if axis is not None:     # NumPy's message (np.take / fancy indexing)
            raise IndexError(f"index {bad} is out of bounds for axis {axis} with size {size}")
        raise IndexError(f"{op}(): index {bad} is out of bounds for dimension with size {size}")


def on_device(a, like):
    """``a`` on ``like``'s device: a host NumPy array is copied over when ``like``
    is a GPU array (ops may hand index arrays built on the host)."""
    if is_host_array(a) and is_device_array(like):
        return to_device(np.ascontiguousarray(a), like)
    return a


def device_index(idx, like):
    """``idx`` as a C-contiguous int64 array on ``like``'s device (converted or
    copied only when needed)."""
    return contiguous(on_device(idx, like), np.int64)


# ------------------------------------------------------------------ 3-axis kernels
def _gather3(out, src, s_off, s_st, idx, shape):
    """out[o, j, i] = src[o, idx[o, j, i], i]; out and idx C-contiguous of ``shape``."""
    n_j = shape[1]
    n_i = shape[2]
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i = t % n_i
        oj = t // n_i
        o = oj // n_j
        out[t] = src[s_off + o * s_st[0] + idx[t] * s_st[1] + i * s_st[2]]


def _scatter3(dst, d_off, d_st, idx, src, s_off, s_st, shape):
    """dst[o, idx[o, j, i], i] = src[o, j, i] over idx's ``shape``."""
    n_j = shape[1]
    n_i = shape[2]
    for t in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        i = t % n_i
        oj = t // n_i
        o = oj // n_j
        j = oj - o * n_j
        dst[d_off + o * d_st[0] + idx[t] * d_st[1] + i * d_st[2]] = \
            src[s_off + o * s_st[0] + j * s_st[1] + i * s_st[2]]


def _scatter3_add(dst, d_off, d_st, idx, src, s_off, s_st, shape):
    n_j = shape[1]
    n_i = shape[2]
    for t in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        i = t % n_i
        oj = t // n_i
        o = oj // n_j
        j = oj - o * n_j
        cuda.atomic.add(dst, d_off + o * d_st[0] + idx[t] * d_st[1] + i * d_st[2],
                        src[s_off + o * s_st[0] + j * s_st[1] + i * s_st[2]])


def _scatter3_or(dst, d_off, d_st, idx, src, s_off, s_st, shape):
    n_j = shape[1]
    n_i = shape[2]
    for t in range(cuda.grid(1), idx.size, cuda.gridsize(1)):
        i = t % n_i
        oj = t // n_i
        o = oj // n_j
        j = oj - o * n_j
        if src[s_off + o * s_st[0] + j * s_st[1] + i * s_st[2]]:
            dst[d_off + o * d_st[0] + idx[t] * d_st[1] + i * d_st[2]] = True


def _index_add3(dst, d_off, d_st, idx, src, s_off, s_st, shape):
    """dst[o, idx[j], i] += src[o, j, i] over src's ``shape`` (atomic)."""
    n_j = shape[1]
    n_i = shape[2]
    n = shape[0] * n_j * n_i
    for t in range(cuda.grid(1), n, cuda.gridsize(1)):
        i = t % n_i
        oj = t // n_i
        o = oj // n_j
        j = oj - o * n_j
        cuda.atomic.add(dst, d_off + o * d_st[0] + idx[j] * d_st[1] + i * d_st[2],
                        src[s_off + o * s_st[0] + j * s_st[1] + i * s_st[2]])


def _index_add3_or(dst, d_off, d_st, idx, src, s_off, s_st, shape):
    n_j = shape[1]
    n_i = shape[2]
    n = shape[0] * n_j * n_i
    for t in range(cuda.grid(1), n, cuda.gridsize(1)):
        i = t % n_i
        oj = t // n_i
        o = oj // n_j
        j = oj - o * n_j
        if src[s_off + o * s_st[0] + j * s_st[1] + i * s_st[2]]:
            dst[d_off + o * d_st[0] + idx[j] * d_st[1] + i * d_st[2]] = True


# ------------------------------------------------------------------ advanced indexing
def _advanced_gather(out, src, src_off, shape, src_st, b_st, table, nb, adv_size, adv_st):
    """out (C-contiguous, ``shape``) = src[key]: each out dim either walks a
    sliced src dim (``src_st``) or a dim of the broadcast index shape
    (``b_st``: C strides into a row of ``table``); row k of ``table`` indexes the
    src dim of size ``adv_size[k]`` and stride ``adv_st[k]`` (negatives wrap)."""
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        rem = t
        p = src_off
        b = 0
        for d in range(len(shape) - 1, -1, -1):
            q = rem // shape[d]
            j = rem - q * shape[d]
            rem = q
            p += j * src_st[d]
            b += j * b_st[d]
        for k in range(len(adv_size)):
            v = table[k * nb + b]
            if v < 0:
                v += adv_size[k]
            p += v * adv_st[k]
        out[t] = src[p]


KERNEL_FUNCTIONS = {"minmax_rows": _minmax_rows, "gather3": _gather3, "scatter3": _scatter3,
                    "scatter3_add": _scatter3_add, "scatter3_or": _scatter3_or,
                    "index_add3": _index_add3, "index_add3_or": _index_add3_or,
                    "advanced_gather": _advanced_gather}
_jitted = {}


def _jit(name):
    k = _jitted.get(name)
    if k is None:
        k = _jitted[name] = cuda.jit(KERNEL_FUNCTIONS[name])
    return k


def _launch(name, n, *args):
    blocks, threads = launch_config(n)
    _jit(name)[blocks, threads, stream()](*args)


def _check3(op, arrays):
    for name, a in arrays:
        shape = describe(a)[0]
        if len(shape) != 3:
            raise ValueError(f"{op}: '{name}' must be folded to 3 axes (outer, dim, inner), "
                             f"got shape {tuple(shape)}")


def _accumulate_kernel(op, dtype, name):
    if dtype == _BOOL:
        return name + "_or"
    if dtype not in _ATOMIC_DTYPES:
        raise TypeError(f"{op}: no CUDA atomic add for dtype {dtype}; supported: "
                        f"{[str(d) for d in _ATOMIC_DTYPES]} and bool")
    return name + ("_add" if name == "scatter3" else "")


# ------------------------------------------------------------------ registered kernels
@register("gather", "cuda")
def gather(src3, idx3):
    """out[o, j, i] = src3[o, idx3[o, j, i], i]; idx3 int64 in [0, src3.shape[1])."""
    _check3("gather", [("src3", src3), ("idx3", idx3)])
    idx = device_index(idx3, src3)
    shape = tuple(describe(idx)[0])
    s_shape, _, dtype = describe(src3)
    if s_shape[0] < shape[0] or s_shape[2] < shape[2]:
        raise ValueError(f"gather: index of shape {shape} is larger than src3 "
                         f"{tuple(s_shape)} outside dimension 1")
    out = empty(shape, dtype, src3)
    if size_of(out) == 0:
        return out
    check_range(idx, s_shape[1], "gather")
    s_view, s_off, s_st = operand(src3, what="src3")
    _launch("gather3", size_of(out), out.reshape(-1), read_only(s_view), s_off, tuple(s_st),
            read_only(idx.reshape(-1)), shape)
    return out


@register("scatter", "cuda")
def scatter(dst3, idx3, src3, accumulate):
    """dst3[o, idx3[o, j, i], i] (+)= src3[o, j, i], in place on ``dst3``."""
    _check3("scatter", [("dst3", dst3), ("idx3", idx3), ("src3", src3)])
    idx = device_index(idx3, dst3)
    shape = tuple(describe(idx)[0])
    if size_of(idx) == 0:
        return dst3
    d_shape, _, d_dtype = describe(dst3)
    s_shape = describe(src3)[0]
    if any(s < i for s, i in zip(s_shape, shape)) or any(
            d < i for k, (d, i) in enumerate(zip(d_shape, shape)) if k != 1):
        raise ValueError(f"scatter: index of shape {shape} is larger than src3 "
                         f"{tuple(s_shape)} or dst3 {tuple(d_shape)} outside dimension 1")
    check_range(idx, d_shape[1], "scatter_add" if accumulate else "scatter")
    name = _accumulate_kernel("scatter", d_dtype, "scatter3") if accumulate else "scatter3"
    d_view, d_off, d_st = operand(dst3, what="dst3")
    s_view, s_off, s_st = operand(src3, what="src3")
    _launch(name, size_of(idx), d_view, d_off, tuple(d_st), read_only(idx.reshape(-1)),
            read_only(s_view), s_off, tuple(s_st), shape)
    return dst3


@register("index_add", "cuda")
def index_add(dst3, idx1, src3):
    """dst3[o, idx1[j], i] += src3[o, j, i], in place; duplicates accumulate."""
    _check3("index_add", [("dst3", dst3), ("src3", src3)])
    idx = device_index(idx1, dst3).reshape(-1)
    d_shape, _, d_dtype = describe(dst3)
    s_shape = tuple(describe(src3)[0])
    if s_shape[1] != size_of(idx) or s_shape[0] != d_shape[0] or s_shape[2] != d_shape[2]:
        raise ValueError(f"index_add: src3 of shape {s_shape} does not match dst3 "
                         f"{tuple(d_shape)} and an index of {size_of(idx)} elements")
    if size_of(src3) == 0:
        return dst3
    check_range(idx, d_shape[1], "index_add")
    name = _accumulate_kernel("index_add", d_dtype, "index_add3")
    d_view, d_off, d_st = operand(dst3, what="dst3")
    s_view, s_off, s_st = operand(src3, what="src3")
    _launch(name, size_of(src3), d_view, d_off, tuple(d_st), read_only(idx), read_only(s_view),
            s_off, tuple(s_st), s_shape)
    return dst3


def _advanced(src, key):
    """``src[key]`` for a key of full slices and int64 arrays (NumPy's placement rule)."""
    shape, _, dtype = describe(src)
    shape = tuple(shape)
    key = tuple(key)
    if len(key) > len(shape):
        raise IndexError(f"too many indices for array: array is {len(shape)}-dimensional, "
                         f"but {len(key)} were indexed")
    dims, arrays = [], []
    for d, k in enumerate(key):
        if isinstance(k, slice):
            if k != slice(None):
                raise ValueError(f"index: only full slices ':' are supported, got {k} at "
                                 f"dimension {d}")
        else:
            dims.append(d)
            arrays.append(k)
    if not dims:
        return copy_into(empty(shape, dtype, src), src)
    try:
        b_shape = np.broadcast_shapes(*(tuple(describe(a)[0]) for a in arrays))
    except ValueError:
        raise IndexError("shape mismatch: indexing arrays could not be broadcast together with "
                         "shapes " + " ".join(str(tuple(describe(a)[0])) for a in arrays)
                         ) from None
    nb = int(np.prod(b_shape, dtype=np.int64))
    rest = [d for d in range(len(shape)) if d not in dims]
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    # out dims: ("rest", src dim) or ("b", dim of b_shape)
    b_dims = [("b", i) for i in range(len(b_shape))]
    if adjacent:
        layout = [("rest", d) for d in rest if d < dims[0]] + b_dims + \
                 [("rest", d) for d in rest if d > dims[-1]]
    else:
        layout = b_dims + [("rest", d) for d in rest]
    out_shape = tuple(shape[i] if kind == "rest" else b_shape[i] for kind, i in layout)
    out = empty(out_shape, dtype, src)
    if size_of(out) == 0:
        if nb:      # an empty slice dim: NumPy still checks the indices
            for d, a in zip(dims, arrays):
                check_range(device_index(a, src), shape[d], "index", negative=True, axis=d)
        return out
    table = empty((len(dims), nb), np.int64, src)
    for k, a in enumerate(arrays):
        copy_into(table[k].reshape(b_shape), on_device(a, src))   # broadcasts, casts
    if CHECK_INDICES:
        ranges = minmax_rows(table)
        for (lo, hi), d in zip(ranges, dims):
            if lo < -shape[d] or hi >= shape[d]:
                raise IndexError(f"index {hi if hi >= shape[d] else lo} is out of bounds for "
                                 f"axis {d} with size {shape[d]}")
    s_view, s_off, s_st = operand(src, what="src")
    b_strides = [0] * len(b_shape)
    step = 1
    for i in range(len(b_shape) - 1, -1, -1):
        b_strides[i] = step
        step *= b_shape[i]
    src_st = [s_st[i] if kind == "rest" else 0 for kind, i in layout]
    b_st = [b_strides[i] if kind == "b" else 0 for kind, i in layout]
    kshape, (src_st, b_st) = pad_dims(out_shape, src_st, b_st)
    _launch("advanced_gather", size_of(out), out.reshape(-1), read_only(s_view), s_off, kshape,
            src_st, b_st, read_only(table.reshape(-1)), nb,
            tuple(shape[d] for d in dims), tuple(s_st[d] for d in dims))
    return out


@register("index_select", "cuda")
def index_select(src, dim, idx1):
    """``np.take(src, idx1, axis=dim)``: negative indices wrap, any layout of src."""
    ndim = len(describe(src)[0])
    if not -ndim <= dim < max(ndim, 1):
        raise ValueError(f"index_select: dim {dim} is out of range for an array of "
                         f"{ndim} dimensions")
    dim %= max(ndim, 1)
    return _advanced(src, (slice(None),) * dim + (idx1,))


@register("index", "cuda")
def index(src, key):
    """``src[key]`` for a key of full slices and int64 arrays (NumPy's rules)."""
    return _advanced(src, key)
