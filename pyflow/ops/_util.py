"""Helpers every op module shares: argument checks, dtype handling, dispatch."""
import numbers

import numpy as np

from .. import dtypes as _dt
from ..device import CPU
from ..kernels import registry
from ..tensor import Tensor

kernel = registry.get


def wrap(arr, dtype, device=CPU):
    """A new tensor from a kernel's output array in ``dtype.compute`` (or storage)."""
    if arr.dtype != dtype.storage:
        if device.type != "cpu":
            arr = kernel("cast", device.type)(arr, _dt.from_numpy(arr.dtype), dtype)
        elif dtype is _dt.bfloat16:
            from ..kernels.cpu.cast import float32_to_bfloat16
            arr = float32_to_bfloat16(arr)
        else:
            arr = arr.astype(dtype.storage)
    return Tensor._make(arr, dtype, device)


def array_module(data):
    """The array module of ``data``: numpy for host arrays; for device arrays
    cupy on a GPU, or its strict stand-in under numba's simulator (see
    kernels/cuda/_simarray.py).  Ops that do array math on tensor data write
    ``xp = array_module(t._data)`` and ``xp.where(...)`` so it runs where the data is."""
    if type(data) is np.ndarray or isinstance(data, (np.generic, numbers.Number)):
        return np
    from ..kernels.cuda._memory import array_module as module_of
    return module_of(data)


def as_array(arr, dtype=None):
    """``np.asarray(arr, dtype)`` for a kernel's result on any device: a NumPy
    scalar from a CPU kernel becomes a 0-d array; a device array stays on its
    device (np.asarray would copy it to the host, or raise on CuPy)."""
    if type(arr) is np.ndarray or isinstance(arr, (np.generic, numbers.Number)):
        return np.asarray(arr, dtype)
    return arr if dtype is None or arr.dtype == dtype else arr.astype(dtype)


def compute_array(t, dtype):
    """``t``'s data converted to ``dtype.compute`` (no copy if already there)."""
    if t.dtype is dtype:
        return t._data if dtype.storage is dtype.compute else t._as_float32()
    if t.dtype is _dt.bfloat16:
        return t._as_float32().astype(dtype.compute, copy=False)
    return t._data.astype(dtype.compute)


def scalar_of(x, dtype):
    """A Python number as a NumPy scalar of ``dtype.compute``."""
    return dtype.compute.type(x)


def check_tensor(x, name, op):
    if not isinstance(x, Tensor):
        raise TypeError(f"{op}(): argument '{name}' must be a Tensor, not {type(x).__name__}")
    return x


def check_same_device(op, reference, **others):
    """Raise unless every tensor in ``others`` (None allowed) is on
    ``reference``'s device, like PyTorch: an op never moves data silently."""
    name0, t0 = reference
    for name, t in others.items():
        if t is not None and t.device != t0.device:
            raise RuntimeError(
                f"{op}(): expected all tensors to be on the same device, but {name} is on "
                f"{t.device} and {name0} on {t0.device}; move it with "
                f"{name}.to({str(t0.device)!r})")


def is_number(x):
    return isinstance(x, numbers.Number) and not isinstance(x, Tensor)


def broadcast_shapes(*shapes, op="broadcast"):
    ndim = max(len(s) for s in shapes)
    out = [1] * ndim
    for s in shapes:
        for i, n in enumerate(s):
            j = ndim - len(s) + i
            if n != out[j]:
                if out[j] == 1:
                    out[j] = n
                elif n != 1:
                    raise RuntimeError(
                        f"{op}: shapes {' and '.join(str(tuple(x)) for x in shapes)} are not "
                        f"broadcastable (size {out[j]} vs {n} at dimension {j})")
    return tuple(out)


def unbroadcast(g, shape):
    """Sum ``g`` down to ``shape``: the backward of broadcasting."""
    if tuple(g.shape) == tuple(shape):
        return g
    from . import reduce
    lead = g.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape)
                                      if n == 1 and g.shape[i + lead] != 1)
    r = reduce.sum(g, dims, keepdim=True) if dims else g
    return r.reshape(shape) if tuple(r.shape) != tuple(shape) else r


def normalize_dims(dim, ndim, op="op"):
    """dim may be None (all), an int or a sequence; returns a sorted tuple."""
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, (int, np.integer)):
        dim = (dim,)
    out = []
    for d in dim:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool):
            raise TypeError(f"{op}(): dim must be an int or a tuple of ints, got {dim!r}")
        lo, hi = (-ndim, ndim - 1) if ndim else (-1, 0)
        if d < lo or d > hi:
            raise IndexError(f"{op}(): dim {d} out of range for a tensor of {ndim} dimensions "
                             f"(expected [{lo}, {hi}])")
        out.append(int(d) % ndim if ndim else 0)
    if len(set(out)) != len(out):
        raise RuntimeError(f"{op}(): dim {dim!r} appears multiple times")
    return tuple(sorted(out))


def shape_arg(args, op):
    """Accept f(2, 3), f((2, 3)), f([2, 3]) or f(Size)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    for a in args:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise TypeError(f"{op}(): size must be a sequence of ints, got {args!r}")
    return tuple(int(a) for a in args)
