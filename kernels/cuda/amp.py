"""Loss-scaling support on the GPU: unscale gradients and find inf/nan.

The twin of ``kernels/cpu/amp.py`` (same argument rules, same values): every
gradient is multiplied in place by ``float32(inv_scale)`` in its dtype and the
call says whether any value was inf or nan before the multiplication.  Here it
is one launch per gradient (not one per chunk of gradients as on the CPU),
all writing one device flag that is read once at the end.  float16 and
non-contiguous gradients are unscaled in a contiguous float32 (or own-dtype)
copy that is copied back, float16 rounding once as ATen's opmath does.
"""
import math

import numpy as np
from numba import cuda

from ..cpu.amp import check_call, dtype_error
from ..registry import register
from ._memory import launch_config, stream, to_host, zeros
from .copy import copy_into, describe, flat, is_contiguous

_FAST = (np.dtype(np.float32), np.dtype(np.float64))
_FLOATS = (np.dtype(np.float16),) + _FAST


@cuda.jit
def _unscale_check_kernel(grad, inv_scale, found):
    start = cuda.grid(1)
    step = cuda.gridsize(1)
    for i in range(start, grad.size, step):
        v = grad[i]
        if not math.isfinite(v):
            found[0] = 1
        grad[i] = v * inv_scale


def kernel_specs():
    """The kernel as (label, plain Python function, numba signature) per dtype it
    runs on (float16 gradients run in a float32 copy), for the PTX tests."""
    from numba import types
    return [(f"unscale_check {name}", _unscale_check_kernel.py_func,
             (types.Array(t, 1, "C"), t, types.Array(types.int32, 1, "C")))
            for name, t in (("float32", types.float32), ("float64", types.float64))]


def described_floats(op, arrays, name, dtype_error):
    """[(array, element count, dtype)] of float16/32/64 device arrays, checked: a
    TypeError naming ``name[i]`` for anything else (``dtype_error(op, i, dtype)``
    words the one for another dtype).  Shared with ``grad_norm.py``."""
    out = []
    for i, a in enumerate(arrays):
        try:
            shape, _, dtype = describe(a)
        except Exception:
            raise TypeError(f"{op}: '{name}[{i}]' must be a device array, got "
                            f"{type(a).__name__}") from None
        if dtype not in _FLOATS:
            raise dtype_error(op, i, dtype)
        out.append((a, math.prod(shape), dtype))
    return out


@register("amp_unscale_check", "cuda")
def amp_unscale_check(grads, inv_scale):
    """Multiply every device array of ``grads`` in place by ``inv_scale``; return
    True if any of them held an inf or nan (before the multiplication)."""
    op = "amp_unscale_check"
    inv32 = check_call(op, grads, inv_scale)
    described = described_floats(op, grads, "grads", dtype_error)
    found = zeros(1, np.int32, grads[0] if grads else None)
    for a, n, dtype in described:
        if n == 0:
            continue
        work_dtype = dtype if dtype in _FAST else np.dtype(np.float32)
        in_place = dtype in _FAST and is_contiguous(a)
        work = flat(a) if in_place else flat(a, work_dtype)
        blocks, threads = launch_config(n)
        _unscale_check_kernel[blocks, threads, stream()](work, work_dtype.type(inv32), found)
        if not in_place:
            copy_into(a, work.reshape(a.shape))
    return bool(to_host(found)[0])
