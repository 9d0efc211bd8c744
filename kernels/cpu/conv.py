"""2-D convolution as im2col + GEMM (numba for the data movement, BLAS for the math),
or, for the 3x3 layers ``direct_ok`` picks, the direct kernels of ``conv_direct.py``.

Layout: ``cols`` is (C*kh*kw, N*Ho*Wo).  Row ``(c, i, j)`` holds input channel
``c`` seen through kernel tap ``(i, j)`` at every output position of every
image, so

* the whole batch is one GEMM per group: ``W_g (Og, Kg) @ cols_g (Kg, N*L)``
  (a group's rows are one contiguous block of ``cols``);
* im2col/col2im write and read contiguous runs along the output width, and a
  ``prange`` over (image, channel) pairs gives each thread its own rows of
  ``cols`` and its own plane of the input gradient: no races, no atomics.

The GEMM result is (O, N, L); one strided copy (with the bias fused in) turns
it into (N, O, L).  The backward turns ``grad_out`` into (O, N*L) once and
uses it for the weight gradient (``g @ cols.T``, BLAS reads the transpose in
place), the input gradient (``W.T @ g`` then col2im) and the bias gradient.

3x3 convolutions of enough channels and pixels skip im2col altogether: the
direct kernels of ``conv_direct.py`` read the input where it lies, with a
register tile of output pixels x 16 output channels (``direct_ok`` says
which; this path stays the reference and the fallback for every other case).

A 1x1 convolution with stride 1 and no padding needs no im2col: per image,
``y[n] = W @ x[n]`` is a GEMM on the NCHW layout itself, and the input
gradient ``gx[n] = W.T @ gy[n]`` likewise, so one batched GEMM replaces
im2col, the output transpose and col2im.  Per-image GEMMs are small when the
image is: below ``POINTWISE_MIN_PIXELS`` output pixels the one big GEMM of
im2col wins (ResNet-50's 1x1 convolutions, batch 8: 16x16 maps 710 -> 370 us
forward, 2x2 maps 595 -> 1303 us).  Most of ResNet's convolutions are 1x1.

``padding`` is (top, left); bottom/right padding is implied by the output size
(it may differ from top/left for ``padding='same'``), and im2col's bounds check
writes the zeros of every side.
"""
import os

import numpy as np
from numba import njit, prange

from ..registry import register
from . import blas, conv_direct


@njit(nogil=True, cache=True)
def _valid_range(n_out, stride, offset, size):
    """Output positions o in [lo, hi) with 0 <= o*stride + offset < size."""
    lo = 0
    if offset < 0:
        lo = (-offset + stride - 1) // stride
    hi = 0
    if size - offset > 0:
        hi = (size - offset + stride - 1) // stride
    if hi > n_out:
        hi = n_out
    if lo > hi:
        lo = hi
    return lo, hi


@njit(nogil=True, cache=True, parallel=True)
def im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, cols):
    """x (N, C, H, W) contiguous -> cols (C*kh*kw, N*Ho*Wo)."""
    N, C, H, W = x.shape
    L = Ho * Wo
    for nc in prange(N * C):
        n = nc // C
        c = nc % C
        for i in range(kh):
            oh_lo, oh_hi = _valid_range(Ho, sh, i * dh - ph, H)
            for j in range(kw):
                row = (c * kh + i) * kw + j
                ow_lo, ow_hi = _valid_range(Wo, sw, j * dw - pw, W)
                for oh in range(Ho):
                    base = n * L + oh * Wo
                    if oh < oh_lo or oh >= oh_hi:
                        for ow in range(Wo):
                            cols[row, base + ow] = 0
                        continue
                    ih = oh * sh - ph + i * dh
                    for ow in range(ow_lo):
                        cols[row, base + ow] = 0
                    iw0 = j * dw - pw
                    for ow in range(ow_lo, ow_hi):
                        cols[row, base + ow] = x[n, c, ih, ow * sw + iw0]
                    for ow in range(ow_hi, Wo):
                        cols[row, base + ow] = 0


@njit(nogil=True, cache=True, parallel=True)
def col2im(cols, kh, kw, sh, sw, ph, pw, dh, dw, Ho, Wo, out):
    """Adjoint of im2col: scatter-add cols (C*kh*kw, N*Ho*Wo) into out (N, C, H, W)."""
    N, C, H, W = out.shape
    L = Ho * Wo
    for nc in prange(N * C):
        n = nc // C
        c = nc % C
        for ih in range(H):
            for iw in range(W):
                out[n, c, ih, iw] = 0
        for i in range(kh):
            oh_lo, oh_hi = _valid_range(Ho, sh, i * dh - ph, H)
            for j in range(kw):
                row = (c * kh + i) * kw + j
                ow_lo, ow_hi = _valid_range(Wo, sw, j * dw - pw, W)
                iw0 = j * dw - pw
                for oh in range(oh_lo, oh_hi):
                    ih = oh * sh - ph + i * dh
                    base = n * L + oh * Wo
                    for ow in range(ow_lo, ow_hi):
                        out[n, c, ih, ow * sw + iw0] += cols[row, base + ow]


POINTWISE_MIN_PIXELS = 16


def _pointwise(w_shape, stride, padding, groups, out_hw):
    """True for a 1x1, stride-1, unpadded convolution worth per-image GEMMs."""
    return (w_shape[2] == 1 and w_shape[3] == 1 and tuple(stride) == (1, 1)
            and tuple(padding) == (0, 0) and groups == 1
            and out_hw[0] * out_hw[1] >= POINTWISE_MIN_PIXELS)


def _im2col(x, kh, kw, stride, padding, dilation, out_hw):
    N, C = x.shape[:2]
    cols = np.empty((C * kh * kw, N * out_hw[0] * out_hw[1]), x.dtype)
    im2col(np.ascontiguousarray(x), kh, kw, stride[0], stride[1], padding[0], padding[1],
           dilation[0], dilation[1], out_hw[0], out_hw[1], cols)
    return cols


# PYFLOW_CONV_DIRECT=0 (or DIRECT = False) sends every convolution to im2col:
# the reference path, for comparisons and benchmarks.
DIRECT = os.environ.get("PYFLOW_CONV_DIRECT", "1").strip() != "0"


def direct_ok(x_shape, w_shape, stride, padding, dilation, groups, out_hw, dtype):
    """True when the direct kernels (``conv_direct.py``) take this convolution:
    3x3, stride 1 or 2, any padding, groups 1, no dilation, float32/float64,
    and, measured (bench/conv.py, AMD EPYC, one and two threads):

    * a reduction C*9 of at least ``conv_direct.SHORT_REDUCTION`` (64) and
      ``2 * N*Ho*Wo >= O``: below that many output pixels, packing the weights
      costs as much as the im2col matrix saves (512->512 at 4x4, forward, one
      thread: batch 16 22.8 against 27.1 ms im2col, batch 8 even, batch 1 6.8
      against 2.6 ms);
    * or a short reduction at stride 1 with output rows of at least 16 floats
      (``conv_direct.row_wise``: ResNet's 3-channel stem, the MNIST CNN's
      1-channel conv1), whose forward runs along rows.  Their input gradient
      (rarely wanted: they read the data) keeps GEMM + col2im, see
      ``conv2d_backward``.

    1x1 convolutions stay with im2col or the per-image GEMMs of ``_pointwise``:
    their "im2col" is a strided copy of x, and on ResNet-18's stride-2
    downsamples the direct kernels were 10-40% slower at one thread (0-30%
    faster at two; a few ms of a step either way).  The rule reads shapes
    only, not the thread count, so the forward and the backward of a
    convolution, every rank and every run agree.
    """
    O, Cg, kh, kw = w_shape
    if not (DIRECT and groups == 1 and (kh, kw) == (3, 3) and tuple(dilation) == (1, 1)
            and max(stride) <= 2 and x_shape[0] > 0
            and np.dtype(dtype) in (np.float32, np.float64)):
        return False
    reduction = Cg * kh * kw
    if reduction >= conv_direct.SHORT_REDUCTION:
        return 2 * x_shape[0] * out_hw[0] * out_hw[1] >= O
    return conv_direct.row_wise(reduction, stride, out_hw[1], dtype)


@register("conv2d", "cpu")
def conv2d(x, w, bias, stride, padding, dilation, groups, out_hw, keep_cols):
    """x (N, C, H, W), w (O, C/groups, kh, kw), bias (O,) or None -> (y, cols or None)."""
    N = x.shape[0]
    O, Cg, kh, kw = w.shape
    Ho, Wo = out_hw
    if direct_ok(x.shape, w.shape, stride, padding, dilation, groups, out_hw, x.dtype):
        return conv_direct.forward(x, w, bias, stride, padding, dilation, out_hw), None
    if _pointwise(w.shape, stride, padding, groups, out_hw):
        y = np.empty((N, O, Ho, Wo), x.dtype)
        blas.matmul(w.reshape(O, Cg), np.ascontiguousarray(x).reshape(N, Cg, Ho * Wo),
                    out=y.reshape(N, O, Ho * Wo))
        if bias is not None:
            y += bias.reshape(1, O, 1, 1)
        return y, None          # the backward reads x itself
    cols = _im2col(x, kh, kw, stride, padding, dilation, out_hw)
    Og, Kg = O // groups, Cg * kh * kw
    w2 = w.reshape(O, Kg)
    prod = np.empty((O, N * Ho * Wo), x.dtype)
    for g in range(groups):
        blas.matmul(w2[g * Og:(g + 1) * Og], cols[g * Kg:(g + 1) * Kg],
                  out=prod[g * Og:(g + 1) * Og])
    y = np.empty((N, O, Ho, Wo), x.dtype)
    src = prod.reshape(O, N, Ho, Wo).transpose(1, 0, 2, 3)
    if bias is None:
        np.copyto(y, src)
    else:
        np.add(src, bias.reshape(1, O, 1, 1), out=y)
    return y, (cols if keep_cols else None)


@register("conv2d_backward", "cpu")
def conv2d_backward(x, w, gy, cols, x_shape, w_shape, stride, padding, dilation, groups,
                    need_input, need_weight, need_bias):
    """Gradients (input, weight, bias) of conv2d; each is None unless asked for.

    ``x`` is only read (through im2col or the direct kernels) when the weight
    gradient is needed and ``cols`` was not kept by the forward; ``w`` only for
    the input gradient.
    """
    N, O, Ho, Wo = gy.shape
    dt = gy.dtype
    direct = direct_ok(x_shape, w_shape, stride, padding, dilation, groups, (Ho, Wo), dt)
    if not direct and _pointwise(w_shape, stride, padding, groups, (Ho, Wo)):
        return _pointwise_backward(x, w, gy, x_shape, w_shape, need_input, need_weight,
                                   need_bias)
    # A direct forward keeps no im2col matrix; one passed in anyway is read by the GEMM.
    direct_w = direct and cols is None
    # A short reduction (3 input channels) leaves the direct input gradient's 16
    # lanes mostly empty: 6.1 against 3.2 ms for ResNet's stem; GEMM + col2im.
    direct_x = direct and w_shape[1] * w_shape[2] * w_shape[3] >= conv_direct.SHORT_REDUCTION
    gx = gw = gb = None
    g2 = None
    if (need_weight and not direct_w) or (need_input and not direct_x) or \
            (need_bias and not direct):
        g2 = np.empty((O, N * Ho * Wo), dt)       # grad_out as (O, N*L): one copy, used 3x
        g2.reshape(O, N, Ho, Wo)[...] = gy.transpose(1, 0, 2, 3)
    if need_bias:
        gb = gy.sum(axis=(0, 2, 3)) if g2 is None else g2.sum(axis=1)
    if need_weight and direct_w:
        gw = conv_direct.weight_grad(x, gy, w_shape, stride, padding, dilation)
    elif need_weight:
        if cols is None:
            cols = _im2col(x, w_shape[2], w_shape[3], stride, padding, dilation, (Ho, Wo))
        K = cols.shape[0]
        Og, Kg = O // groups, K // groups
        # g2_g @ cols_g.T straight into the weight's (O, K) layout.  Computing the
        # transpose and copying it back costs far more than it saves: the copy
        # walks memory across rows (a (4608, 512) weight: 17 ms against 0.6 ms).
        # Allocated in the weight's own shape and written through an (O, Kg) view,
        # so the gradient owns its memory: autograd copies a view before storing it
        # in .grad (a 94 MB copy a step for ResNet-50's conv weights).
        gw = np.empty(w_shape, dt)
        gw2 = gw.reshape(O, Kg)
        for g in range(groups):
            blas.matmul(g2[g * Og:(g + 1) * Og], cols[g * Kg:(g + 1) * Kg].T,
                        out=gw2[g * Og:(g + 1) * Og])
    if need_input and direct_x:
        gx = conv_direct.input_grad(gy, w, x_shape, stride, padding, dilation)
    elif need_input:
        _, Cg, kh, kw = w_shape
        Og, Kg = O // groups, Cg * kh * kw
        w2 = w.reshape(O, Kg)
        gcols = np.empty((groups * Kg, N * Ho * Wo), dt)
        for g in range(groups):
            blas.matmul(w2[g * Og:(g + 1) * Og].T, g2[g * Og:(g + 1) * Og],
                      out=gcols[g * Kg:(g + 1) * Kg])
        gx = np.empty(x_shape, dt)
        col2im(gcols, kh, kw, stride[0], stride[1], padding[0], padding[1],
               dilation[0], dilation[1], Ho, Wo, gx)
    return gx, gw, gb


def _pointwise_backward(x, w, gy, x_shape, w_shape, need_input, need_weight, need_bias):
    """conv2d_backward of a 1x1 convolution (``_pointwise``), on the NCHW layout."""
    N, O, Ho, Wo = gy.shape
    C, L, dt = w_shape[1], Ho * Wo, gy.dtype
    gy3 = np.ascontiguousarray(gy).reshape(N, O, L)
    gx = gw = gb = None
    if need_bias:
        gb = gy3.sum(axis=(0, 2))
    if need_weight:
        x3 = np.ascontiguousarray(x).reshape(N, C, L)
        gw = np.empty(w_shape, dt)
        if O * C <= L * (O + C):    # N small products, summed: less memory than two transposes
            per = np.empty((N, O, C), dt)
            blas.matmul(gy3, x3.transpose(0, 2, 1), out=per)
            np.sum(per, axis=0, out=gw.reshape(O, C))
        else:                       # one GEMM over every pixel of every image
            g2 = np.ascontiguousarray(gy3.transpose(1, 0, 2)).reshape(O, N * L)
            x2 = np.ascontiguousarray(x3.transpose(1, 0, 2)).reshape(C, N * L)
            blas.matmul(g2, x2.T, out=gw.reshape(O, C))
    if need_input:
        gx = np.empty(x_shape, dt)
        blas.matmul(w.reshape(O, C).T, gy3, out=gx.reshape(N, C, L))
    return gx, gw, gb
