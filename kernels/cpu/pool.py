"""2-D pooling kernels (numba).  Every kernel works on planes: the input is
viewed as (P, H, W) with P = N*C, and a ``prange`` over planes gives each
thread whole planes, so backward scatters need no atomics.

* max pooling records, per output, the flat index ``ih*W + iw`` of its
  maximum inside the plane (PyTorch's ``return_indices`` convention); the
  backward scatters through it and its own backward gathers through it.  A
  window lying wholly in the padding (possible with dilation) yields -inf
  and index -1, which the scatter skips (PyTorch returns an index outside
  the plane there); so does a window of -inf values only (PyTorch: its
  first position, which then gets the gradient).  NaN wins over numbers, as in PyTorch.  Speed: the
  data-dependent ``v > best or isnan(v)`` is a branch, mispredicted on about
  half the elements of random data (the MNIST CNN's 64x64x24x24 pool took
  5.8 ms for ~12 MB of traffic).  So the kernels compare with ``>`` alone,
  note whether a plane holds a NaN, and redo such a plane window by window
  with the exact rule (``_max_pool_plane``).  2x2 windows with stride 2
  (``max_pool2d(x, 2)``) have an unrolled kernel whose selects compile to
  max/cmov instructions, no branch (~9x faster); the general loop keeps
  some branches (~1.5-2x).
* average pooling (fixed and adaptive) takes its windows as tables computed by
  the op: rows ``[h_start[oh], h_end[oh])``, columns ``[w_start[ow], w_end[ow])``
  and a divisor per output.  One kernel then serves ``avg_pool2d`` (padding,
  ``ceil_mode``, ``count_include_pad``, ``divisor_override``) and
  ``adaptive_avg_pool2d`` alike.
"""
import math

import numpy as np
from numba import njit, prange

from ..registry import register
from .twin import twin


@njit(nogil=True, cache=True)
def _max_pool_plane(x, p, kh, kw, sh, sw, ph, pw, dh, dw, out, idx):
    """Plane ``p``, window by window, with the NaN rule: the exact reference,
    which the kernels below redo a plane with when it holds a NaN."""
    H, W = x.shape[1], x.shape[2]
    Ho, Wo = out.shape[1], out.shape[2]
    for oh in range(Ho):
        h0 = oh * sh - ph
        for ow in range(Wo):
            w0 = ow * sw - pw
            best = -np.inf
            where = -1
            for i in range(kh):
                ih = h0 + i * dh
                if ih < 0 or ih >= H:
                    continue
                for j in range(kw):
                    iw = w0 + j * dw
                    if iw < 0 or iw >= W:
                        continue
                    v = x[p, ih, iw]
                    if v > best or math.isnan(v):    # NaN wins, like PyTorch
                        best = v
                        where = ih * W + iw
            out[p, oh, ow] = best
            idx[p, oh, ow] = where


@twin(nogil=True, cache=True)
def _max_pool(x, kh, kw, sh, sw, ph, pw, dh, dw, out, idx):
    """Any window.  Compares with ``>`` alone and notes whether the plane holds
    a NaN: without NaN that is the reference's rule, and one comparison
    mispredicts less than ``v > best or isnan(v)`` (the ``best`` carried
    through the window loop still costs LLVM a branch).  A plane with a NaN
    is redone by ``_max_pool_plane``."""
    P, H, W = x.shape
    _, Ho, Wo = out.shape
    ninf = out.dtype.type(-np.inf)
    for p in prange(P):
        nan = False
        for oh in range(Ho):
            h0 = oh * sh - ph
            for ow in range(Wo):
                w0 = ow * sw - pw
                best = ninf
                where = -1
                for i in range(kh):
                    ih = h0 + i * dh
                    if ih < 0 or ih >= H:
                        continue
                    for j in range(kw):
                        iw = w0 + j * dw
                        if iw < 0 or iw >= W:
                            continue
                        v = x[p, ih, iw]
                        t = v > best
                        best = v if t else best
                        where = ih * W + iw if t else where
                        nan |= v != v
                out[p, oh, ow] = best
                idx[p, oh, ow] = where
        if nan:
            _max_pool_plane(x, p, kh, kw, sh, sw, ph, pw, dh, dw, out, idx)


@twin(nogil=True, cache=True)
def _max_pool_2x2(x, out, idx):
    """2x2 windows, stride 2, no padding or dilation, every window inside the
    plane (the common ``max_pool2d(x, 2)``): the four elements unrolled in the
    reference's order, so no loop carries ``best`` and LLVM keeps the selects
    as max/cmov instructions, not branches (~5x faster than the loop above).
    A plane with a NaN is redone by ``_max_pool_plane``."""
    P, H, W = x.shape
    _, Ho, Wo = out.shape
    ninf = out.dtype.type(-np.inf)
    for p in prange(P):
        nan = False
        for oh in range(Ho):
            ih = 2 * oh
            for ow in range(Wo):
                iw = 2 * ow
                k = ih * W + iw
                a = x[p, ih, iw]
                t = a > ninf
                best = a if t else ninf
                where = k if t else -1
                b = x[p, ih, iw + 1]
                t = b > best
                best = b if t else best
                where = k + 1 if t else where
                c = x[p, ih + 1, iw]
                t = c > best
                best = c if t else best
                where = k + W if t else where
                d = x[p, ih + 1, iw + 1]
                t = d > best
                best = d if t else best
                where = k + W + 1 if t else where
                out[p, oh, ow] = best
                idx[p, oh, ow] = where
                nan |= (a != a) | (b != b) | (c != c) | (d != d)
        if nan:
            _max_pool_plane(x, p, 2, 2, 2, 2, 0, 0, 1, 1, out, idx)


@twin(size_of=2, nogil=True, cache=True)
def _scatter_planes(g, idx, out):
    """out (P, HW) = 0; out[p, idx[p, l]] += g[p, l]."""
    P, L = g.shape
    for p in prange(P):
        for k in range(out.shape[1]):
            out[p, k] = 0
        for l in range(L):
            k = idx[p, l]
            if k >= 0:
                out[p, k] += g[p, l]


@twin(nogil=True, cache=True, error_model="numpy")  # 0/0 -> nan, like PyTorch
def _avg_pool(x, hs, he, ws, we, div, out):
    P = x.shape[0]
    Ho, Wo = div.shape
    for p in prange(P):
        for oh in range(Ho):
            for ow in range(Wo):
                acc = 0.0
                for ih in range(hs[oh], he[oh]):
                    for iw in range(ws[ow], we[ow]):
                        acc += x[p, ih, iw]
                out[p, oh, ow] = acc / div[oh, ow]


@twin(size_of=6, nogil=True, cache=True, error_model="numpy")
def _avg_pool_backward(g, hs, he, ws, we, div, out):
    P, H, W = out.shape
    Ho, Wo = div.shape
    for p in prange(P):
        for ih in range(H):
            for iw in range(W):
                out[p, ih, iw] = 0
        for oh in range(Ho):
            for ow in range(Wo):
                v = g[p, oh, ow] / div[oh, ow]
                for ih in range(hs[oh], he[oh]):
                    for iw in range(ws[ow], we[ow]):
                        out[p, ih, iw] += v


def _planes(x):
    """(N, C, H, W) -> contiguous (N*C, H, W)."""
    return np.ascontiguousarray(x).reshape((-1,) + x.shape[-2:])


def is_2x2(kernel_size, stride, padding, dilation, in_hw, out_hw):
    """Whether ``_max_pool_2x2`` computes this pooling: 2x2 windows, stride 2,
    no padding or dilation, and every window inside the plane (``ceil_mode``
    can add a last window that hangs over the edge)."""
    return tuple(kernel_size) == (2, 2) and tuple(stride) == (2, 2) and \
        tuple(padding) == (0, 0) and tuple(dilation) == (1, 1) and \
        2 * out_hw[0] <= in_hw[0] and 2 * out_hw[1] <= in_hw[1]


@register("max_pool2d", "cpu")
def max_pool2d(x, kernel_size, stride, padding, dilation, out_hw):
    """x (N, C, H, W) -> (values, int64 flat indices into each H*W plane)."""
    lead = x.shape[:-2]
    xp = _planes(x)
    out = np.empty((xp.shape[0],) + tuple(out_hw), x.dtype)
    idx = np.empty(out.shape, np.int64)
    if is_2x2(kernel_size, stride, padding, dilation, xp.shape[1:], out_hw):
        _max_pool_2x2(xp, out, idx)
    else:
        _max_pool(xp, kernel_size[0], kernel_size[1], stride[0], stride[1], padding[0],
                  padding[1], dilation[0], dilation[1], out, idx)
    return out.reshape(lead + tuple(out_hw)), idx.reshape(lead + tuple(out_hw))


@register("pool_scatter", "cpu")
def pool_scatter(g, idx, in_hw):
    """Backward of max pooling: add each g into the input position idx names."""
    lead = g.shape[:-2]
    gp = np.ascontiguousarray(g).reshape(-1, g.shape[-2] * g.shape[-1])
    ip = np.ascontiguousarray(idx).reshape(gp.shape)
    out = np.empty((gp.shape[0], in_hw[0] * in_hw[1]), g.dtype)
    _scatter_planes(gp, ip, out)
    return out.reshape(lead + tuple(in_hw))


@register("pool_gather", "cpu")
def pool_gather(x, idx):
    """Adjoint of pool_scatter: out[..., l] = x[..., idx[..., l]] within each plane."""
    xp = x.reshape(x.shape[:-2] + (-1,))
    ip = idx.reshape(idx.shape[:-2] + (-1,))
    return np.take_along_axis(xp, np.maximum(ip, 0), axis=-1).reshape(idx.shape)


@register("avg_pool2d", "cpu")
def avg_pool2d(x, windows):
    """windows = (h_start, h_end, w_start, w_end, divisor (Ho, Wo)); see module doc."""
    hs, he, ws, we, div = windows
    lead = x.shape[:-2]
    xp = _planes(x)
    out = np.empty((xp.shape[0],) + div.shape, x.dtype)
    _avg_pool(xp, hs, he, ws, we, div, out)
    return out.reshape(lead + div.shape)


@register("avg_pool2d_backward", "cpu")
def avg_pool2d_backward(g, windows, in_hw):
    hs, he, ws, we, div = windows
    lead = g.shape[:-2]
    gp = _planes(g)
    out = np.empty((gp.shape[0],) + tuple(in_hw), g.dtype)
    _avg_pool_backward(gp, hs, he, ws, we, div, out)
    return out.reshape(lead + tuple(in_hw))
