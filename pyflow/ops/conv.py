"""2-D convolution and pooling, with PyTorch's signatures and output sizes.

On the CPU a convolution runs on a direct kernel where ``direct_ok`` in
``kernels/cpu/conv.py`` accepts its shape (3x3, stride 1 or 2, any padding,
groups 1, no dilation, float32/float64, and enough work by the measured rule
there: ``kernels/cpu/conv_direct.py``, register tiles of 64-byte vectors, no
im2col matrix), and as im2col + one GEMM per group otherwise (1x1, other
kernels and strides, groups; ``PYFLOW_CONV_DIRECT=0`` sends every shape
there); on CUDA as im2col + GEMM.  The choice is the
kernel's, below this module: the Functions here are the same either way.  The
backward is three differentiable Functions that close under differentiation,
so double backward works:

* ``Conv2d(x, w)``            -> y
* ``Conv2dInputGrad(gy, w)``  -> dL/dx  (= transposed convolution of gy)
* ``Conv2dWeightGrad(x, gy)`` -> dL/dw

All three are bilinear, and the gradient of each is one of the others (see
their ``backward``).  The usual ``loss.backward()`` (no graph recorded for the
backward) takes a fused path instead: one kernel call computes the input,
weight and bias gradients from a single re-layout of ``grad_out``, and reuses
the forward's im2col matrix when it was small enough to keep.

Pooling keeps the max positions (``return_indices``) and scatters through
them; average pooling (fixed and adaptive) is one kernel fed with window
tables computed here, so the PyTorch-specific window arithmetic (padding,
``ceil_mode``, ``count_include_pad``, the adaptive start/end formula) lives in
plain Python next to the op.
"""
from collections import namedtuple

import numpy as np

from .. import dtypes as _dt
from .._hooks import recordable
from ..autograd import Function, is_grad_enabled
from ..tensor import Tensor
from ._util import check_tensor, compute_array, kernel, wrap
from .reduce import sum as _sum
from .shape import squeeze, unsqueeze

__all__ = ["conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"]

# Keep the forward's im2col matrix for the weight gradient when it is at most
# this big; bigger ones (e.g. early ResNet layers at batch 32: ~230 MB each)
# are recomputed in the backward, trading one memory-bound pass for memory.
KEEP_COLS_BYTES = 64 << 20


# ------------------------------------------------------------------ argument checks
def _int(v):
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _pair(v, name, op, minimum):
    """An int or a 1/2-sequence of ints, each >= minimum, as a 2-tuple."""
    if _int(v):
        v = (v, v)
    elif isinstance(v, (tuple, list)) and len(v) in (1, 2) and all(_int(e) for e in v):
        v = tuple(v) * (3 - len(v))
    else:
        raise TypeError(f"{op}(): {name} must be an int or a tuple of 2 ints, got {v!r}")
    if v[0] < minimum or v[1] < minimum:
        what = "positive" if minimum == 1 else "non-negative"
        raise RuntimeError(f"{op}(): {name} must be {what}, got {v}")
    return int(v[0]), int(v[1])


def _check_input(x, op, name="input", empty_channels=False):
    """3-D/4-D floating point ``x`` with non-empty planes (and channels, unless
    ``empty_channels``: adaptive pooling maps 0 channels to 0 channels, as PyTorch)."""
    check_tensor(x, name, op)
    if x.ndim not in (3, 4):
        raise RuntimeError(f"{op}(): expected a 3-D (unbatched) or 4-D (batched) {name}, got "
                           f"a {x.ndim}-D tensor of shape {tuple(x.shape)}")
    if not x.dtype.is_floating_point:
        raise RuntimeError(f"{op}(): expected a floating point {name}, got {x.dtype}")
    if x.shape[-1] == 0 or x.shape[-2] == 0:
        raise RuntimeError(f"{op}(): expected {name} with non-zero height and width, got shape "
                           f"{tuple(x.shape)}")
    if x.shape[-3] == 0 and not empty_channels:
        raise RuntimeError(f"{op}(): expected {name} with non-zero channels, height and width, "
                           f"got shape {tuple(x.shape)}")


def _as_float(t, dt):
    return t if t.dtype is dt else t.to(dt)


# ------------------------------------------------------------------ convolution
# padding is (top, left); the output size fixes bottom/right (see kernels/cpu/conv.py)
ConvGeometry = namedtuple("ConvGeometry", "x_shape w_shape out_hw stride padding dilation groups")


def _conv_forward(x, w, b, geo, keep_cols):
    dt = x.dtype
    for t in (w, b):
        dt = dt if t is None else _dt.promote_types(dt, t.dtype)
    y, cols = kernel("conv2d", x.device.type)(
        compute_array(x, dt), compute_array(w, dt), None if b is None else compute_array(b, dt),
        geo.stride, geo.padding, geo.dilation, geo.groups, geo.out_hw, keep_cols)
    return wrap(y, dt, x.device), cols, dt


def _conv_backward(x, w, gy, cols, geo, need_x, need_w, need_b):
    """Kernel call for any subset of the three gradients, in gy's compute dtype."""
    dt = gy.dtype if w is None else _dt.promote_types(gy.dtype, w.dtype)
    if x is not None:
        dt = _dt.promote_types(dt, x.dtype)
    gx, gw, gb = kernel("conv2d_backward", gy.device.type)(
        None if x is None or cols is not None else compute_array(x, dt),
        None if w is None else compute_array(w, dt), compute_array(gy, dt), cols,
        geo.x_shape, geo.w_shape, geo.stride, geo.padding, geo.dilation, geo.groups,
        need_x, need_w, need_b)
    return tuple(None if a is None else wrap(a, dt, gy.device) for a in (gx, gw, gb))


class Conv2d(Function):
    autocast = "lower"
    @staticmethod
    def forward(ctx, x, w, b, geo, keep_cols):
        y, cols, dt = _conv_forward(x, w, b, geo, keep_cols)
        ctx.geo, ctx.has_bias = geo, b is not None
        ctx.dtypes = (x.dtype, w.dtype, None if b is None else b.dtype)
        cols_t = None if cols is None else Tensor._make(cols, _dt.from_numpy(cols.dtype), x.device)
        ctx.save_for_backward(x, w, cols_t)   # saved, so freed with the graph
        return y

    @staticmethod
    def backward(ctx, gy):
        x, w, cols_t = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        geo = ctx.geo
        if is_grad_enabled():             # create_graph: differentiable pieces
            gx = Conv2dInputGrad.apply(gy, w, geo) if need_x else None
            gw = Conv2dWeightGrad.apply(x, gy, geo) if need_w else None
            gb = _sum(gy, (0, 2, 3)) if need_b and ctx.has_bias else None
        else:                             # one fused kernel call
            gx, gw, gb = _conv_backward(x if need_w else None, w if need_x else None, gy,
                                        None if cols_t is None else cols_t._data, geo,
                                        need_x, need_w, need_b and ctx.has_bias)
        grads = tuple(None if g is None else _as_float(g, d) for g, d in zip((gx, gw, gb),
                                                                             ctx.dtypes))
        return grads + (None, None)


class Conv2dInputGrad(Function):
    """dL/dx of conv2d given grad_out ``gy`` and weight ``w`` (a transposed conv)."""

    @staticmethod
    def forward(ctx, gy, w, geo):
        ctx.save_for_backward(gy, w)
        ctx.geo = geo
        return _conv_backward(None, w, gy, None, geo, True, False, False)[0]

    @staticmethod
    def backward(ctx, ggx):
        gy, w = ctx.saved_tensors
        d_gy = Conv2d.apply(ggx, w, None, ctx.geo, False) if ctx.needs_input_grad[0] else None
        d_w = Conv2dWeightGrad.apply(ggx, gy, ctx.geo) if ctx.needs_input_grad[1] else None
        return (None if d_gy is None else _as_float(d_gy, gy.dtype),
                None if d_w is None else _as_float(d_w, w.dtype), None)


class Conv2dWeightGrad(Function):
    """dL/dw of conv2d given input ``x`` and grad_out ``gy``."""

    @staticmethod
    def forward(ctx, x, gy, geo):
        ctx.save_for_backward(x, gy)
        ctx.geo = geo
        return _conv_backward(x, None, gy, None, geo, False, True, False)[1]

    @staticmethod
    def backward(ctx, ggw):
        x, gy = ctx.saved_tensors
        d_x = Conv2dInputGrad.apply(gy, ggw, ctx.geo) if ctx.needs_input_grad[0] else None
        d_gy = Conv2d.apply(x, ggw, None, ctx.geo, False) if ctx.needs_input_grad[1] else None
        return (None if d_x is None else _as_float(d_x, x.dtype),
                None if d_gy is None else _as_float(d_gy, gy.dtype), None)


def _conv_padding(padding, stride, dilation, ksize):
    """(top, bottom, left, right) from an int, a pair or 'same'/'valid'."""
    if isinstance(padding, str):
        if padding == "valid":
            return 0, 0, 0, 0
        if padding != "same":
            raise ValueError(f"conv2d(): padding must be an int, a pair of ints, 'valid' or "
                             f"'same', got {padding!r}")
        if stride != (1, 1):
            raise ValueError(f"conv2d(): padding='same' is not supported for strided "
                             f"convolutions (stride={stride})")
        out = []
        for d, k in zip(dilation, ksize):       # PyTorch puts the odd pixel at the end
            total = d * (k - 1)
            out += [total // 2, total - total // 2]
        return tuple(out)
    ph, pw = _pair(padding, "padding", "conv2d", 0)
    return ph, ph, pw, pw


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """torch.nn.functional.conv2d (cross-correlation), batched (N, C, H, W) or
    unbatched (C, H, W) input, weight (O, C/groups, kh, kw)."""
    _check_input(input, "conv2d")
    check_tensor(weight, "weight", "conv2d")
    if weight.ndim != 4:
        raise RuntimeError(f"conv2d(): expected a 4-D weight (out_channels, in_channels/groups, "
                           f"kH, kW), got shape {tuple(weight.shape)}")
    if not _int(groups) or groups < 1:
        raise RuntimeError(f"conv2d(): groups must be a positive int, got {groups!r}")
    unbatched = input.ndim == 3
    x = unsqueeze(input, 0) if unbatched else input
    N, C, H, W = x.shape
    O, Cg, kh, kw = weight.shape
    if kh < 1 or kw < 1:        # nn.Conv2d(3, 4, 0): nothing to convolve, only the bias
        raise RuntimeError(f"conv2d(): kernel size should be greater than zero, but got weight "
                           f"of shape {tuple(weight.shape)} (kernel {kh} x {kw})")
    if O < 1:
        raise RuntimeError(f"conv2d(): expected weight to have at least one output channel "
                           f"(dim 0), got weight of shape {tuple(weight.shape)}")
    if C % groups:
        raise RuntimeError(f"conv2d(): given groups={groups}, expected input with channels "
                           f"divisible by groups, got input of shape {tuple(input.shape)} "
                           f"with {C} channels")
    if O % groups:
        raise RuntimeError(f"conv2d(): given groups={groups}, expected weight to be divisible "
                           f"by {groups} at dimension 0, got weight of shape "
                           f"{tuple(weight.shape)}")
    if Cg * groups != C:
        raise RuntimeError(f"conv2d(): given groups={groups}, weight of shape "
                           f"{tuple(weight.shape)} expects input with {Cg * groups} channels, "
                           f"but input of shape {tuple(input.shape)} has {C} channels")
    if bias is not None:
        check_tensor(bias, "bias", "conv2d")
        if tuple(bias.shape) != (O,):
            raise RuntimeError(f"conv2d(): expected bias of shape ({O},) for weight of shape "
                               f"{tuple(weight.shape)}, got bias of shape {tuple(bias.shape)}")
    for t in (weight, bias):
        if t is not None and t.device != input.device:
            raise RuntimeError(f"conv2d(): expected all tensors on one device, got input on "
                               f"{input.device} and a parameter on {t.device}")
    if not weight.dtype.is_floating_point:
        raise RuntimeError(f"conv2d(): expected a floating point weight, got {weight.dtype}")
    stride = _pair(stride, "stride", "conv2d", 1)
    dilation = _pair(dilation, "dilation", "conv2d", 1)
    pt, pb, pl, pr = _conv_padding(padding, stride, dilation, (kh, kw))
    eff_h, eff_w = dilation[0] * (kh - 1) + 1, dilation[1] * (kw - 1) + 1
    if eff_h > H + pt + pb or eff_w > W + pl + pr:
        raise RuntimeError(f"conv2d(): kernel size can't be greater than the padded input: "
                           f"padded input (per channel) is ({H + pt + pb} x {W + pl + pr}), "
                           f"kernel (with dilation) is ({eff_h} x {eff_w})")
    out_hw = ((H + pt + pb - eff_h) // stride[0] + 1, (W + pl + pr - eff_w) // stride[1] + 1)
    geo = ConvGeometry(tuple(x.shape), tuple(weight.shape), out_hw, stride, (pt, pl),
                       dilation, groups)
    cols_bytes = C * kh * kw * N * out_hw[0] * out_hw[1] * max(x.dtype.compute.itemsize, 4)
    keep_cols = is_grad_enabled() and weight.requires_grad and cols_bytes <= KEEP_COLS_BYTES
    y = Conv2d.apply(x, weight, bias, geo, keep_cols)
    return squeeze(y, 0) if unbatched else y


# ------------------------------------------------------------------ pooling
def _pool_out_size(size, k, pad, stride, dilation, ceil_mode):
    """PyTorch's pooling_output_shape."""
    num = size + 2 * pad - dilation * (k - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = num // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1        # the last window must start inside the input or its left padding
    return out


def _pool_args(input, kernel_size, stride, padding, dilation, ceil_mode, op):
    _check_input(input, op)
    k = _pair(kernel_size, "kernel_size", op, 1)
    s = k if stride is None or (isinstance(stride, (tuple, list)) and len(stride) == 0) \
        else _pair(stride, "stride", op, 1)
    p = _pair(padding, "padding", op, 0)
    d = _pair(dilation, "dilation", op, 1)
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise RuntimeError(f"{op}(): pad should be at most half of kernel size, but got "
                           f"padding={p} and kernel_size={k}")
    H, W = input.shape[-2:]
    out_hw = tuple(_pool_out_size(n, kk, pp, ss, dd, ceil_mode)
                   for n, kk, pp, ss, dd in zip((H, W), k, p, s, d))
    if out_hw[0] < 1 or out_hw[1] < 1:
        raise RuntimeError(f"{op}(): given input of shape {tuple(input.shape)}, the calculated "
                           f"output size {out_hw} is too small (kernel_size={k}, stride={s}, "
                           f"padding={p}, dilation={d})")
    return k, s, p, d, out_hw


class MaxPool2d(Function):
    @staticmethod
    def forward(ctx, x, k, s, p, d, out_hw):
        out, idx = kernel("max_pool2d", x.device.type)(compute_array(x, x.dtype), k, s, p, d,
                                                       out_hw)
        out, idx = wrap(out, x.dtype, x.device), wrap(idx, _dt.int64, x.device)
        ctx.mark_non_differentiable(idx)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(idx)
        ctx.in_hw = tuple(x.shape[-2:])
        return out, idx

    @staticmethod
    def backward(ctx, g, _g_idx):
        (idx,) = ctx.saved_tensors
        gx = None if g is None else PoolScatter.apply(g, idx, ctx.in_hw)
        return gx, None, None, None, None, None


class PoolScatter(Function):
    """Add each value of ``g`` into the input-plane position ``idx`` names."""

    @staticmethod
    def forward(ctx, g, idx, in_hw):
        ctx.save_for_backward(idx)
        return wrap(kernel("pool_scatter", g.device.type)(compute_array(g, g.dtype), idx._data,
                                                          in_hw), g.dtype, g.device)

    @staticmethod
    def backward(ctx, gg):
        (idx,) = ctx.saved_tensors
        return PoolGather.apply(gg, idx), None, None


class PoolGather(Function):
    """Read the input-plane position ``idx`` names: the adjoint of PoolScatter."""

    @staticmethod
    def forward(ctx, x, idx):
        ctx.save_for_backward(idx)
        ctx.in_hw = tuple(x.shape[-2:])
        return wrap(kernel("pool_gather", x.device.type)(compute_array(x, x.dtype), idx._data),
                    x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        (idx,) = ctx.saved_tensors
        return PoolScatter.apply(g, idx, ctx.in_hw), None


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    """torch.nn.functional.max_pool2d; indices are flat positions in each H*W plane."""
    k, s, p, d, out_hw = _pool_args(input, kernel_size, stride, padding, dilation, ceil_mode,
                                    "max_pool2d")
    out, idx = MaxPool2d.apply(input, k, s, p, d, out_hw)
    return (out, idx) if return_indices else out


class AvgPool2d(Function):
    """Mean over the windows of a table (see kernels/cpu/pool.py)."""

    @staticmethod
    def forward(ctx, x, windows):
        ctx.windows, ctx.in_hw = windows, tuple(x.shape[-2:])
        return wrap(kernel("avg_pool2d", x.device.type)(compute_array(x, x.dtype), windows),
                    x.dtype, x.device)

    @staticmethod
    def backward(ctx, g):
        return AvgPool2dBackward.apply(g, ctx.windows, ctx.in_hw), None


class AvgPool2dBackward(Function):
    """Spread each gradient evenly over its window: the adjoint of AvgPool2d."""

    @staticmethod
    def forward(ctx, g, windows, in_hw):
        ctx.windows = windows
        return wrap(kernel("avg_pool2d_backward", g.device.type)(
            compute_array(g, g.dtype), windows, in_hw), g.dtype, g.device)

    @staticmethod
    def backward(ctx, gg):
        return AvgPool2d.apply(gg, ctx.windows), None, None


def _avg_windows(size, k, pad, stride, n_out, count_include_pad):
    """Per output index: clipped [start, end) and the divisor factor, as PyTorch does."""
    start = np.arange(n_out, dtype=np.int64) * stride - pad
    end = np.minimum(start + k, size + pad)
    padded_len = end - start
    start, end = np.maximum(start, 0), np.minimum(end, size)
    return start, end, (padded_len if count_include_pad else end - start)


@recordable(differentiable=True)   # passes its window tables to AvgPool2d as arrays
def avg_pool2d(input, kernel_size, stride=None, padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    """torch.nn.functional.avg_pool2d."""
    k, s, p, _, out_hw = _pool_args(input, kernel_size, stride, padding, 1, ceil_mode,
                                    "avg_pool2d")
    if divisor_override is not None and (not _int(divisor_override) or divisor_override == 0):
        raise RuntimeError(f"avg_pool2d(): divisor_override must be a non-zero int, got "
                           f"{divisor_override!r}")
    H, W = input.shape[-2:]
    hs, he, hdiv = _avg_windows(H, k[0], p[0], s[0], out_hw[0], count_include_pad)
    ws, we, wdiv = _avg_windows(W, k[1], p[1], s[1], out_hw[1], count_include_pad)
    if divisor_override is not None:
        div = np.full(out_hw, float(divisor_override))
    else:
        div = np.outer(hdiv, wdiv).astype(np.float64)
    return AvgPool2d.apply(input, (hs, he, ws, we, div))


@recordable(differentiable=True)   # passes its window tables to AvgPool2d as arrays
def adaptive_avg_pool2d(input, output_size):
    """torch.nn.functional.adaptive_avg_pool2d: window i of n over a side of
    length L is [floor(i*L/n), ceil((i+1)*L/n)); None keeps the input size."""
    if _int(output_size):
        output_size = (output_size, output_size)
    if not isinstance(output_size, (tuple, list)) or len(output_size) != 2 or \
            not all(o is None or _int(o) for o in output_size):
        raise TypeError(f"adaptive_avg_pool2d(): output_size must be an int or a pair of "
                        f"ints/None, got {output_size!r}")
    _check_input(input, "adaptive_avg_pool2d", empty_channels=True)
    H, W = input.shape[-2:]
    oh, ow = (H if output_size[0] is None else int(output_size[0]),
              W if output_size[1] is None else int(output_size[1]))
    if oh < 1 or ow < 1:
        raise RuntimeError(f"adaptive_avg_pool2d(): output_size must be positive, got "
                           f"{tuple(output_size)}")
    i, j = np.arange(oh, dtype=np.int64), np.arange(ow, dtype=np.int64)
    hs, he = (i * H) // oh, -((-(i + 1) * H) // oh)
    ws, we = (j * W) // ow, -((-(j + 1) * W) // ow)
    div = np.outer(he - hs, we - ws).astype(np.float64)
    return AvgPool2d.apply(input, (hs, he, ws, we, div))
