"""Fused elementwise CUDA kernels: one generated numba.cuda kernel per expression.

The expression format and its scalar source are shared with the CPU backend
(``kernels/cpu/fused.py``: ``scalar_source``): the same generated function is
compiled here with ``cuda.jit(device=True)``, its op calls bound to the device
functions of ``elementwise.device_function`` (float32 clones with libdevice
math for float32), and called from a grid-stride kernel in the two layouts of
``elementwise.py``: ``contiguous`` (every array operand one dense run of the
output's length) and ``strided`` (per-operand element strides over the
coalesced output shape, 0 along broadcast dimensions).  The host side reuses
``elementwise``'s layout helpers (``_describe``, ``_span``,
``_element_strides``, ``_coalesce``).  Number operands are passed to the
kernel as scalars of the data's dtype (no device copy).

Kernels are compiled lazily per (expr, dtype, layout) and cached; outputs are
allocated with ``_memory.empty``.
"""
import functools
import math

import numpy as np
from numba import cuda
from numba import types as nbtypes

from ..cpu.fused import (CONSTANTS, SCALAR_FUNCTIONS, check_operands, describe, n_operands,
                         operand_scalars, scalar_source)
from ..registry import register
from . import elementwise as ew
from . import layout
from ._memory import empty, is_device_array, launch_config
from ._memory import stream as _current_stream

LAYOUTS = ("contiguous", "strided")
_NUMBA_TYPE = {np.dtype(np.float32): nbtypes.float32, np.dtype(np.float64): nbtypes.float64}


def device_namespace(dtype):
    """Globals of the generated source on the GPU: ``f_<op>`` device functions
    (fresh ones: ``compile_ptx`` needs them per compute capability) and the
    constants in ``dtype``."""
    dtype = np.dtype(dtype)
    ns = {k: dtype.type(v) for k, v in CONSTANTS.items()}
    for name in SCALAR_FUNCTIONS:
        ns[f"f_{name}"] = ew.device_function(name, dtype)
    return ns


def device_function(expr, dtype):
    """The ``cuda.jit(device=True)`` function of ``expr``."""
    ns = device_namespace(dtype)
    exec(compile(scalar_source(expr), f"<cuda fused {describe(expr)}>", "exec"), ns)
    return cuda.jit(device=True)(ns["fused"])


def kernel_function(expr, dtype, layout):
    """The plain Python kernel of ``expr`` (not yet ``cuda.jit``-ed); ``compile_ptx`` takes it."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    namespace = {"cuda": cuda, "op": device_function(expr, dtype)}
    source = ew.kernel_source(operand_scalars(expr), layout)
    exec(compile(source, f"<cuda fused {layout} kernel {describe(expr)}>", "exec"), namespace)
    kernel = namespace["kernel"]
    kernel.__name__ = f"fused_{np.dtype(dtype).name}_{layout}"
    return kernel


def kernel_signature(expr, dtype, layout, ndim=3):
    """The numba argument types of a fused kernel (``ndim``: strided layout only)."""
    t = _NUMBA_TYPE[np.dtype(dtype)]
    scalars = operand_scalars(expr)
    if layout == "contiguous":
        return (t[::1], *(t if s else t[::1] for s in scalars))
    dims = nbtypes.UniTuple(nbtypes.int64, ndim)
    args = [t[::1], nbtypes.int64, dims, dims, nbtypes.int64]
    for s in scalars:
        args += [t] if s else [t[::1], dims, nbtypes.int64]
    return tuple(args)


@functools.lru_cache(maxsize=None)
def _kernel(expr, dtype, layout):
    """The compiled kernel, built on first use of (expr, dtype, layout)."""
    return cuda.jit(kernel_function(expr, dtype, layout))


def _is_array(a):
    return isinstance(a, np.ndarray) or is_device_array(a)


def launch(expr, out, *operands, stream=None):
    """Evaluate ``expr`` into ``out``; array operands broadcast to ``out``'s shape."""
    dtype = check_operands(expr, operands, _is_array)
    scalars = operand_scalars(expr)
    described = {k: layout.describe(a) for k, a in enumerate(operands) if not scalars[k]}
    out_shape, out_strides, out_dtype = layout.describe(out)
    if out_dtype != dtype:
        raise TypeError(f"fused_elementwise: out must have dtype {dtype}, got {out_dtype}")
    try:
        shape = np.broadcast_shapes(*(d[0] for d in described.values()))
    except ValueError:
        raise ValueError(f"fused_elementwise: operand shapes "
                         f"{[d[0] for d in described.values()]} are not broadcastable") from None
    if shape != tuple(out_shape):
        raise ValueError(f"fused_elementwise: out has shape {tuple(out_shape)} but the "
                         f"operands broadcast to {shape}")
    n = math.prod(shape)
    if n == 0:
        return out
    arrays = [(out, out_shape, out_strides, out_dtype)] + [
        (operands[k], *described[k]) for k in sorted(described)]
    spans, offsets, strides = [], [], []
    for i, (a, s, st, dt) in enumerate(arrays):
        view, off = layout.span(a, s, st, dt)
        spans.append(view)
        offsets.append(off)
        strides.append(layout.element_strides(s, st, dt, shape, "out" if i == 0 else "operand"))
    if any(st == 0 for st, m in zip(strides[0], shape) if m > 1):
        raise ValueError("fused_elementwise: out must not be a broadcast (expanded) view")
    shape, strides = layout.coalesce(list(shape), strides)
    if isinstance(spans[0], np.ndarray):      # simulator: inputs are copied in only
        spans[1:] = [cuda.In(v) if isinstance(v, np.ndarray) else v for v in spans[1:]]
    values = iter(zip(spans[1:], strides[1:], offsets[1:]))
    blocks, threads = launch_config(n)
    run_on = _current_stream() if stream is None else stream
    if len(shape) <= 1 and all(off == 0 for off in offsets) and \
            all(st == () or st == (1,) for st in strides):
        args = [spans[0]] + [dtype.type(a) if s else next(values)[0]
                             for a, s in zip(operands, scalars)]
        _kernel(expr, dtype, "contiguous")[blocks, threads, run_on](*args)
    else:
        args = [spans[0], n, shape, strides[0], offsets[0]]
        for a, s in zip(operands, scalars):
            if s:
                args.append(dtype.type(a))
            else:
                view, st, off = next(values)
                args += [view, st, off]
        _kernel(expr, dtype, "strided")[blocks, threads, run_on](*args)
    return out


@register("fused_elementwise", "cuda")
def fused_elementwise(expr, *operands, out=None):
    """Evaluate fused expression ``expr`` (see ``kernels/cpu/fused.py``) on device
    arrays and numbers; arrays broadcast as in NumPy."""
    dtype = check_operands(expr, operands, _is_array)
    if out is None:
        scalars = operand_scalars(expr)
        shapes = [layout.describe(a)[0] for a, s in zip(operands, scalars) if not s]
        try:
            shape = np.broadcast_shapes(*shapes)
        except ValueError:
            raise ValueError(f"fused_elementwise: operand shapes {shapes} are not "
                             f"broadcastable") from None
        out = empty(shape, dtype)
    return launch(expr, out, *operands)


__all__ = ["fused_elementwise", "launch", "kernel_function", "kernel_signature", "LAYOUTS",
           "n_operands"]
