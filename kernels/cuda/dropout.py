"""Dropout on the GPU: a fused kernel that draws the keep mask on the device
from counter-based random numbers, and the masked scaling the backward uses.

``dropout_philox(x, p, seed, offset=0)`` (registered; the CPU kernel's
signature, plus a keyword-only ``launch`` override for tests) returns
``(x * keep / (1 - p), keep)``.  Element ``e`` (C order of x's logical shape)
takes 32 random bits from Philox-4x32-10 (Salmon et al., SC'11; the generator
of cuRAND and PyTorch's CUDA dropout) at

    key     = (seed & 0xffffffff, seed >> 32)
    counter = (e // 4 low word, e // 4 high word, offset low word, offset high word)

and uses output word ``e % 4``; it is kept when ``u = (bits >> 8) * 2**-24``
(a float32 uniform in [0, 1)) is ``>= p``.  One thread handles a group of 4
elements with one Philox call.

Why: the mask is a pure function of (seed, offset, element index), so nothing
is drawn on the host and no mask crosses the bus (the op used to draw it with
NumPy and upload it), the result does not depend on the grid or block size,
and the round function is the CPU backend's ``philox4x32`` (kernels/cpu/
dropout.py) compiled as a device function, so one seed gives bit-identical
masks on cpu and cuda.  The op takes a fresh 64-bit seed from its generator
per call; ``offset`` (like PyTorch's philox offset) lets one seed give several
masks.

``dropout(x, keep, scale)`` applies a mask the op already has (the backward:
the gradient times the forward's mask and scale).  Like the CPU kernels,
dropped elements are ``x * 0`` (NaN stays NaN, as in PyTorch).  float32 data is
computed in float32 (no float64 literal reaches the kernels: zero and scale
come in as arguments of the data's dtype).
"""
import numpy as np
from numba import cuda

from ..cpu.dropout import check_bias_residual, check_probability, key_words
from ..cpu.dropout import philox4x32 as _philox4x32   # one round function for both backends
from ..registry import register
from ._memory import empty, launch_config, stream, to_host
from .copy import contiguous, describe, read_only, size_of
from .index import on_device
from .reduce import sum_

_FLOATS = tuple(np.dtype(t) for t in (np.float16, np.float32, np.float64))

_S8 = np.uint32(8)
_TWO_M24 = np.float32(2.0 ** -24)


# ------------------------------------------------------------------ kernel factories
def _masked_scale(out, x, keep, scale, zero):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = x[i] * (scale if keep[i] else zero)


def philox_kernel_function():
    """``words(out, c0, c1, c2, c3, k0, k1)``: out[0:4] = Philox-4x32-10 (one thread)."""
    philox = cuda.jit(device=True)(_philox4x32)

    def philox_words(out, c0, c1, c2, c3, k0, k1):
        if cuda.grid(1) == 0:
            r0, r1, r2, r3 = philox(c0, c1, c2, c3, k0, k1)
            out[0] = r0
            out[1] = r1
            out[2] = r2
            out[3] = r3
    return philox_words


def bias_dropout_add_kernel_function():
    """The fused dropout kernel: ``(x + b) * keep * scale + r`` with the mask
    drawn on the device, the CPU kernel's arithmetic and mask, one thread per
    group of 4 elements (one Philox call gives 4 words); the bias is
    ``b[e % cols]``.  ``has_b``/``has_r`` False: b or r is a 1-element dummy,
    and the kernel is plain dropout.  A fresh function with its own Philox
    device function (``compile_ptx`` takes it as it is; ``_jit`` caches one
    jitted copy)."""
    philox = cuda.jit(device=True)(_philox4x32)

    def bias_dropout_add_philox(out, keep, x, b, r, has_b, has_r, n, p, scale, zero, k0, k1,
                                off0, off1):
        cols = b.size if has_b else 1
        for g in range(cuda.grid(1), (n + 3) // 4, cuda.gridsize(1)):
            r0, r1, r2, r3 = philox(np.uint32(g & 0xFFFFFFFF), np.uint32(g >> 32),
                                    off0, off1, k0, k1)
            for lane in range(4):
                e = 4 * g + lane
                if e < n:
                    w = r0 if lane == 0 else (r1 if lane == 1 else (r2 if lane == 2 else r3))
                    k = np.float32(w >> _S8) * _TWO_M24 >= p
                    keep[e] = k
                    v = x[e] + b[e % cols] if has_b else x[e]
                    v = v * (scale if k else zero)
                    out[e] = v + r[e] if has_r else v
    return bias_dropout_add_philox


KERNEL_FACTORIES = {"masked_scale": lambda: _masked_scale,
                    "philox_words": philox_kernel_function,
                    "bias_dropout_add_philox": bias_dropout_add_kernel_function}
_jitted = {}


def _jit(name):
    k = _jitted.get(name)
    if k is None:
        k = _jitted[name] = cuda.jit(KERNEL_FACTORIES[name]())
    return k


def _check_float(x, op):
    dtype = describe(x)[2]
    if dtype not in _FLOATS:
        raise TypeError(f"{op}: expected a floating point array (float16, float32, float64), "
                        f"got {dtype}")
    return dtype


# ------------------------------------------------------------------ kernels
@register("dropout", "cuda")
def dropout(x, keep, scale):
    """x * keep * scale; x and keep (bool, host or device) have the same shape."""
    dtype = _check_float(x, "dropout")
    shape = tuple(describe(x)[0])
    if tuple(describe(keep)[0]) != shape:
        raise ValueError(f"dropout: keep mask of shape {tuple(describe(keep)[0])} does not "
                         f"match x of shape {shape}")
    out = empty(shape, dtype, x)
    if size_of(out):
        xc = contiguous(x).reshape(-1)
        kc = contiguous(on_device(keep, x), np.bool_).reshape(-1)
        blocks, threads = launch_config(size_of(out))
        _jit("masked_scale")[blocks, threads, stream()](
            out.reshape(-1), read_only(xc), read_only(kc), dtype.type(scale), dtype.type(0))
    return out


@register("dropout_bias_backward", "cuda")
def dropout_bias_backward(g, keep, scale):
    """(dx, db): dx = g * keep * scale (g, keep: (..., n)), db = dx summed over
    every dim but the last: the masked-scale kernel, then the ``sum`` kernel."""
    shape = tuple(describe(g)[0])
    if len(shape) < 1 or tuple(describe(keep)[0]) != shape:
        raise ValueError(f"dropout_bias_backward: g must be (..., n) and keep of its shape, "
                         f"got {shape} and {tuple(describe(keep)[0])}")
    dx = dropout(g, keep, scale)
    dtype = describe(g)[2]
    return dx, sum_(dx, tuple(range(len(shape) - 1)), False, dtype)


@register("dropout_philox", "cuda")
def dropout_philox(x, p, seed, offset=0, *, launch=None):
    """(x * keep / (1 - p), keep) with ``keep`` drawn on the device from
    Philox-4x32-10 at (seed, offset) (see the module docstring).  ``launch``
    overrides (blocks, threads); the mask does not depend on it."""
    dtype = _check_float(x, "dropout_philox")
    scale = check_probability(p)
    k0, k1 = key_words(seed, "seed")
    o0, o1 = key_words(offset, "offset")
    shape = tuple(describe(x)[0])
    out = empty(shape, dtype, x)
    keep = empty(shape, np.bool_, x)
    n = size_of(out)
    if n == 0:
        return out, keep
    blocks, threads = launch_config(-(-n // 4)) if launch is None else launch
    xc = contiguous(x).reshape(-1)
    dummy = empty((1,), dtype, x)
    _jit("bias_dropout_add_philox")[blocks, threads, stream()](
        out.reshape(-1), keep.reshape(-1), read_only(xc), dummy, dummy, False, False, n,
        np.float32(p), dtype.type(scale), dtype.type(0), k0, k1, o0, o1)
    return out, keep


@register("bias_dropout_add_philox", "cuda")
def bias_dropout_add_philox(x, bias, residual, p, seed, offset=0, *, launch=None):
    """((x + bias) * keep / (1 - p) + residual, keep): the CPU kernel's values
    and mask, one pass; ``bias`` (x's last dim) and ``residual`` may be None."""
    op = "bias_dropout_add_philox"
    dtype = _check_float(x, op)
    shape = tuple(describe(x)[0])
    described = [None if a is None else describe(a) for a in (bias, residual)]
    check_bias_residual(op, shape, dtype, *(v for d in described
                                            for v in ((None, None) if d is None
                                                      else (tuple(d[0]), d[2]))))
    scale = check_probability(p)
    k0, k1 = key_words(seed, "seed")
    o0, o1 = key_words(offset, "offset")
    out = empty(shape, dtype, x)
    keep = empty(shape, np.bool_, x)
    n = size_of(out)
    if n == 0:
        return out, keep
    dummy = empty((1,), dtype, x)
    b = dummy if bias is None else contiguous(bias).reshape(-1)
    r = dummy if residual is None else contiguous(residual).reshape(-1)
    blocks, threads = launch_config(-(-n // 4)) if launch is None else launch
    _jit("bias_dropout_add_philox")[blocks, threads, stream()](
        out.reshape(-1), keep.reshape(-1), read_only(contiguous(x).reshape(-1)), read_only(b),
        read_only(r), bias is not None, residual is not None, n, np.float32(p),
        dtype.type(scale), dtype.type(0), k0, k1, o0, o1)
    return out, keep


def philox4x32(counter, key, like=None):
    """Philox-4x32-10 of four uint32 counter words under two key words, computed
    by the device function the dropout kernel uses (for known-answer tests)."""
    from ._memory import zeros
    out = zeros(4, np.uint32, like)
    c = [np.uint32(v) for v in counter]
    k = [np.uint32(v) for v in key]
    _jit("philox_words")[1, 32, stream()](out, *c, *k)
    return [int(v) for v in to_host(out)]
