"""2-D pooling on the GPU: one thread per output element (grid-stride loops).

Same conventions as ``kernels/cpu/pool.py``: arrays are (..., H, W) planes
(one or two leading dims), max pooling records the flat index ``ih*W + iw``
of each maximum in its plane (-1 for a window wholly in the padding; NaN
wins over numbers), average pooling reads its windows from the tables the op
computes (``h_start, h_end, w_start, w_end, divisor``), copied to the device
once per call as one int64 table and one divisor array.

The backward kernels scatter: one thread per output gradient adds it into
the input positions its window covers, with ``cuda.atomic.add`` because
windows may overlap (stride < kernel size).  ``pool_gather`` (the adjoint of
the max scatter) is a plain gather.  Inputs may be strided views: every
kernel takes a 1-D span of the array plus its element strides.
"""
import numpy as np
from numba import cuda
from numba import types as nbtypes

from ..registry import register
from ._memory import empty, launch_config, simulated, stream, to_device, zeros
from . import layout

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_NUMBA = {np.dtype(np.float32): nbtypes.float32, np.dtype(np.float64): nbtypes.float64}
_INDEX = np.dtype(np.int64)


def _grid(n):
    """Launch size of a grid-stride loop; tiny under the simulator (1 OS thread per thread)."""
    if simulated():
        return min(2, -(-n // 32)) or 1, 32
    return launch_config(n)


# ------------------------------------------------------------------ kernels
# Every array argument is a 1-D span; ``lay`` = (offset, s_lead0, s_lead1, s_h, s_w)
# in elements and ``shape`` = (lead0, lead1, h, w) of that array.
def max_pool_function(dtype):
    neg_inf = np.dtype(dtype).type(-np.inf)

    def max_pool(x, x_lay, x_shape, geo, out, idx):
        P1, P2, H, W = x_shape
        kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo = geo
        for e in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            ow = e % Wo
            t = e // Wo
            oh = t % Ho
            t = t // Ho
            base = x_lay[0] + (t // P2) * x_lay[1] + (t % P2) * x_lay[2]
            h0 = oh * sh - ph
            w0 = ow * sw - pw
            best = neg_inf
            where = -1
            for i in range(kh):
                ih = h0 + i * dh
                if ih < 0 or ih >= H:
                    continue
                for j in range(kw):
                    iw = w0 + j * dw
                    if iw < 0 or iw >= W:
                        continue
                    v = x[base + ih * x_lay[3] + iw * x_lay[4]]
                    if v > best or v != v:           # NaN wins, like PyTorch
                        best = v
                        where = ih * W + iw
            out[e] = best
            idx[e] = where
    return max_pool


def scatter_function():
    def pool_scatter(g, g_lay, idx, i_lay, shape, hw, out):
        """out[plane, idx] += g over every (plane, oh, ow) of ``shape``; out pre-zeroed."""
        P1, P2, Ho, Wo = shape
        for e in range(cuda.grid(1), P1 * P2 * Ho * Wo, cuda.gridsize(1)):
            ow = e % Wo
            t = e // Wo
            oh = t % Ho
            p = t // Ho
            p1 = p // P2
            p2 = p - p1 * P2
            k = idx[i_lay[0] + p1 * i_lay[1] + p2 * i_lay[2] + oh * i_lay[3] + ow * i_lay[4]]
            if k >= 0 and k < hw:
                cuda.atomic.add(out, p * hw + k,
                                g[g_lay[0] + p1 * g_lay[1] + p2 * g_lay[2] + oh * g_lay[3]
                                  + ow * g_lay[4]])
    return pool_scatter


def gather_function():
    def pool_gather(x, x_lay, w, idx, i_lay, shape, out):
        """out[plane, oh, ow] = x[plane, max(idx, 0)] (idx flat in a plane of width w)."""
        P1, P2, Ho, Wo = shape
        for e in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            ow = e % Wo
            t = e // Wo
            oh = t % Ho
            p = t // Ho
            p1 = p // P2
            p2 = p - p1 * P2
            k = idx[i_lay[0] + p1 * i_lay[1] + p2 * i_lay[2] + oh * i_lay[3] + ow * i_lay[4]]
            if k < 0:
                k = 0
            ih = k // w
            out[e] = x[x_lay[0] + p1 * x_lay[1] + p2 * x_lay[2] + ih * x_lay[3]
                       + (k - ih * w) * x_lay[4]]
    return pool_gather


def avg_pool_function(dtype):
    zero = np.dtype(dtype).type(0)

    def avg_pool(x, x_lay, x_shape, table, div, Ho, Wo, out):
        """table = h_start | h_end (Ho each) | w_start | w_end (Wo each); div (Ho*Wo,)."""
        P2 = x_shape[1]
        for e in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            ow = e % Wo
            t = e // Wo
            oh = t % Ho
            t = t // Ho
            base = x_lay[0] + (t // P2) * x_lay[1] + (t % P2) * x_lay[2]
            acc = zero
            for ih in range(table[oh], table[Ho + oh]):
                for iw in range(table[2 * Ho + ow], table[2 * Ho + Wo + ow]):
                    acc += x[base + ih * x_lay[3] + iw * x_lay[4]]
            out[e] = acc / div[oh * Wo + ow]
    return avg_pool


def avg_backward_function():
    def avg_pool_backward(g, g_lay, shape, table, div, H, W, out):
        """out (planes, H, W) pre-zeroed += each g / divisor over its window."""
        P1, P2, Ho, Wo = shape
        for e in range(cuda.grid(1), P1 * P2 * Ho * Wo, cuda.gridsize(1)):
            ow = e % Wo
            t = e // Wo
            oh = t % Ho
            p = t // Ho
            p1 = p // P2
            v = g[g_lay[0] + p1 * g_lay[1] + (p - p1 * P2) * g_lay[2] + oh * g_lay[3]
                  + ow * g_lay[4]] / div[oh * Wo + ow]
            for ih in range(table[oh], table[Ho + oh]):
                for iw in range(table[2 * Ho + ow], table[2 * Ho + Wo + ow]):
                    cuda.atomic.add(out, (p * H + ih) * W + iw, v)
    return avg_pool_backward


def signatures(dtype):
    """name -> (plain kernel function, numba signature) for every pooling kernel."""
    arr = _NUMBA[np.dtype(dtype)][::1]
    ind = nbtypes.int64[::1]
    i64 = nbtypes.int64
    tup = lambda n: nbtypes.UniTuple(i64, n)  # noqa: E731
    return {
        "max_pool": (max_pool_function(dtype), (arr, tup(5), tup(4), tup(10), arr, ind)),
        "pool_scatter": (scatter_function(), (arr, tup(5), ind, tup(5), tup(4), i64, arr)),
        "pool_gather": (gather_function(), (arr, tup(5), i64, ind, tup(5), tup(4), arr)),
        "avg_pool": (avg_pool_function(dtype), (arr, tup(5), tup(4), ind, arr, i64, i64, arr)),
        "avg_pool_backward": (avg_backward_function(),
                              (arr, tup(5), tup(4), ind, arr, i64, i64, arr)),
    }


_kernels = {}


def _kernel(name, dtype):
    key = (name, np.dtype(dtype))
    k = _kernels.get(key)
    if k is None:
        k = _kernels[key] = cuda.jit(signatures(dtype)[name][0])
    return k


# ------------------------------------------------------------------ host side
def _planes(arrays, what):
    """Arrays (..., h, w) sharing their leading dims -> [(span, lay)], shape4 per array.

    The leading dims are merged where every array allows it (at most 2 may
    remain), so all arrays index planes the same way."""
    described = [layout.describe(x) for x in arrays]
    lead = tuple(described[0][0][:-2])
    strides = []
    for x, (shape, st, dtype), name in zip(arrays, described, what):
        if len(shape) < 2 or tuple(shape[:-2]) != lead:
            raise ValueError(f"{name} must be (..., H, W) with leading dims {lead}, got "
                             f"shape {tuple(shape)}")
        strides.append(layout.element_strides(shape, st, dtype, tuple(shape), name))
    merged, lead_st = layout.coalesce(list(lead), [st[:-2] for st in strides])
    if len(merged) > 2:
        raise ValueError(f"{what[0]}: at most 2 leading dims before (H, W) are supported, "
                         f"got shape {tuple(described[0][0])}")
    pad = 2 - len(merged)
    merged = (1,) * pad + tuple(merged)
    result, shapes = [], []
    for x, (shape, st, dtype), full, lst in zip(arrays, described, strides, lead_st):
        if x.size:
            span, off = layout.span(x, shape, st, dtype)
        else:
            span, off = empty((0,), dtype, x), 0
        result.append((span, (off,) + (0,) * pad + tuple(lst) + tuple(full[-2:])))
        shapes.append(merged + tuple(shape[-2:]))
    return result, shapes


def _check(op, x, what, dtypes=DTYPES):
    if not hasattr(x, "dtype") or not hasattr(x, "shape"):
        raise TypeError(f"{op}: {what} must be a device array, got {type(x).__name__}")
    if np.dtype(x.dtype) not in dtypes:
        raise TypeError(f"{op}: no CUDA kernel for {what} of dtype {x.dtype}; supported: "
                        f"{[str(d) for d in dtypes]}")
    if x.ndim < 2:
        raise ValueError(f"{op}: {what} must be (..., H, W), got shape {tuple(x.shape)}")
    return np.dtype(x.dtype)


def _in(a):
    """Simulator: read-only operands are copied in only (they may be broadcast views)."""
    return cuda.In(a) if isinstance(a, np.ndarray) else a


def _tables(windows, dtype, like):
    hs, he, ws, we, div = (np.asarray(t) for t in windows)
    table = to_device(np.concatenate([hs, he, ws, we]).astype(np.int64), like)
    return table, to_device(np.ascontiguousarray(div, dtype=dtype).reshape(-1), like), div.shape


@register("max_pool2d", "cuda")
def max_pool2d(x, kernel_size, stride, padding, dilation, out_hw):
    """x (N, C, H, W) -> (values, int64 flat indices into each H*W plane)."""
    dtype = _check("max_pool2d", x, "input")
    out_shape = tuple(x.shape[:-2]) + tuple(out_hw)
    out, idx = empty(out_shape, dtype, x), empty(out_shape, _INDEX, x)
    if out.size:
        [(span, lay)], [shape] = _planes([x], ["input"])
        geo = (kernel_size[0], kernel_size[1], stride[0], stride[1], padding[0], padding[1],
               dilation[0], dilation[1], out_hw[0], out_hw[1])
        blocks, threads = _grid(out.size)
        _kernel("max_pool", dtype)[blocks, threads, stream()](
            _in(span), lay, shape, geo, out.reshape(-1), idx.reshape(-1))
    return out, idx


@register("pool_scatter", "cuda")
def pool_scatter(g, idx, in_hw):
    """Backward of max pooling: add each g into the input position idx names."""
    dtype = _check("pool_scatter", g, "grad")
    _check("pool_scatter", idx, "indices", (_INDEX,))
    if tuple(idx.shape) != tuple(g.shape):
        raise ValueError(f"pool_scatter: indices shape {tuple(idx.shape)} must equal the "
                         f"gradient's {tuple(g.shape)}")
    out = zeros(tuple(g.shape[:-2]) + tuple(in_hw), dtype, g)
    if g.size and out.size:
        [(g_span, g_lay), (i_span, i_lay)], [shape, _] = _planes([g, idx], ["grad", "indices"])
        blocks, threads = _grid(g.size)
        _kernel("pool_scatter", dtype)[blocks, threads, stream()](
            _in(g_span), g_lay, _in(i_span), i_lay, shape, in_hw[0] * in_hw[1],
            out.reshape(-1))
    return out


@register("pool_gather", "cuda")
def pool_gather(x, idx):
    """Adjoint of pool_scatter: out[..., l] = x[..., idx[..., l]] within each plane."""
    dtype = _check("pool_gather", x, "input")
    _check("pool_gather", idx, "indices", (_INDEX,))
    if tuple(idx.shape[:-2]) != tuple(x.shape[:-2]):
        raise ValueError(f"pool_gather: indices {tuple(idx.shape)} and input "
                         f"{tuple(x.shape)} must share their leading dims")
    out = empty(tuple(idx.shape), dtype, x)
    if out.size:
        [(x_span, x_lay), (i_span, i_lay)], [x_shape, shape] = _planes([x, idx],
                                                                       ["input", "indices"])
        blocks, threads = _grid(out.size)
        _kernel("pool_gather", dtype)[blocks, threads, stream()](
            _in(x_span), x_lay, x_shape[3], _in(i_span), i_lay, shape, out.reshape(-1))
    return out


@register("avg_pool2d", "cuda")
def avg_pool2d(x, windows):
    """windows = (h_start, h_end, w_start, w_end, divisor (Ho, Wo)); see kernels/cpu/pool.py."""
    dtype = _check("avg_pool2d", x, "input")
    table, div, (Ho, Wo) = _tables(windows, dtype, x)
    out = empty(tuple(x.shape[:-2]) + (Ho, Wo), dtype, x)
    if out.size:
        [(span, lay)], [shape] = _planes([x], ["input"])
        blocks, threads = _grid(out.size)
        _kernel("avg_pool", dtype)[blocks, threads, stream()](
            _in(span), lay, shape, _in(table), _in(div), Ho, Wo, out.reshape(-1))
    return out


@register("avg_pool2d_backward", "cuda")
def avg_pool2d_backward(g, windows, in_hw):
    dtype = _check("avg_pool2d_backward", g, "grad")
    table, div, (Ho, Wo) = _tables(windows, dtype, g)
    if tuple(g.shape[-2:]) != (Ho, Wo):
        raise ValueError(f"avg_pool2d_backward: grad of shape {tuple(g.shape)} does not match "
                         f"the windows' output size {(Ho, Wo)}")
    out = zeros(tuple(g.shape[:-2]) + tuple(in_hw), dtype, g)
    if g.size and out.size:
        [(span, lay)], [shape] = _planes([g], ["grad"])
        blocks, threads = _grid(g.size)
        _kernel("avg_pool_backward", dtype)[blocks, threads, stream()](
            _in(span), lay, shape, _in(table), _in(div), in_hw[0], in_hw[1], out.reshape(-1))
    return out
