"""float32 activation kernels that vectorize: the scalar definitions of
``kernels/scalar.py`` recompiled with ``math.exp``/``math.erf`` swapped for
the vectorizable ``fast_exp``/``fast_erf``/``fast_tanh`` (see ``fastmath.py``).

The generic ufuncs of ``elementwise.py`` call libm's scalar ``erf``/``exp``
and cannot vectorize (numba's ufunc builder also keeps Python's division
checks); on 2M float32 GELU that is 14 ms against 0.5 ms for PyTorch.  These
loops, used for contiguous float32 inputs of one shape, bring it to about a
millisecond.  The math itself stays in ``scalar.py``: one definition per op.
"""
import math
import types

import numpy as np
from numba import njit, prange

from .. import scalar
from .fastmath import fast_erf, fast_exp, fast_tanh
from .twin import twin

FASTMATH = {"nsz", "arcp", "contract", "afn", "reassoc"}
PARALLEL_MIN = 1 << 19     # below this one thread is faster (2 cores: GELU on 131K, 43 vs 85 us)

_fast_math_module = types.ModuleType("pyflow_fast_math")
_fast_math_module.__dict__.update(math.__dict__)
_fast_math_module.exp, _fast_math_module.erf = fast_exp, fast_erf
_fast_math_module.tanh = fast_tanh


def _f32(v):
    return np.float32(v) if type(v) is float else v


def float32_version(fn):
    """``fn`` compiled in float32 with the fast math functions, for inlining below.

    Python float literals would make numba compute in float64 (and call the exact
    libm functions), so the clone's constants and float globals become float32.
    """
    code = fn.__code__.replace(co_consts=tuple(_f32(c) for c in fn.__code__.co_consts))
    globs = {k: _f32(v) for k, v in fn.__globals__.items()}
    globs["math"] = _fast_math_module
    clone = types.FunctionType(code, globs, fn.__name__ + "_float32")
    return njit(inline="always", error_model="numpy", fastmath=FASTMATH)(clone)


# float32 clones of the scalar functions; the GELU ones are public because
# bias_act.py's fused kernels call them too.
gelu_f32 = float32_version(scalar.gelu)
gelu_tanh_f32 = float32_version(scalar.gelu_tanh)
_silu = float32_version(scalar.silu)
_sigmoid = float32_version(scalar.sigmoid)
gelu_backward_f32 = float32_version(scalar.gelu_backward)
gelu_tanh_backward_f32 = float32_version(scalar.gelu_tanh_backward)
_silu_backward = float32_version(scalar.silu_backward)

UNARY = {"gelu": 0, "gelu_tanh": 1, "silu": 2, "sigmoid": 3}
BINARY = {"gelu_backward": 0, "gelu_tanh_backward": 1, "silu_backward": 2}
JIT = dict(nogil=True, cache=True, error_model="numpy", fastmath=FASTMATH)


# One loop per op inside each kernel, so every loop inlines its function and
# vectorizes.  Each is compiled for the threads and for one (kernels/cpu/twin.py);
# ``run`` picks by PARALLEL_MIN, measured for these cheap loops.
@twin(**JIT)
def _unary(op, x, out):
    n = x.size
    if op == 0:
        for i in prange(n):
            out[i] = gelu_f32(x[i])
    elif op == 1:
        for i in prange(n):
            out[i] = gelu_tanh_f32(x[i])
    elif op == 2:
        for i in prange(n):
            out[i] = _silu(x[i])
    else:
        for i in prange(n):
            out[i] = _sigmoid(x[i])


@twin(**JIT)
def _binary(op, g, x, out):
    n = x.size
    if op == 0:
        for i in prange(n):
            out[i] = gelu_backward_f32(g[i], x[i])
    elif op == 1:
        for i in prange(n):
            out[i] = gelu_tanh_backward_f32(g[i], x[i])
    else:
        for i in prange(n):
            out[i] = _silu_backward(g[i], x[i])


def applies(name, arrays):
    """True when the fast float32 loop can run: contiguous float32 arrays of one shape."""
    if name not in UNARY and name not in BINARY:
        return False
    a = arrays[0]
    return all(type(x) is np.ndarray and x.dtype == np.float32 and x.shape == a.shape
               and x.flags.c_contiguous for x in arrays)


def run(name, arrays, out=None):
    out = np.empty(arrays[0].shape, np.float32) if out is None else out
    flat = [x.reshape(-1) for x in arrays]
    parallel = flat[0].size >= PARALLEL_MIN
    if name in UNARY:
        (_unary.parallel if parallel else _unary.serial)(UNARY[name], flat[0], out.reshape(-1))
    else:
        (_binary.parallel if parallel else _binary.serial)(BINARY[name], flat[0], flat[1],
                                                           out.reshape(-1))
    return out
