"""Strided layouts on the device: what every kernel module's host side needs to
hand an array of any strides to a kernel.

An operand reaches a kernel as "a 1-D span of the memory it touches + the
element offset of its first element + element strides over the output's
shape" (0 along broadcast dims).  That works alike for NumPy arrays (numba's
simulator) and for any ``__cuda_array_interface__`` object (CuPy on a GPU):

* ``describe(a)``: (shape, byte strides, dtype) of either kind;
* ``span(a, shape, strides, dtype)``: the 1-D view and the offset;
* ``element_strides(...)``: byte strides -> element strides, broadcast;
* ``coalesce(shape, per_operand)``: size-1 dims dropped and neighbours that
  are contiguous in every operand merged (PyTorch's TensorIterator does the
  same), so most kernels see 1-3 dims.

Elementwise, copy, reduce, GEMM, convolution, pooling and the row kernels all
use these; no kernel module reaches into another's private helpers for them.
"""
import numpy as np


class _DeviceSpan:
    """A 1-D ``__cuda_array_interface__`` over ``size`` elements from ``ptr``;
    keeps the array it views alive."""

    def __init__(self, owner, ptr, size, typestr):
        self._owner = owner
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": typestr,
                                         "data": (ptr, False), "strides": None, "version": 3}


def describe(a):
    """(shape, byte strides, dtype) of a NumPy array or a CUDA array interface object."""
    if isinstance(a, np.ndarray):
        return a.shape, a.strides, a.dtype
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(f"expected a NumPy array (simulator) or an object with "
                        f"__cuda_array_interface__, got {type(a).__name__}")
    shape, dtype = tuple(cai["shape"]), np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is None:                      # C-contiguous
        strides, step = [], dtype.itemsize
        for n in reversed(shape):
            strides.insert(0, step)
            step *= max(n, 1)
    return shape, tuple(strides), dtype


def span_geometry(shape, strides, dtype):
    """What ``span`` derives from a layout alone, so a caller can cache it: the
    elements the span holds, the bytes from its start to the array's first
    element, and the index of the element at the span's start."""
    size = 1 + sum((n - 1) * abs(s) for n, s in zip(shape, strides)) // dtype.itemsize
    back = sum((n - 1) * -s for n, s in zip(shape, strides) if s < 0)   # bytes
    corner = tuple(slice(n - 1, n) if s < 0 else slice(0, 1) for n, s in zip(shape, strides))
    return size, back, corner


def span(a, shape, strides, dtype, geometry=None):
    """A 1-D view of the memory ``a`` touches, and the element offset of ``a``'s
    first element in it (nonzero only with negative strides).  ``geometry``:
    ``span_geometry``'s result for this layout, if the caller kept it."""
    size, back, corner = geometry or span_geometry(shape, strides, dtype)
    if isinstance(a, np.ndarray):
        start = a[corner] if a.ndim else a.reshape(1)
        view = np.lib.stride_tricks.as_strided(start, (size,), (dtype.itemsize,),
                                               writeable=a.flags.writeable)
    else:
        ptr = a.__cuda_array_interface__["data"][0]
        view = _DeviceSpan(a, ptr - back, size, dtype.str)
    return view, back // dtype.itemsize


def element_strides(shape, strides, dtype, out_shape, what):
    """``strides`` in elements, broadcast to ``out_shape`` (0 along broadcast dims)."""
    lead = len(out_shape) - len(shape)
    result = [0] * lead
    for n, s, m in zip(shape, strides, out_shape[lead:]):
        if s % dtype.itemsize:
            raise ValueError(f"{what}: byte stride {s} is not a multiple of the item size "
                             f"{dtype.itemsize}; make the array contiguous first")
        result.append(0 if n == 1 and m != 1 else s // dtype.itemsize)
    return result


def coalesce(shape, per_operand):
    """Drop size-1 dims and merge neighbours that are contiguous in every operand."""
    keep = [d for d, n in enumerate(shape) if n != 1]
    shape = [shape[d] for d in keep]
    per_operand = [[st[d] for d in keep] for st in per_operand]
    d = len(shape) - 1
    while d > 0:
        if all(st[d - 1] == st[d] * shape[d] for st in per_operand):
            shape[d - 1] *= shape[d]
            del shape[d]
            for st in per_operand:
                st[d - 1] = st[d]
                del st[d]
        d -= 1
    return tuple(shape), [tuple(st) for st in per_operand]
