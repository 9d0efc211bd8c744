"""Creation ops: tensor, zeros, ones, full, arange, rand, ... and their *_like forms."""
import builtins
import numbers

import numpy as np

from .. import dtypes as _dt
from .._hooks import recordable
from ..device import as_device, check_available, get_default_device, placed
from ..distributed.sbp import broadcast, partial_sum
from ..random import fill as random_fill, generator_of
from ..tensor import Tensor
from ._util import check_array_fits, check_scalar_fits, kernel, shape_arg, wrap

__all__ = ["tensor", "as_tensor", "from_numpy", "zeros", "ones", "full", "empty", "arange",
           "linspace", "eye", "rand", "randn", "randint", "randperm", "zeros_like", "ones_like",
           "full_like", "empty_like", "rand_like", "randn_like", "randint_like"]


def _finish(arr, dtype, device, requires_grad):
    """A tensor from host array ``arr`` (dtype.compute), placed on ``device``."""
    device = get_default_device() if device is None else as_device(device)
    check_available(device)
    t = wrap(arr, dtype)
    if t._data.shape != arr.shape:   # the bfloat16 cast can drop a 0-d shape (cast.py)
        t._data = t._data.reshape(arr.shape)
    if device.type != "cpu":
        t = Tensor._make(kernel("to_device", device.type)(t._data), dtype, placed(device))
    if requires_grad:
        t.requires_grad_(True)
    return t


def _infer_dtype(data):
    """PyTorch's inference: bools -> bool, ints -> int64, floats -> default float;
    NumPy arrays and NumPy scalars keep their dtype."""
    if isinstance(data, (np.ndarray, np.generic)):
        return _dt.from_numpy(data.dtype)
    if isinstance(data, builtins.bool) or isinstance(data, np.bool_):
        return _dt.bool
    if isinstance(data, numbers.Integral):
        return _dt.int64
    if isinstance(data, numbers.Real):
        return _dt.get_default_dtype()
    if isinstance(data, Tensor):
        return data.dtype
    if isinstance(data, (list, tuple)):
        if len(data) == 0:
            return _dt.get_default_dtype()
        best = None
        for x in data:
            d = _infer_dtype(x)
            best = d if best is None else _dt.promote_types(best, d)
        return best
    raise TypeError(f"tensor(): could not infer a dtype from object of type {type(data).__name__}")


def _to_numpy(data):
    if isinstance(data, Tensor):
        return np.asarray(data._host())
    if isinstance(data, (list, tuple)) and any(isinstance(x, Tensor) for x in data):
        return np.array([_to_numpy(x) for x in data])
    return np.asarray(data)


@recordable
def tensor(data, dtype=None, device=None, requires_grad=False):
    """A new tensor holding a copy of ``data`` (nested lists, scalars, arrays, tensors)."""
    dtype = _infer_dtype(data) if dtype is None else _dt.as_dtype(dtype)
    try:
        arr = _to_numpy(data)
    except ValueError as e:
        raise ValueError(f"tensor(): data must be a rectangular nested sequence ({e})") from None
    if not isinstance(data, (np.ndarray, Tensor)):
        # Python numbers must fit an integer dtype (PyTorch raises; NumPy would wrap
        # 2**40 to 0 in int32 and NaN to INT64_MIN); arrays and tensors wrap, as in PyTorch
        check_array_fits(arr, dtype, "tensor")
        if arr.dtype == object and dtype.is_floating_point:
            try:                            # ints beyond 64 bits, as floats
                arr = arr.astype(np.float64)
            except (TypeError, ValueError, OverflowError):
                pass
    if arr.dtype == object:
        raise TypeError("tensor(): data must be numbers, nested lists of numbers, arrays or tensors")
    arr = np.array(arr, dtype=dtype.compute, copy=True)
    return _finish(arr, dtype, device, requires_grad)


@recordable
def as_tensor(data, dtype=None, device=None):
    if isinstance(data, Tensor) and (dtype is None or _dt.as_dtype(dtype) is data.dtype):
        return data
    if isinstance(data, np.ndarray) and dtype is None:
        return from_numpy(data)
    return tensor(data, dtype=dtype, device=device)


@recordable
def from_numpy(arr):
    """A tensor sharing memory with the NumPy array ``arr``."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"from_numpy(): expected np.ndarray, got {type(arr).__name__}")
    d = _dt.from_numpy(arr.dtype)
    if arr.dtype != d.storage:
        arr = arr.astype(d.storage)
    return Tensor._make(arr, d)


def _dtype_or_default(dtype):
    return _dt.get_default_dtype() if dtype is None else _dt.as_dtype(dtype)


def _size(size, op):
    """The shape of a creation op; negative sizes are refused as PyTorch does."""
    shape = shape_arg(size, op)
    if any(s < 0 for s in shape):
        bad = next(s for s in shape if s < 0)
        raise RuntimeError(f"{op}(): Trying to create tensor with negative dimension {bad}: "
                           f"{list(shape)}")
    return shape


def _filled(size, value, dtype, device, requires_grad, op):
    shape = _size(size, op)
    dtype = _dtype_or_default(dtype)
    if value is not None:
        check_scalar_fits(value, dtype, op)
    arr = np.full(shape, value, dtype=dtype.compute) if value is not None \
        else np.empty(shape, dtype=dtype.compute)
    return _finish(arr, dtype, device, requires_grad)


@recordable
def zeros(*size, dtype=None, device=None, requires_grad=False):
    return _filled(size, 0, dtype, device, requires_grad, "zeros")


@recordable
def ones(*size, dtype=None, device=None, requires_grad=False):
    return _filled(size, 1, dtype, device, requires_grad, "ones")


@recordable
def empty(*size, dtype=None, device=None, requires_grad=False):
    return _filled(size, None, dtype, device, requires_grad, "empty")


@recordable
def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    if dtype is None:
        dtype = _infer_dtype(fill_value.item() if isinstance(fill_value, Tensor) else fill_value)
    return _filled((size,) if isinstance(size, int) else tuple(size), fill_value, dtype, device,
                   requires_grad, "full")


def _like(t, dtype):
    """(shape, dtype) of a ``*_like`` result; for a global ``t``, of its piece (the
    result is labelled global by ``_global_like``)."""
    if not isinstance(t, Tensor):
        raise TypeError(f"input: expected a Tensor, got {type(t).__name__}")
    return (tuple(t._data.shape), t.dtype if dtype is None else _dt.as_dtype(dtype))


def _global_like(t, out, constant=True):
    """``out`` (a piece made like ``t``'s) with ``t``'s placement and SBP; a nonzero
    constant is replicated, not a partial sum (whose pieces would add up)."""
    if t._placement is None:
        return out
    sbp = tuple(broadcast if s == partial_sum and constant else s for s in t._sbp)
    out._placement, out._sbp, out._logical_shape = t._placement, sbp, t._logical_shape
    return out


@recordable
def zeros_like(t, dtype=None, device=None, requires_grad=False):
    shape, d = _like(t, dtype)
    return _global_like(t, zeros(shape, dtype=d, device=device or t.device,
                                 requires_grad=requires_grad), constant=False)


@recordable
def ones_like(t, dtype=None, device=None, requires_grad=False):
    shape, d = _like(t, dtype)
    return _global_like(t, ones(shape, dtype=d, device=device or t.device,
                                requires_grad=requires_grad))


@recordable
def empty_like(t, dtype=None, device=None, requires_grad=False):
    shape, d = _like(t, dtype)
    return _global_like(t, empty(shape, dtype=d, device=device or t.device,
                                 requires_grad=requires_grad), constant=False)


@recordable
def full_like(t, fill_value, dtype=None, device=None, requires_grad=False):
    shape, d = _like(t, dtype)
    return _global_like(t, full(shape, fill_value, dtype=d, device=device or t.device,
                                requires_grad=requires_grad))


@recordable
def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    if step == 0:
        raise RuntimeError("arange(): step must be nonzero")
    vals = [x.item() if isinstance(x, Tensor) else x for x in (start, end, step)]
    if dtype is None:
        dtype = _dt.int64 if all(isinstance(v, numbers.Integral) for v in vals) \
            else _dt.get_default_dtype()
    dtype = _dt.as_dtype(dtype)
    arr = np.arange(vals[0], vals[1], vals[2], dtype=np.float64 if dtype.is_floating_point
                    else np.int64).astype(dtype.compute)
    return _finish(arr, dtype, device, requires_grad)


@recordable
def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    if not isinstance(steps, int) or steps < 0:
        raise RuntimeError(f"linspace(): steps must be a non-negative int, got {steps!r}")
    dtype = _dtype_or_default(dtype)
    arr = np.linspace(start, end, steps, dtype=np.float64).astype(dtype.compute)
    return _finish(arr, dtype, device, requires_grad)


@recordable
def eye(n, m=None, dtype=None, device=None, requires_grad=False):
    dtype = _dtype_or_default(dtype)
    return _finish(np.eye(n, n if m is None else m, dtype=dtype.compute), dtype, device,
                   requires_grad)


def _store_as(dtype):
    """``convert`` for ``pyflow.random.fill``: float64/int64 draws into ``dtype``'s
    storage, rounding through float32 for the half types as their compute dtype
    does (so the numbers equal ``draws.astype(compute)`` stored)."""
    if dtype is _dt.bfloat16:
        return lambda piece: kernel("cast", "cpu")(piece.astype(np.float32), _dt.float32, dtype)
    if dtype is _dt.float16:
        return lambda piece: piece.astype(np.float32)
    return None


def _drawn(shape, dtype, kind, generator, **params):
    """A host array of ``dtype``'s storage filled by ``pyflow.random.fill``: drawn in
    pieces, so the result is the only full-size array (no float64 copy of it)."""
    arr = np.empty(shape, dtype.storage)
    return random_fill(generator, arr, kind, _store_as(dtype), **params)


def _random(size, kind, dtype, device, requires_grad, op, generator):
    shape = _size(size, op)
    dtype = _dtype_or_default(dtype)
    if not dtype.is_floating_point:
        raise TypeError(f"{op}(): dtype must be floating point, got {dtype}")
    return _finish(_drawn(shape, dtype, kind, generator), dtype, device, requires_grad)


@recordable(random=True)
def rand(*size, generator=None, dtype=None, device=None, requires_grad=False):
    return _random(size, "random", dtype, device, requires_grad, "rand", generator)


@recordable(random=True)
def randn(*size, generator=None, dtype=None, device=None, requires_grad=False):
    return _random(size, "standard_normal", dtype, device, requires_grad, "randn", generator)


@recordable(random=True)
def randint(low, high=None, size=None, generator=None, dtype=None, device=None,
            requires_grad=False):
    if size is None and isinstance(high, (tuple, list)):   # randint(high, size)
        low, high, size = 0, low, high
    if high is None:
        low, high = 0, low
    if size is None:
        raise TypeError("randint(): missing required argument 'size'")
    if high <= low:
        raise RuntimeError(f"randint(): expected low < high, got low={low}, high={high}")
    dtype = _dt.int64 if dtype is None else _dt.as_dtype(dtype)
    if dtype.category == 1:       # NumPy would wrap the draws silently
        lo, hi = np.iinfo(dtype.storage).min, np.iinfo(dtype.storage).max
        if low < lo or high - 1 > hi:
            raise RuntimeError(f"randint(): the range [{low}, {high}) is out of bounds for "
                               f"{dtype.name} ([{lo}, {hi}])")
    shape = _size((size,) if isinstance(size, int) else tuple(size), "randint")
    return _finish(_drawn(shape, dtype, "integers", generator, low=low, high=high), dtype,
                   device, requires_grad)


@recordable(random=True)
def randperm(n, generator=None, dtype=None, device=None):
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
        raise TypeError(f"randperm(): argument 'n' must be an int, got {type(n).__name__}")
    if n < 0:
        raise RuntimeError(f"randperm(): n must be non-negative, got {n}")
    dtype = _dt.int64 if dtype is None else _dt.as_dtype(dtype)
    if dtype is _dt.bool:
        raise NotImplementedError("randperm(): not implemented for dtype bool")
    # every value 0..n-1 must be exact in dtype (float16 holds the integers up to 2048)
    top = np.iinfo(dtype.storage).max if dtype.category == 1 else \
        2 ** {16: 11, 32: 24, 64: 53}[dtype.bits] if dtype is not _dt.bfloat16 else 2 ** 8
    if n - 1 > top:
        raise RuntimeError(f"randperm(): n cannot be greater than {top + 1} for {dtype.name} "
                           f"(its values 0..n-1 must be exact), got {n}")
    rng = generator_of(generator).numpy
    if dtype.storage is dtype.compute:
        # permutation(n) is arange(n) shuffled, and a shuffle moves elements the same
        # way in any dtype: the same numbers, without an int64 copy of the result
        arr = np.arange(n, dtype=dtype.storage)
        rng.shuffle(arr)
    else:
        arr = rng.permutation(n).astype(dtype.compute)
    return _finish(arr, dtype, device, False)


@recordable(random=True)
def rand_like(t, dtype=None, device=None, requires_grad=False, generator=None):
    shape, d = _like(t, dtype)
    return rand(shape, dtype=d, device=device or t.device, requires_grad=requires_grad,
                generator=generator)


@recordable(random=True)
def randn_like(t, dtype=None, device=None, requires_grad=False, generator=None):
    shape, d = _like(t, dtype)
    return randn(shape, dtype=d, device=device or t.device, requires_grad=requires_grad,
                 generator=generator)


@recordable(random=True)
def randint_like(t, low, high=None, dtype=None, device=None, generator=None):
    shape, d = _like(t, dtype)
    return randint(low, high, shape, dtype=d, device=device or t.device, generator=generator)
