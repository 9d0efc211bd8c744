"""Elementwise CPU kernels built from the scalar definitions in ``kernels/scalar.py``.

``numba.vectorize`` compiles each scalar function into a real NumPy ufunc, so
broadcasting, strided (non-contiguous) inputs and ``out=`` come from NumPy's
ufunc machinery at NumPy's call overhead (0.25 us on tiny arrays).  A ufunc is
compiled per (op, dtype) on first use and cached on disk.

exp, log, sin, cos and tanh use NumPy's own SIMD ufuncs instead: without SVML
numba calls scalar libm for them, about 5x slower (see ``kernels/cpu/__init__``).
GELU, SiLU and sigmoid on contiguous float32 use the vectorizing loops of
``activation.py`` (same scalar definitions, fast exp/erf).
"""
import numpy as np
from numba import vectorize

from .. import scalar
from ..registry import register
from . import activation

_NUMBA_TYPE = {np.dtype(np.float32): "float32", np.dtype(np.float64): "float64",
               np.dtype(np.int32): "int32", np.dtype(np.int64): "int64",
               np.dtype(np.bool_): "boolean"}
_NUMPY_SIMD = {"exp": np.exp, "log": np.log, "sin": np.sin, "cos": np.cos, "tanh": np.tanh}
_cache = {}


def _signature(kind, nin, t):
    if kind == "compare":
        return f"boolean({','.join([t] * nin)})"
    if kind == "logical":
        return f"boolean({','.join([t] * nin)})"
    if kind == "select":
        return f"{t}(boolean,{t},{t})"
    return f"{t}({','.join([t] * nin)})"


def ufunc(name, np_dtype):
    """The compiled ufunc of op ``name`` for inputs of ``np_dtype``."""
    key = (name, np_dtype)
    u = _cache.get(key)
    if u is None:
        fn, kind = (scalar.UNARY.get(name) or scalar.BINARY.get(name) or scalar.TERNARY[name])
        if np.dtype(np_dtype).kind == "i":
            fn = scalar.INTEGER.get(name, fn)
        nin = fn.__code__.co_argcount
        sig = _signature(kind, nin, _NUMBA_TYPE[np.dtype(np_dtype)])
        u = _cache[key] = vectorize([sig], nopython=True, cache=True)(fn).ufunc
    return u


def _make_kernel(name):
    simd = _NUMPY_SIMD.get(name)
    fast = name in activation.UNARY or name in activation.BINARY
    if simd is None and not fast and name != "where":
        by_dtype = {}           # input dtype -> the ufunc: no (name, dtype) key per call

        def kernel(*arrays, out=None):
            dt = arrays[0].dtype
            u = by_dtype.get(dt)
            if u is None:
                u = by_dtype[dt] = ufunc(name, dt)
            return u(*arrays, out=out)
        kernel.specialize = lambda np_dtype: ufunc(name, np_dtype)
        kernel.__name__ = name
        kernel.__doc__ = f"CPU kernel of {name!r} (ufunc built from kernels.scalar)"
        return kernel

    def kernel(*arrays, out=None):
        if simd is not None:
            return simd(*arrays, out=out)
        if fast and activation.applies(name, arrays) and (
                out is None or out.flags.c_contiguous and out.dtype == np.float32):
            return activation.run(name, arrays, out)
        dt = arrays[-1].dtype if name == "where" else arrays[0].dtype
        return ufunc(name, dt)(*arrays, out=out)

    def specialize(np_dtype):
        """The kernel for arrays of ``np_dtype`` only, with the choices above made
        now: the ufunc itself where no faster loop can apply (a compiled graph
        resolves its kernels once, pyflow.graph.kernel_ops)."""
        if simd is not None:
            return simd
        if fast or name == "where":
            return kernel
        return ufunc(name, np_dtype)
    kernel.specialize = specialize
    kernel.__name__ = name
    kernel.__doc__ = f"CPU kernel of {name!r} (ufunc built from kernels.scalar)"
    return kernel


for _name in (*scalar.UNARY, *scalar.BINARY, *scalar.TERNARY):
    register(_name, "cpu")(_make_kernel(_name))
