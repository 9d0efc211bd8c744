"""bias_add + GELU (numba): the forward in one pass, and a backward that sums
the bias gradient in the same pass that writes the input's.

``bias_gelu(x, b, approximate)``: ``gelu(x + b)``, x (..., n), b (n,), the
sum rounded to x's dtype before the GELU, as the two separate ops round it.
``bias_gelu_backward(g, x, b, approximate)``: ``dx = g * gelu'(x + b)`` and
``db = dx.sum(0)``.  Written as two ops, the backward reads dx again for the
column sum (one more pass over a (rows, n) tensor) and the forward writes
then reads ``x + b``; here each row of dx is added into a per-chunk float64
accumulator while it is in cache, so forward and backward together move 5
tensors of (rows, n) through memory instead of 8.

float32 uses the vectorizable float32 clones of ``activation.py`` (the same
functions the unfused GELU kernels run, so dx equals theirs), float64 the
exact scalar definitions of ``kernels/scalar.py``; the column sums accumulate
in float64 per chunk of rows, then the chunks are added in order (so the
result does not depend on the thread count, only its last bits on the
summation order, against the unfused op's NumPy sum).
"""
import numpy as np
from numba import njit, prange

from .. import scalar
from ..registry import register
from .activation import JIT, gelu_f32, gelu_backward_f32, gelu_tanh_f32, gelu_tanh_backward_f32
from .twin import row_chunks, twin

_exact = dict(inline="always", error_model="numpy")
_gelu64 = njit(**_exact)(scalar.gelu)
_gelu_tanh64 = njit(**_exact)(scalar.gelu_tanh)
_gelu_backward64 = njit(**_exact)(scalar.gelu_backward)
_gelu_tanh_backward64 = njit(**_exact)(scalar.gelu_tanh_backward)

APPROXIMATE = {"none": 0, "tanh": 1}      # the op code adds 2 for float64 data
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


# One inner loop per op, so each inlines its function and vectorizes.
@twin(size_of=1, **JIT)
def _bias_gelu(op, x, b, out):
    rows, n = x.shape
    for i in prange(rows):
        if op == 0:
            for j in range(n):
                out[i, j] = gelu_f32(x[i, j] + b[j])
        elif op == 1:
            for j in range(n):
                out[i, j] = gelu_tanh_f32(x[i, j] + b[j])
        elif op == 2:
            for j in range(n):
                out[i, j] = _gelu64(x[i, j] + b[j])
        else:
            for j in range(n):
                out[i, j] = _gelu_tanh64(x[i, j] + b[j])


@twin(size_of=2, **JIT)
def _bias_gelu_backward(op, g, x, b, dx, db_parts):
    rows, n = x.shape
    chunks = db_parts.shape[0]
    per = (rows + chunks - 1) // chunks
    for c in prange(chunks):
        acc = db_parts[c]
        for i in range(c * per, min(rows, (c + 1) * per)):
            if op == 0:
                for j in range(n):
                    dx[i, j] = gelu_backward_f32(g[i, j], x[i, j] + b[j])
            elif op == 1:
                for j in range(n):
                    dx[i, j] = gelu_tanh_backward_f32(g[i, j], x[i, j] + b[j])
            elif op == 2:
                for j in range(n):
                    dx[i, j] = _gelu_backward64(g[i, j], x[i, j] + b[j])
            else:
                for j in range(n):
                    dx[i, j] = _gelu_tanh_backward64(g[i, j], x[i, j] + b[j])
            for j in range(n):
                acc[j] += dx[i, j]


def check_bias_gelu(op, x_shape, x_dtype, b_shape, b_dtype, approximate, g=None):
    """The argument rules of both backends (shapes, dtypes as ``np.dtype``)."""
    if np.dtype(x_dtype) not in FLOATS:
        raise TypeError(f"{op}: x must be float32 or float64, got {x_dtype}")
    if len(x_shape) < 1 or tuple(b_shape) != (x_shape[-1],):
        raise ValueError(f"{op}: expected x of shape (..., n) and b of shape (n,), got "
                         f"{tuple(x_shape)} and {tuple(b_shape)}")
    if np.dtype(b_dtype) != np.dtype(x_dtype):
        raise TypeError(f"{op}: b must be {x_dtype} like x, got {b_dtype}")
    if g is not None and (tuple(g[0]) != tuple(x_shape) or np.dtype(g[1]) != np.dtype(x_dtype)):
        raise ValueError(f"{op}: g must be {x_dtype} of x's shape {tuple(x_shape)}, got "
                         f"{g[1]} of shape {tuple(g[0])}")
    if approximate not in APPROXIMATE:
        raise ValueError(f"{op}: approximate must be 'none' or 'tanh', got {approximate!r}")
    return APPROXIMATE[approximate] + (2 if np.dtype(x_dtype) == np.float64 else 0)


def _rows(a):
    """``a`` (contiguous, ``(..., n)``) as (rows, n), a view."""
    return a.reshape(-1, a.shape[-1])


@register("bias_gelu", "cpu")
def bias_gelu(x, b, approximate="none"):
    """gelu(x + b) for x (..., n) and b (n,); the result has x's shape (an array of
    its own, not a view: autograd keeps such a gradient without copying it)."""
    op = check_bias_gelu("bias_gelu", x.shape, x.dtype, b.shape, b.dtype, approximate)
    x, b = np.ascontiguousarray(x), np.ascontiguousarray(b)
    out = np.empty(x.shape, x.dtype)
    if out.size:
        _bias_gelu(op, _rows(x), b, _rows(out))
    return out


@register("bias_gelu_backward", "cpu")
def bias_gelu_backward(g, x, b, approximate="none"):
    """(dx, db): dx = g * gelu'(x + b) (x's shape), db = dx summed over every dim
    but the last."""
    op = check_bias_gelu("bias_gelu_backward", x.shape, x.dtype, b.shape, b.dtype, approximate,
                         (g.shape, g.dtype))
    g, x, b = np.ascontiguousarray(g), np.ascontiguousarray(x), np.ascontiguousarray(b)
    dx = np.empty(x.shape, x.dtype)
    n = x.shape[-1]
    parts = np.zeros((row_chunks(x.size // n if n else 0), n))
    if dx.size:
        _bias_gelu_backward(op, _rows(g), _rows(x), b, _rows(dx), parts)
    return dx, parts.sum(0).astype(x.dtype)
