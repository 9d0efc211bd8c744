"""Dropout (numba): a mask drawn from counter-based random numbers, and the
masked scaling the backward applies with it.

``dropout_philox(x, p, seed, offset)`` draws the keep mask where the data is,
fused with the scaling, and returns ``(x * keep / (1 - p), keep)``.  Element
``e`` (C order of ``x``'s logical shape) takes 32 random bits from
Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
SC'11; the generator of cuRAND and of PyTorch's CUDA dropout) at

    key     = (seed & 0xffffffff, seed >> 32)
    counter = (e // 4 low word, e // 4 high word, offset low word, offset high word)

and uses output word ``e % 4``; it is kept when ``u = (bits >> 8) * 2**-24``
(a float32 uniform in [0, 1), exact) is ``>= p`` (p rounded to float32).

Why this scheme: the mask is a pure function of (seed, offset, element index).
So no host draw and no host->device copy of a mask are needed on a GPU, every
element can be drawn independently (any thread layout, ``prange`` here, any
grid on the GPU), and the CUDA kernel, which runs the very same ``philox4x32``
function below compiled as a device function, gives bit-identical masks for
one seed on every device.  The op takes a fresh 64-bit seed from a
``pyflow.random`` generator per call, so ``manual_seed`` makes runs
reproducible; ``offset`` lets a caller draw several masks from one seed.

On the CPU the kernel draws the words of 256 groups into a buffer in one loop
that LLVM vectorizes (four Philox calls per AVX2 instruction), then applies the
keep test, as the equivalent integer test ``bits >> 8 >= keep_threshold(p)``,
and the scaling to their 1024 elements; the words and the mask are those above.

``bias_dropout_add_philox(x, bias, residual, p, seed, offset)`` is the same
kernel with a bias added before the mask and a residual after, ``(x + bias)
* keep / (1 - p) + residual`` in one pass over memory instead of three (the
transformer's bias + dropout + residual, OneFlow's fused_bias_add_dropout);
each op rounds as it would alone, so it equals the three kernels bit for bit.

``dropout(x, keep, scale)`` is the masked scaling alone (``x * keep * scale``):
the backward applies it to the gradient with the forward's mask.  Dropped
elements are ``x * 0``, so NaN stays NaN, as in PyTorch.
"""
import math

import numpy as np
from numba import njit, prange

from ..registry import register
from .twin import row_chunks, twin

# Philox-4x32 constants (Random123): round multipliers and Weyl key increments.
_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint64(0x9E3779B9)
_W1 = np.uint64(0xBB67AE85)
_LO32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)
_S8 = np.uint32(8)
ROUNDS = 10


def philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox-4x32-10 of counter (c0..c3) under key (k0, k1); all uint32.

    Plain Python on NumPy scalars, so the same source runs as Python, as a numba
    CPU function and as a CUDA device function.  32x32->64-bit products give the
    hi/lo halves (no mulhi intrinsic needed); every constant is typed uint64 so
    numba never mixes signed and unsigned (which would promote to float64)."""
    for _ in range(ROUNDS):
        p0 = _M0 * np.uint64(c0)
        p1 = _M1 * np.uint64(c2)
        n0 = np.uint32((p1 >> _S32) ^ np.uint64(c1) ^ np.uint64(k0))
        n1 = np.uint32(p1 & _LO32)
        n2 = np.uint32((p0 >> _S32) ^ np.uint64(c3) ^ np.uint64(k1))
        n3 = np.uint32(p0 & _LO32)
        c0, c1, c2, c3 = n0, n1, n2, n3
        k0 = np.uint32((np.uint64(k0) + _W0) & _LO32)
        k1 = np.uint32((np.uint64(k1) + _W1) & _LO32)
    return c0, c1, c2, c3


_philox = njit(nogil=True, cache=True)(philox4x32)
_philox_inline = njit(inline="always")(philox4x32)   # inlined where it loops


def philox_words(counter, key):
    """The four output words of Philox-4x32-10 as Python ints, computed by the
    compiled function the CPU kernel uses (for known-answer tests)."""
    return [int(w) for w in _philox(*(np.uint32(c) for c in counter),
                                    *(np.uint32(k) for k in key))]


def key_words(value, what):
    """A 64-bit seed or offset as its (low, high) uint32 words."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"dropout_philox: {what} must be an int, got {type(value).__name__}")
    v = int(value)
    if not 0 <= v < 1 << 64:
        raise ValueError(f"dropout_philox: {what} must be in [0, 2**64), got {v}")
    return np.uint32(v & 0xFFFFFFFF), np.uint32(v >> 32)


def check_probability(p):
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.integer, np.floating)) \
            or not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout_philox: probability has to be between 0 and 1, but got {p}")
    return 0.0 if p == 1.0 else 1.0 / (1.0 - p)     # p == 1 drops all: u < 1 always


# Philox groups per block of the kernel: their words go to a small buffer, so
# the Philox loop has no per-element bounds tests (the old kernel's branches per
# word) and LLVM vectorizes it (the 32x32->64 products of four groups per AVX2
# vpmuludq); the keep/scale loop then runs over elements.  1024 elements: the
# buffer stays in L1.  (numba hoists the buffer's np.empty out of the prange:
# one buffer per thread.)
_BLOCK = 256


def keep_threshold(p):
    """The integer form of the keep test: ``(bits >> 8) * 2**-24 >= float32(p)``
    holds exactly when ``bits >> 8 >= ceil(float32(p) * 2**24)`` (both sides
    are exact: a 24-bit integer times a power of two, and float32 p times
    2**24 in float64), so the kernel compares integers and never converts."""
    return np.uint32(math.ceil(float(np.float32(p)) * 2.0 ** 24))


@njit(inline="always")
def _philox_block(bits, g0, count, o0, o1, k0, k1):
    """The Philox words of groups g0 .. g0 + count - 1 into ``bits`` (group g's
    word w -> bits[4 (g - g0) + w], element order): one loop without bounds
    tests per word, which LLVM vectorizes (inlined into each kernel's block)."""
    for i in range(count):
        g = g0 + i
        r0, r1, r2, r3 = _philox_inline(np.uint32(g & 0xFFFFFFFF), np.uint32(g >> 32),
                                        o0, o1, k0, k1)
        bits[4 * i] = r0
        bits[4 * i + 1] = r1
        bits[4 * i + 2] = r2
        bits[4 * i + 3] = r3


@twin(nogil=True, cache=True)
def _dropout_philox(x, thr, scale, zero, k0, k1, o0, o1, out, keep):
    """Blocks of ``_BLOCK`` Philox groups in parallel; in each, first the
    Philox words of all its groups (group g's word w -> bits[4 g + w], so bits
    is in element order), then the keep test and scaling per element."""
    n = x.size
    groups = (n + 3) // 4
    for b in prange((groups + _BLOCK - 1) // _BLOCK):
        bits = np.empty(4 * _BLOCK, np.uint32)
        g0 = b * _BLOCK
        _philox_block(bits, g0, min(_BLOCK, groups - g0), o0, o1, k0, k1)
        e0 = 4 * g0
        for i in range(min(4 * _BLOCK, n - e0)):
            k = (bits[i] >> _S8) >= thr
            keep[e0 + i] = k
            out[e0 + i] = x[e0 + i] * (scale if k else zero)


@twin(nogil=True, cache=True)
def _bias_dropout_add_philox(x, b, r, has_b, has_r, thr, scale, zero, k0, k1, o0, o1, out,
                             keep):
    """``_dropout_philox`` with a bias added before the mask (b: one value per
    column of x's last dim) and a residual added after: ``(x + b) * keep *
    scale + r`` in x's dtype, the rounding of the three ops done one by one,
    and the same mask for the same (seed, offset)."""
    n = x.size
    cols = b.size if has_b else 1
    groups = (n + 3) // 4
    for blk in prange((groups + _BLOCK - 1) // _BLOCK):
        bits = np.empty(4 * _BLOCK, np.uint32)
        g0 = blk * _BLOCK
        _philox_block(bits, g0, min(_BLOCK, groups - g0), o0, o1, k0, k1)
        e0 = 4 * g0
        col = e0 % cols          # a column counter: no division per element
        for i in range(min(4 * _BLOCK, n - e0)):
            e = e0 + i
            v = x[e] + b[col] if has_b else x[e]
            k = (bits[i] >> _S8) >= thr
            keep[e] = k
            v = v * (scale if k else zero)
            out[e] = v + r[e] if has_r else v
            col += 1
            if col == cols:
                col = 0


@twin(nogil=True, cache=True)
def _masked_scale(x, keep, scale, out):
    for i in prange(x.size):
        out[i] = x[i] * (scale if keep[i] else 0.0)   # like PyTorch: NaN * 0 stays NaN


@twin(nogil=True, cache=True)
def _masked_scale_column_sums(g, keep, scale, dx, db_parts):
    """``_masked_scale`` on (rows, n) arrays, each row of the result also added
    into its chunk's float64 column sums (the bias gradient)."""
    rows, n = g.shape
    chunks = db_parts.shape[0]
    per = (rows + chunks - 1) // chunks
    for c in prange(chunks):
        acc = db_parts[c]
        for i in range(c * per, min(rows, (c + 1) * per)):
            for j in range(n):
                v = g[i, j] * (scale if keep[i, j] else 0.0)
                dx[i, j] = v
                acc[j] += v


def _check_float(x, op):
    if x.dtype not in (np.float16, np.float32, np.float64):
        raise TypeError(f"{op}: expected a floating point array (float16, float32, float64), "
                        f"got {x.dtype}")


@register("dropout_philox", "cpu")
def dropout_philox(x, p, seed, offset=0):
    """(x * keep / (1 - p), keep) with ``keep`` (bool, x's shape) drawn from
    Philox-4x32-10 at (seed, offset); see the module docstring."""
    _check_float(x, "dropout_philox")
    scale = check_probability(p)
    k0, k1 = key_words(seed, "seed")
    o0, o1 = key_words(offset, "offset")
    dtype = x.dtype
    if dtype == np.float16:
        # numba has no float16 math on the CPU: compute in float32 with the scale
        # rounded to float16, which rounds like the device's float16 product
        # (x * scale is exact in float32, then one rounding to float16).
        scale = np.float16(scale)
    xc = np.ascontiguousarray(x, np.float32 if dtype == np.float16 else dtype)
    out = np.empty(x.shape, xc.dtype)
    keep = np.empty(x.shape, np.bool_)
    if out.size:
        _dropout_philox(xc.reshape(-1), keep_threshold(p), xc.dtype.type(scale), xc.dtype.type(0),
                        k0, k1, o0, o1, out.reshape(-1), keep.reshape(-1))
    return (out if dtype == xc.dtype else out.astype(dtype)), keep


def check_bias_residual(op, shape, dtype, bias_shape, bias_dtype, res_shape, res_dtype):
    """The argument rules of ``bias_dropout_add_philox`` on every backend: a
    bias of x's last dim, a residual of x's shape, both of x's dtype."""
    if bias_shape is not None:
        if not shape or tuple(bias_shape) != (shape[-1],):
            raise ValueError(f"{op}: 'bias' must have shape ({shape[-1] if shape else '?'},) "
                             f"(x's last dim), got {tuple(bias_shape)} for x of shape "
                             f"{tuple(shape)}")
        if bias_dtype != dtype:
            raise TypeError(f"{op}: 'bias' must be {dtype} like x, got {bias_dtype}")
    if res_shape is not None:
        if tuple(res_shape) != tuple(shape):
            raise ValueError(f"{op}: 'residual' must have x's shape {tuple(shape)}, got "
                             f"{tuple(res_shape)}")
        if res_dtype != dtype:
            raise TypeError(f"{op}: 'residual' must be {dtype} like x, got {res_dtype}")


@register("bias_dropout_add_philox", "cpu")
def bias_dropout_add_philox(x, bias, residual, p, seed, offset=0):
    """((x + bias) * keep / (1 - p) + residual, keep), the mask that
    ``dropout_philox`` draws for the same (seed, offset); ``bias`` (x's last
    dim) and ``residual`` (x's shape) may be None.  float16 runs as the three
    separate kernels (numba has no float16 arithmetic to round like them)."""
    op = "bias_dropout_add_philox"
    _check_float(x, op)
    check_bias_residual(op, x.shape, x.dtype, None if bias is None else bias.shape,
                        None if bias is None else bias.dtype,
                        None if residual is None else residual.shape,
                        None if residual is None else residual.dtype)
    scale = check_probability(p)
    if x.dtype == np.float16:
        out, keep = dropout_philox(x if bias is None else x + bias, p, seed, offset)
        return (out if residual is None else out + residual), keep
    k0, k1 = key_words(seed, "seed")
    o0, o1 = key_words(offset, "offset")
    xc = np.ascontiguousarray(x)
    dtype = xc.dtype
    b = np.zeros(1, dtype) if bias is None else np.ascontiguousarray(bias)
    r = np.zeros(1, dtype) if residual is None else np.ascontiguousarray(residual).reshape(-1)
    out = np.empty(x.shape, dtype)
    keep = np.empty(x.shape, np.bool_)
    if out.size:
        _bias_dropout_add_philox(xc.reshape(-1), b, r, bias is not None, residual is not None,
                                 keep_threshold(p), dtype.type(scale), dtype.type(0), k0, k1,
                                 o0, o1, out.reshape(-1), keep.reshape(-1))
    return out, keep


@register("dropout_bias_backward", "cpu")
def dropout_bias_backward(g, keep, scale):
    """The backward of ``bias_dropout_add_philox`` for x and bias: ``(dx, db)``
    with dx = g * keep * scale (g, keep: (..., n)) and db = dx summed over every
    dim but the last, in one pass (float64 sums per chunk of rows, added in order)."""
    op = "dropout_bias_backward"
    _check_float(g, op)
    if g.ndim < 1 or tuple(keep.shape) != tuple(g.shape):
        raise ValueError(f"{op}: g must be (..., n) and keep of its shape, got "
                         f"{tuple(g.shape)} and {tuple(keep.shape)}")
    lead = tuple(range(g.ndim - 1))
    if g.dtype == np.float16:
        dx = dropout(g, keep, scale)
        return dx, dx.sum(lead, dtype=np.float64).astype(np.float16)
    g = np.ascontiguousarray(g)
    dx = np.empty(g.shape, g.dtype)         # x's shape: an array of its own, not a view
    n = g.shape[-1]
    rows = g.size // n if n else 0
    parts = np.zeros((row_chunks(rows), n))
    if g.size:
        _masked_scale_column_sums(g.reshape(rows, n), np.ascontiguousarray(keep).reshape(rows, n),
                                  g.dtype.type(scale), dx.reshape(rows, n), parts)
    return dx, parts.sum(0).astype(g.dtype)


@register("dropout", "cpu")
def dropout(x, keep, scale):
    """x * keep * scale; x and keep (bool) have the same shape."""
    _check_float(x, "dropout")
    if tuple(keep.shape) != tuple(x.shape):
        raise ValueError(f"dropout: keep mask of shape {tuple(keep.shape)} does not match x of "
                         f"shape {tuple(x.shape)}")
    x = np.ascontiguousarray(x)
    out = np.empty(x.shape, x.dtype)
    _masked_scale(x.reshape(-1), np.ascontiguousarray(keep).reshape(-1), x.dtype.type(scale),
                  out.reshape(-1))
    return out
