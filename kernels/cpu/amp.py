"""Loss-scaling support for mixed precision: unscale gradients and find inf/nan.

``amp_unscale_check`` is ``torch._amp_foreach_non_finite_check_and_unscale_``:
every gradient of an optimizer is multiplied in place by ``inv_scale`` and the
call says whether any value was inf or nan, so ``GradScaler`` can skip a step
whose scaled gradients overflowed.  It runs once per step over every gradient,
so it is one numba pass per gradient and one kernel call per chunk of
``TUPLE_WIDTH`` gradients (the multi-tensor layout of ``optim.py``: a padded
tuple of flat arrays, one compilation per dtype whatever the gradient count).

Like ATen, a value is tested *before* it is multiplied (an overflow of the
product itself is not reported) and ``inv_scale`` is first rounded to float32
(torch keeps the scale in a float32 tensor), then used in the gradient's dtype.

float32/float64 C-contiguous gradients go through numba; float16 (numba's CPU
backend has no float16 arithmetic) and non-contiguous gradients take a NumPy
path with the same result, float16 computed in float32 and rounded once, as
ATen's opmath does.  bfloat16 is stored as uint16 words that carry no dtype
here: the caller passes their float32 values and casts back.
"""
import numpy as np
from numba import njit

from ..registry import register
from .optim import TUPLE_WIDTH

_FAST = (np.dtype(np.float32), np.dtype(np.float64))
_FLOATS = (np.dtype(np.float16),) + _FAST
_EMPTY = {dt: np.empty(0, dt) for dt in _FAST}


@njit(nogil=True, cache=True, error_model="numpy")
def _unscale_check_kernel(grad, inv_scale):
    """Multiply ``grad`` by ``inv_scale`` in place; True if a value was inf/nan."""
    found = False
    for i in range(grad.size):
        v = grad[i]
        if not np.isfinite(v):
            found = True
        grad[i] = v * inv_scale
    return found


@njit(nogil=True, cache=True, error_model="numpy")
def _unscale_check_multi_kernel(grads, inv_scale, n):
    found = False
    for t in range(n):
        if _unscale_check_kernel(grads[t], inv_scale):
            found = True
    return found


def _unscale_check_numpy(a, inv_scale):
    """The NumPy path (float16, or any layout): same values as the kernel."""
    found = not bool(np.isfinite(a).all())
    if a.dtype == np.float16:
        a[...] = (a.astype(np.float32) * np.float32(inv_scale)).astype(np.float16)
    else:
        a *= a.dtype.type(inv_scale)
    return found


def dtype_error(op, i, dtype):
    """The message for a gradient of a dtype the kernels do not take (both devices)."""
    return TypeError(f"{op}: 'grads[{i}]' must be float16, float32 or float64, got {dtype} "
                     f"(bfloat16 gradients: pass their float32 values and cast the result "
                     f"back)")


def check_call(op, grads, inv_scale):
    """The argument checks both devices' kernels share; ``inv_scale`` rounded to
    float32, as torch keeps the scale."""
    if not isinstance(grads, (list, tuple)):
        raise TypeError(f"{op}: 'grads' must be a list of arrays, got {type(grads).__name__}")
    if isinstance(inv_scale, (bool, np.bool_)) or not isinstance(inv_scale, (int, float,
                                                                             np.floating)):
        raise TypeError(f"{op}: 'inv_scale' must be a real number, got "
                        f"{type(inv_scale).__name__}")
    return np.float32(inv_scale)


def _check_grad(op, i, a):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{op}: 'grads[{i}]' must be a NumPy array, got {type(a).__name__}")
    if a.dtype not in _FLOATS:
        raise dtype_error(op, i, a.dtype)
    if not a.flags.writeable:
        raise ValueError(f"{op}: 'grads[{i}]' must be writeable (it is unscaled in place)")


@register("amp_unscale_check", "cpu")
def amp_unscale_check(grads, inv_scale):
    """Multiply every array of ``grads`` in place by ``inv_scale``; return True
    if any of them held an inf or nan (before the multiplication).

    ``grads`` is a list or tuple of float16/float32/float64 NumPy arrays of any
    shape and layout, mixed dtypes allowed; ``inv_scale`` a real number."""
    op = "amp_unscale_check"
    inv32 = check_call(op, grads, inv_scale)
    found = False
    fast = {dt: [] for dt in _FAST}          # flat views the numba kernel takes, per dtype
    for i, a in enumerate(grads):
        _check_grad(op, i, a)
        if a.size == 0:
            continue
        if a.dtype in fast and a.flags.c_contiguous:
            fast[a.dtype].append(a.reshape(-1))
        elif _unscale_check_numpy(a, inv32):
            found = True
    for dt, arrays in fast.items():
        inv = dt.type(inv32)                 # float32 value, exact in float64 too
        empty = _EMPTY[dt]
        for lo in range(0, len(arrays), TUPLE_WIDTH):
            chunk = arrays[lo:lo + TUPLE_WIDTH]
            padded = tuple(chunk) + (empty,) * (TUPLE_WIDTH - len(chunk))
            if _unscale_check_multi_kernel(padded, inv, len(chunk)):
                found = True
    return found
