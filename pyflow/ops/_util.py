"""Helpers every op module shares: argument checks, dtype handling, dispatch."""
import functools
import numbers
import os

import numpy as np

from .. import _hooks
from .. import dtypes as _dt
from ..device import CPU, backend_of_array
from ..distributed.sbp import broadcast
from ..kernels import registry
from ..tensor import TENSOR_TYPES, Tensor, host_tensor

kernel = registry.get
_trace = _hooks._state          # .tracer: the calling thread's graph tracer, or None
trace_state = _trace

# op name -> its CPU kernel, for the ops' fast paths: ``CPU_KERNELS.get(name) or
# cpu_kernel(name)`` is one dict read where ``kernel(name, "cpu")`` is a call
# (the CPU kernels load on first use, not when pyflow is imported).
CPU_KERNELS = {}


def cpu_kernel(name):
    """Op ``name``'s CPU kernel, from the registry, kept in ``CPU_KERNELS``."""
    k = CPU_KERNELS[name] = kernel(name, "cpu")
    return k


def local(t):
    """True when an op may run its Function's forward work on ``t`` itself: ``t``
    a local tensor (or Parameter) on the host, while the calling thread traces no
    graph.  The ops' fast paths do that for their common cases, skipping
    ``Function.apply``, its argument loop and grad-mode switch (a third to a half
    of a small op's time); when an input requires grad and grad mode is on
    (``GRAD_MODE.enabled``) they record the call with ``autograd.record``, as
    ``apply`` would.  No graph trace: a trace sees ops at ``Function.apply``; no
    global tensor: those go to the SBP dispatch."""
    return type(t) in TENSOR_TYPES and t._placement is None and type(t._data) is np.ndarray \
        and _trace.tracer is None


def wrap(arr, dtype, device=CPU):
    """A new tensor from a kernel's output array in ``dtype.compute`` (or storage)."""
    if arr.dtype != dtype.storage:
        if device.type != "cpu":
            arr = kernel("cast", device.type)(arr, _dt.from_numpy(arr.dtype), dtype)
        elif dtype is _dt.bfloat16 or dtype is _dt.float16:    # the cast kernel's rounding
            arr = kernel("cast", "cpu")(arr, _dt.from_numpy(arr.dtype), dtype)  # and overflow
        else:
            arr = arr.astype(dtype.storage)
    if type(arr) is np.ndarray and device is CPU and _trace.tracer is None:
        return host_tensor(arr, dtype, device)      # (_make's work, without its checks)
    return Tensor._make(arr, dtype, device)


def array_module(data):
    """The array module of ``data``'s memory, as its device backend says
    (pyflow/device.py): numpy for host data; for device arrays cupy on a GPU, or
    its strict stand-in under numba's simulator.  Ops that do array math on tensor
    data write ``xp = array_module(t._data)`` and ``xp.where(...)`` so it runs
    where the data is."""
    if type(data) is np.ndarray:          # the common case, without a call
        return np
    return backend_of_array(data).xp


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


def _int_bounds(dtype):
    info = np.iinfo(dtype.storage)
    return int(info.min), int(info.max)


def _overflow(value, dtype, op):
    lo, hi = _int_bounds(dtype)
    return RuntimeError(f"{op}(): value {value!r} cannot be converted to type {dtype.name} "
                        f"without overflow (its range is [{lo}, {hi}])")


def _float_fits(v, dtype):
    """Mask: the elements of float64 ``v`` that truncate into integer ``dtype`` (NaN
    never does).  float64(2**63 - 1) rounds up to 2**63, so int64's bound is strict."""
    lo, hi = _int_bounds(dtype)
    return (v >= lo) & (v < 2.0 ** 63 if hi == 2 ** 63 - 1 else v <= hi)


def check_scalar_fits(value, dtype, op):
    """Raise PyTorch's overflow error when a Python number given to a creation op or a
    fill (``full``, ``masked_fill``, ``t[i] = v``) cannot be an element of integer
    ``dtype``: out of its range, NaN or infinite.  NumPy would wrap it silently
    (2**40 -> 0 in int32, NaN -> INT64_MIN).  Conversions of tensors and arrays
    (``.to()``) wrap, as in PyTorch, and do not come here."""
    if dtype.category != 1 or isinstance(value, (bool, np.bool_)):
        return
    if isinstance(value, (int, np.integer)):
        lo, hi = _int_bounds(dtype)
        ok = lo <= int(value) <= hi
    elif isinstance(value, (float, np.floating)):
        ok = bool(_float_fits(np.float64(value), dtype))
    else:
        return
    if not ok:
        raise _overflow(value, dtype, op)


def check_array_fits(arr, dtype, op):
    """``check_scalar_fits`` for the array NumPy made from Python data (``tensor([...])``):
    one pass over it; an object array holds ints beyond 64 bits."""
    if dtype.category != 1 or arr.size == 0 or arr.dtype.kind == "b":
        return
    flat = arr.reshape(-1)
    if arr.dtype == object:
        for x in flat:
            check_scalar_fits(x, dtype, op)
        return
    if arr.dtype.kind == "f":
        fits = _float_fits(flat.astype(np.float64, copy=False), dtype)
        if not fits.all():
            raise _overflow(flat[~fits][0].item(), dtype, op)
    elif arr.dtype.kind in "iu":
        lo, hi = _int_bounds(dtype)
        amin, amax = int(flat.min()), int(flat.max())
        if amin < lo or amax > hi:
            raise _overflow(amax if amax > hi else amin, dtype, op)


def stored_elements(arr):
    """The elements ``arr`` really stores: an expanded (stride-0) dimension is read
    once.  Checks of every element (index bounds) scan this instead of a broadcast
    view that may show 10**12 elements of one."""
    if arr.size and 0 in arr.strides:
        arr = arr[tuple(slice(0, 1) if st == 0 else slice(None) for st in arr.strides)]
    return arr


_memory = []


def _machine_memory():
    """Bytes of physical memory (None where the OS does not say)."""
    if not _memory:
        try:
            _memory.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (AttributeError, ValueError, OSError):
            _memory.append(None)
    return _memory[0]


def check_allocation(nbytes, what, op):
    """Raise before allocating ``nbytes`` for ``what`` when that is more than the
    machine's memory (PyTorch's "can't allocate memory"), instead of a MemoryError
    after a long scan, or an out-of-memory kill once the pages are touched."""
    limit = _machine_memory()
    if limit is not None and nbytes > limit:
        raise RuntimeError(f"{op}(): can't allocate memory: {what} would take {nbytes} bytes, "
                           f"more than the {limit} bytes of memory of this machine")


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
    """Sum ``g`` down to ``shape``: the backward of broadcasting.  Written with
    Tensor methods (``sum``, ``reshape``), as backward formulas are: it runs
    after every op family is loaded, and this module sits below all of them."""
    if (g._data.shape if g._logical_shape is None else tuple(g.shape)) == tuple(shape):
        return g
    lead = g.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(shape)
                                      if n == 1 and g.shape[i + lead] != 1)
    r = g.sum(dims, keepdim=True) if dims else g
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
        if type(a) is not int:
            break
    else:
        return tuple(args)          # plain ints, the common case: nothing to convert
    for a in args:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise TypeError(f"{op}(): size must be a sequence of ints, got {args!r}")
    return tuple(int(a) for a in args)


# ------------------------------------------------------------------ global tensors
def has_global(key):
    """True when ``key`` (an index key, a tensor or a tuple) holds a global tensor."""
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, Tensor) and k._placement is not None for k in keys)


def replicated(t):
    """``t`` boxed to broadcast on every placement axis (differentiable: the
    boxing is an op); ``t`` itself when it is local or already broadcast."""
    if t._placement is None or all(s == broadcast for s in t._sbp):
        return t
    return t.to_global(t._placement, [broadcast] * len(t._sbp))


def whole_globals(fn):
    """Run ``fn`` with its global tensor arguments (index tuples included) boxed
    to broadcast.  For ops that read index values and ``._data`` shapes outside
    their Functions (parsing a key, checking bounds, building index arrays, batch
    statistics), where a split or partial-sum argument would be read as its
    rank's piece; their Functions have the all-broadcast signature anyway."""
    def whole(a):
        if isinstance(a, Tensor) and a._placement is not None:
            return replicated(a)
        if isinstance(a, (tuple, list)):
            return type(a)(whole(x) for x in a)
        return a

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*[whole(a) for a in args], **{k: whole(v) for k, v in kwargs.items()})
    return wrapper
