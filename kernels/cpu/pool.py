"""2-D pooling kernels (numba).  Every kernel works on planes: the input is
viewed as (P, H, W) with P = N*C, and a ``prange`` over planes gives each
thread whole planes, so backward scatters need no atomics.

* max pooling records, per output, the flat index ``ih*W + iw`` of its
  maximum inside the plane (PyTorch's ``return_indices`` convention); the
  backward scatters through it and its own backward gathers through it.  A
  window lying wholly in the padding (possible with dilation) yields -inf
  and index -1, which the scatter skips (PyTorch returns an index outside
  the plane there).  NaN wins over numbers, as in PyTorch.
* average pooling (fixed and adaptive) takes its windows as tables computed by
  the op: rows ``[h_start[oh], h_end[oh])``, columns ``[w_start[ow], w_end[ow])``
  and a divisor per output.  One kernel then serves ``avg_pool2d`` (padding,
  ``ceil_mode``, ``count_include_pad``, ``divisor_override``) and
  ``adaptive_avg_pool2d`` alike.
"""
import math

import numpy as np
from numba import prange

from ..registry import register
from .twin import twin


@twin(nogil=True, cache=True)
def _max_pool(x, kh, kw, sh, sw, ph, pw, dh, dw, out, idx):
    P, H, W = x.shape
    _, Ho, Wo = out.shape
    for p in prange(P):
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


@register("max_pool2d", "cpu")
def max_pool2d(x, kernel_size, stride, padding, dilation, out_hw):
    """x (N, C, H, W) -> (values, int64 flat indices into each H*W plane)."""
    lead = x.shape[:-2]
    xp = _planes(x)
    out = np.empty((xp.shape[0],) + tuple(out_hw), x.dtype)
    idx = np.empty(out.shape, np.int64)
    _max_pool(xp, kernel_size[0], kernel_size[1], stride[0], stride[1], padding[0], padding[1],
              dilation[0], dilation[1], out, idx)
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
