"""Strided copies: the kernel behind every layout change on the GPU.

``copy_into(dst, src)`` writes ``src`` (broadcast to ``dst``'s shape, any
strides, negative ones included) into ``dst`` (any non-overlapping strides),
converting the dtype the way NumPy's ``astype`` does; ``contiguous(arr)`` is
the GPU's ``np.ascontiguousarray``.  Other kernel modules reuse both, and the
``operand`` helper that turns any array into what a strided kernel takes.

Every operand reaches a kernel as (1-D view of the memory it spans, element
offset of its first element, element strides): numba's simulator only moves
contiguous buffers, and a 1-D span is one on both targets (the layout helpers
are shared with ``elementwise.py``).  Before launching, size-1 dims are dropped
and neighbouring dims contiguous in both operands merged, so a copy between
two dense layouts takes the plain 1-D kernel and a transposed one rarely sees
more than two dims.  The strided kernel is specialised per number of dims
(shape and strides travel as tuples, so numba unrolls the index loop).

Conversions to bool are ``v != 0`` (NaN is True, as in NumPy); the others are
numba's casts (float -> int truncates, like C and NumPy).
"""
import numpy as np
from numba import cuda

from ._memory import empty, launch_config, stream
from . import layout

_BOOL = np.dtype(np.bool_)


# ------------------------------------------------------------------ operands
def describe(a):
    """(shape, byte strides, dtype) of a NumPy array or a CUDA array interface object."""
    return layout.describe(a)


def operand(a, shape=None, what="input"):
    """``a`` as a strided-kernel operand: (1-D span, element offset, element
    strides broadcast to ``shape``).  ``a`` must not be empty."""
    a_shape, a_strides, dtype = layout.describe(a)
    view, offset = layout.span(a, a_shape, a_strides, dtype)
    strides = layout.element_strides(a_shape, a_strides, dtype,
                               a_shape if shape is None else tuple(shape), what)
    return view, offset, strides


def read_only(view):
    """A kernel argument the kernel only reads: the simulator then copies it in
    but not back (inputs may be read-only broadcast views)."""
    return cuda.In(view) if isinstance(view, np.ndarray) else view


def is_contiguous(a):
    shape, strides, dtype = layout.describe(a)
    step = dtype.itemsize
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != step:
            return False
        step *= n
    return True


def size_of(a):
    n = 1
    for s in layout.describe(a)[0]:
        n *= s
    return n


def pad_dims(shape, *strides):
    """At least one dim, so kernels never index an empty tuple."""
    if len(shape) == 0:
        return (1,), [(0,) for _ in strides]
    return tuple(shape), [tuple(s) for s in strides]


# ------------------------------------------------------------------ kernels
def _copy_contiguous(out, src):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = src[i]


def _copy_contiguous_to_bool(out, src):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = src[i] != 0


def _copy_strided(out, out_off, out_st, src, src_off, src_st, n, shape):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        rem = i
        p = out_off
        q = src_off
        for d in range(len(shape) - 1, -1, -1):
            k = rem // shape[d]
            j = rem - k * shape[d]
            rem = k
            p += j * out_st[d]
            q += j * src_st[d]
        out[p] = src[q]


def _copy_strided_to_bool(out, out_off, out_st, src, src_off, src_st, n, shape):
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        rem = i
        p = out_off
        q = src_off
        for d in range(len(shape) - 1, -1, -1):
            k = rem // shape[d]
            j = rem - k * shape[d]
            rem = k
            p += j * out_st[d]
            q += j * src_st[d]
        out[p] = src[q] != 0


KERNEL_FUNCTIONS = {("contiguous", False): _copy_contiguous,
                    ("contiguous", True): _copy_contiguous_to_bool,
                    ("strided", False): _copy_strided,
                    ("strided", True): _copy_strided_to_bool}
_jitted = {}


def _kernel(layout, to_bool):
    key = (layout, to_bool)
    k = _jitted.get(key)
    if k is None:
        k = _jitted[key] = cuda.jit(KERNEL_FUNCTIONS[key])
    return k


# ------------------------------------------------------------------ host side
def copy_into(dst, src):
    """``dst[...] = src`` on the device; ``src`` broadcasts to ``dst``'s shape.
    Returns ``dst``.  ``dst`` must not overlap ``src`` or itself."""
    d_shape, _, d_dtype = layout.describe(dst)
    s_shape, _, s_dtype = layout.describe(src)
    try:
        shape = np.broadcast_shapes(tuple(s_shape), tuple(d_shape))
    except ValueError:
        shape = None
    if shape != tuple(d_shape):
        raise ValueError(f"copy_into: src of shape {tuple(s_shape)} cannot be broadcast to "
                         f"dst of shape {tuple(d_shape)}")
    n = 1
    for s in shape:
        n *= s
    if n == 0:
        return dst
    d_view, d_off, d_st = operand(dst, shape, "dst")
    s_view, s_off, s_st = operand(src, shape, "src")
    if any(st == 0 for st, m in zip(d_st, shape) if m > 1):
        raise ValueError("copy_into: dst must not be a broadcast (expanded) view")
    shape, (d_st, s_st) = layout.coalesce(list(shape), [d_st, s_st])
    to_bool = d_dtype == _BOOL and s_dtype != _BOOL
    blocks, threads = launch_config(n)
    if len(shape) <= 1 and d_off == 0 and s_off == 0 and d_st in ((), (1,)) \
            and s_st in ((), (1,)):
        _kernel("contiguous", to_bool)[blocks, threads, stream()](d_view, read_only(s_view))
    else:
        shape, (d_st, s_st) = pad_dims(shape, d_st, s_st)
        _kernel("strided", to_bool)[blocks, threads, stream()](
            d_view, d_off, d_st, read_only(s_view), s_off, s_st, n, shape)
    return dst


def copy(arr, dtype=None):
    """A new C-contiguous copy of ``arr`` (converted to ``dtype`` if given)."""
    shape, _, a_dtype = layout.describe(arr)
    out = empty(tuple(shape), a_dtype if dtype is None else np.dtype(dtype), arr)
    return copy_into(out, arr)


def contiguous(arr, dtype=None):
    """``arr`` itself when it is C-contiguous (and of ``dtype``), else a C-contiguous
    copy: the device counterpart of ``np.ascontiguousarray(arr, dtype)``."""
    a_dtype = layout.describe(arr)[2]
    if (dtype is None or np.dtype(dtype) == a_dtype) and is_contiguous(arr):
        return arr
    return copy(arr, dtype)


def flat(arr, dtype=None):
    """``arr`` as a 1-D C-contiguous array (a copy only when needed)."""
    c = contiguous(arr, dtype)
    return c.reshape(-1)
