"""What MPI sees of a pyflow tensor: its buffer, MPI datatype and reduce op.

Every collective needs the same few answers about its tensor argument, kept
here apart from the collectives themselves: is it a tensor of a dtype MPI can
carry (``check_tensor``), which MPI datatype its storage travels as (``wire``),
which MPI op a reduction is (``mpi_op``), how half precision is widened for a
reduction and narrowed back (``cast``, the device's cast kernel), where a new
result buffer is allocated (``empty_like``: on the device of the input, by its
backend, ``pyflow/device.py``) and how a result becomes a tensor
(``new_tensor``).

``pyflow.comm`` sits below ``pyflow.tensor`` in the layers (tensors are built
on devices and kernels; communicators move their bytes), so it never imports
the ``Tensor`` class: a tensor here is an object with a pyflow ``dtype``, a
``_data`` array and a ``_version`` counter, and a result is made with the
argument's own tensor class (the first class of its MRO that defines
``_make``: ``Tensor``, also for a ``Parameter``).
"""
import numpy as np
from mpi4py import MPI

from pyflow import dtypes as _dt
from pyflow.device import backend_of_array
from pyflow.kernels.registry import get as _kernel

__all__ = ["REDUCE_OPS", "is_tensor", "new_tensor", "check_tensor", "check_op", "mpi_op",
           "wire", "is_half", "cast", "empty_like", "divide", "check_chunked"]

REDUCE_OPS = ("sum", "avg", "max", "min")

# What MPI sees for each storage dtype.  float16 travels as 16-bit words (MPI
# has no float16; reductions convert to float32 first, see communicator.py).
WIRE = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float64): MPI.DOUBLE,
        np.dtype(np.float16): MPI.UINT16_T, np.dtype(np.uint16): MPI.UINT16_T,
        np.dtype(np.int32): MPI.INT32_T, np.dtype(np.int64): MPI.INT64_T,
        np.dtype(np.bool_): MPI.C_BOOL}
ARITH_OPS = {"sum": MPI.SUM, "avg": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
DIRECT_OPS = ("sum", "max", "min")        # all_reduce's direct path (no avg division)
DIRECT_DTYPES = (_dt.float32, _dt.float64, _dt.int32, _dt.int64)
_BOOL_OPS = {"sum": MPI.LOR, "max": MPI.LOR, "min": MPI.LAND}


# --------------------------------------------------------------------- tensors
def is_tensor(t):
    """True for a pyflow tensor (see the module docstring for why not isinstance)."""
    return type(getattr(t, "dtype", None)) is _dt.dtype and hasattr(t, "_data") and \
        hasattr(t, "_version")


_tensor_class = {}          # the class of the argument -> the class results are made of


def new_tensor(like, data, dtype=None):
    """A new tensor holding ``data`` (storage of ``dtype``, default ``like``'s)
    on ``like``'s device, of ``like``'s base tensor class."""
    kind = type(like)
    cls = _tensor_class.get(kind)
    if cls is None:
        cls = _tensor_class[kind] = next(c for c in reversed(kind.__mro__) if "_make" in vars(c))
    return cls._make(data, like.dtype if dtype is None else dtype, like.device)


def check_tensor(fn, t, argname="tensor"):
    if not is_tensor(t):
        raise TypeError(f"{fn}: {argname} must be a pyflow Tensor, got {type(t).__name__}")
    if t.dtype.storage not in WIRE:
        raise TypeError(f"{fn}: {argname} has unsupported dtype {t.dtype}")


def check_op(fn, op, dtype):
    if not isinstance(op, str) or op.lower() not in REDUCE_OPS:
        raise ValueError(f"{fn}: op must be one of {REDUCE_OPS}, got {op!r}")
    op = op.lower()
    if op == "avg" and not dtype.is_floating_point:
        raise TypeError(f"{fn}: op 'avg' needs a floating point tensor, got {dtype}; "
                        f"use 'sum' and divide")
    return op


def check_chunked(fn, t, size):
    if t.ndim == 0 or t.shape[0] % size:
        raise ValueError(f"{fn}: dim 0 of the tensor must be divisible by the group size "
                         f"{size}, got shape {tuple(t.shape)}")


# --------------------------------------------------------------------- buffers
def wire(a):
    """``[buffer, datatype]`` for mpi4py (an explicit type, so float16 words and
    device arrays need no typecode guessing)."""
    return [a, WIRE[a.dtype]]


def mpi_op(op, dtype):
    return _BOOL_OPS[op] if dtype is _dt.bool else ARITH_OPS[op]


def is_half(dtype):
    return dtype is _dt.float16 or dtype is _dt.bfloat16


def cast(array, device_type, src, dst):
    return _kernel("cast", device_type)(array, src, dst)


def empty_like(shape, storage, like):
    """Uninitialised storage of ``shape`` on the device of array ``like``."""
    return backend_of_array(like).empty(shape, storage)


def divide(a, n):
    """``a /= n`` in place, where ``a`` lives."""
    backend_of_array(a).xp.divide(a, a.dtype.type(n), out=a)
