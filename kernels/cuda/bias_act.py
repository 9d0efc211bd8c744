"""bias_add + GELU on the GPU (numba.cuda): the twins of ``kernels/cpu/bias_act.py``.

``bias_gelu``: one grid-stride kernel, ``gelu(x + b[e % n])`` per element, the
GELU being the device function ``elementwise.py`` builds from the same scalar
definition the CPU kernels use (float32 data computed in float32).
``bias_gelu_backward``: one grid-stride kernel for ``dx = g * gelu'(x + b)``,
then the bias gradient as the column sums of dx by the ``sum`` reduction
kernel (deterministic, float32 data summed in float32, as that kernel does).
Where the CPU kernel adds each row into the sums while it is in cache, a GPU
keeps the two launches: the column sum is a reduction with its own launch
shape, and dx passes through L2 between them.
"""
import numpy as np
from numba import cuda

from ..cpu.bias_act import check_bias_gelu
from ..registry import register
from ._memory import empty, launch_config, stream
from .copy import contiguous, describe, read_only, size_of
from .elementwise import device_function
from .reduce import sum_

_ACTIVATIONS = {"none": "gelu", "tanh": "gelu_tanh"}


def forward_function(name, dtype):
    """The forward kernel of activation ``name`` on ``dtype`` data (a fresh function
    with its own device function, so the PTX tests compile it as it is)."""
    act = device_function(name, dtype)

    def bias_activation(out, x, b, n, cols):
        for e in range(cuda.grid(1), n, cuda.gridsize(1)):
            out[e] = act(x[e] + b[e % cols])
    return bias_activation


def backward_function(name, dtype):
    """The input-gradient kernel of activation ``name`` on ``dtype`` data."""
    act_backward = device_function(name + "_backward", dtype)

    def bias_activation_backward(dx, g, x, b, n, cols):
        for e in range(cuda.grid(1), n, cuda.gridsize(1)):
            dx[e] = act_backward(g[e], x[e] + b[e % cols])
    return bias_activation_backward


_FACTORIES = {"forward": forward_function, "backward": backward_function}
_jitted = {}


def _kernel(kind, name, dtype):
    key = (kind, name, np.dtype(dtype))
    k = _jitted.get(key)
    if k is None:
        k = _jitted[key] = cuda.jit(_FACTORIES[kind](name, dtype))
    return k


def kernel_specs():
    """(label, plain Python function, numba signature) of every kernel, for the
    PTX tests."""
    from numba import types
    specs = []
    for dtype, t in ((np.float32, types.float32), (np.float64, types.float64)):
        a = types.Array(t, 1, "C")
        for name in _ACTIVATIONS.values():
            specs.append((f"bias_{name} {t}", forward_function(name, dtype),
                          (a, a, a, types.int64, types.int64)))
            specs.append((f"bias_{name}_backward {t}", backward_function(name, dtype),
                          (a, a, a, a, types.int64, types.int64)))
    return specs


def _flat(a):
    return read_only(contiguous(a).reshape(-1))


@register("bias_gelu", "cuda")
def bias_gelu(x, b, approximate="none"):
    """gelu(x + b) for device arrays x (..., n) and b (n,)."""
    shape, _, dtype = describe(x)
    b_shape, _, b_dtype = describe(b)
    check_bias_gelu("bias_gelu", shape, dtype, b_shape, b_dtype, approximate)
    out = empty(tuple(shape), dtype, x)
    n = size_of(out)
    if n:
        blocks, threads = launch_config(n)
        _kernel("forward", _ACTIVATIONS[approximate], dtype)[blocks, threads, stream()](
            out.reshape(-1), _flat(x), _flat(b), n, shape[-1])
    return out


@register("bias_gelu_backward", "cuda")
def bias_gelu_backward(g, x, b, approximate="none"):
    """(dx, db): dx = g * gelu'(x + b), db = dx summed over the rows."""
    shape, _, dtype = describe(x)
    b_shape, _, b_dtype = describe(b)
    g_shape, _, g_dtype = describe(g)
    check_bias_gelu("bias_gelu_backward", shape, dtype, b_shape, b_dtype, approximate,
                    (g_shape, g_dtype))
    dx = empty(tuple(shape), dtype, x)
    n = size_of(dx)
    if n:
        blocks, threads = launch_config(n)
        _kernel("backward", _ACTIVATIONS[approximate], dtype)[blocks, threads, stream()](
            dx.reshape(-1), _flat(g), _flat(x), _flat(b), n, shape[-1])
    return dx, sum_(dx, tuple(range(len(shape) - 1)), False, dtype)
