"""Loss kernels (numba.cuda): fused log_softmax + NLL (cross entropy), NLL
gather/scatter, and binary cross entropy with logits.

Same calls and results as ``kernels/cpu/loss.py``:

* ``cross_entropy``: one block per row of logits x (M, C).  One pass over
  the row keeps each thread's online (max, sum of exp(x - max)) pair and,
  with label smoothing, the sums of w[c] * x[c] and of w[c]; block
  reductions merge them, and thread 0 writes the row's loss and its
  log-sum-exp (saved for the backward).  Log-probabilities are never stored.
* ``cross_entropy_backward``: one block per row rebuilds softmax from the
  saved log-sum-exp in the pass that writes dx.
* ``nll_loss`` / ``nll_loss_backward``: one thread per row gathers
  -w[t] * x[t] (x may be any strided view); the backward writes every element
  of dx once (zero or -w[t] * g), so no separate zero fill is needed.
* ``bce_with_logits``: a grid-stride loop over the broadcast shape of x, y and
  pos_weight with per-operand strides (the index math of the elementwise
  kernels), writing the loss and softplus(-x) in the stable form
  log1p(exp(-|x|)) + max(-x, 0).

Targets equal to ignore_index give loss 0 and gradient 0.  Other targets are
validated by the ops; should one outside [0, C) still arrive, its loss is NaN
and its gradient row is NaN rather than a read outside the row.
"""
import math

import numpy as np
from numba import cuda
from numba import types as nbtypes

from ..registry import register
from . import layout
from ._memory import empty, launch_config, stream
from .rows import (FLOAT_DTYPES, MAX_WARPS, NUMBA_FLOAT, as_input, check_float, contiguous,
                      device_helpers, row_blocks, row_threads, table)


# ------------------------------------------------------------------ kernel functions
def _cross_entropy_forward(dtype):
    """loss_i = (1-e) * w[t] * (lse - x[t]) + e/C * sum_c w[c] * (lse - x[c])."""
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero, one, neg_inf, nan = acc(0), acc(1), acc(-np.inf), acc(np.nan)
    helpers = device_helpers(acc)
    block_max_sum, block_sum = helpers["block_max_sum"], helpers["block_sum"]
    safe_log = helpers["safe_log"]

    def cross_entropy_forward(x, target, w, has_w, ignore_index, smoothing, loss, lse):
        shm = cuda.shared.array(MAX_WARPS, nb)
        shs = cuda.shared.array(MAX_WARPS, nb)
        rows, C = x.shape
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        smooth = smoothing > zero
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            m, s, wx, ws = neg_inf, zero, zero, zero
            for c in range(tid, C, nt):
                v = x[r, c]
                if v > m:
                    s = s * math.exp(m - v) + one
                    m = v
                elif m != neg_inf or v != v:
                    s += math.exp(v - m)
                if smooth:
                    wc = w[c] if has_w else one
                    wx += wc * v
                    ws += wc
            m, s = block_max_sum(m, s, shm, shs)
            if smooth:
                wx = block_sum(wx, shm)
                ws = block_sum(ws, shm)
            if tid == 0:
                l = m + safe_log(s)
                lse[r] = l
                t = target[r]
                if t == ignore_index:
                    loss[r] = zero
                elif t < 0 or t >= C:
                    loss[r] = nan
                else:
                    v = (one - smoothing) * (w[t] if has_w else one) * (l - x[r, t])
                    if smooth:
                        v += smoothing / acc(C) * (ws * l - wx)
                    loss[r] = v
    cross_entropy_forward.__name__ = f"cross_entropy_forward_{dtype.name}"
    return cross_entropy_forward


def _cross_entropy_backward(dtype):
    """dx = g_i * ((1-e) * w[t] * (p - onehot(t)) + e/C * (sum(w) * p - w))."""
    acc, nb = dtype.type, NUMBA_FLOAT[dtype]
    zero, one, nan = acc(0), acc(1), acc(np.nan)
    block_sum = device_helpers(acc)["block_sum"]

    def cross_entropy_backward(g, x, target, w, has_w, ignore_index, smoothing, lse, dx):
        sh = cuda.shared.array(MAX_WARPS, nb)
        rows, C = x.shape
        tid, nt = cuda.threadIdx.x, cuda.blockDim.x
        for r in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            t = target[r]          # the same for the whole block: branches stay uniform
            if t == ignore_index:
                for c in range(tid, C, nt):
                    dx[r, c] = zero
                continue
            if t < 0 or t >= C:
                for c in range(tid, C, nt):
                    dx[r, c] = nan
                continue
            wsum = acc(C)
            if has_w and smoothing > zero:
                ws = zero
                for c in range(tid, C, nt):
                    ws += w[c]
                wsum = block_sum(ws, sh)
            a = g[r] * (one - smoothing) * (w[t] if has_w else one)
            b = g[r] * smoothing / acc(C)
            pw = a + b * wsum
            l = lse[r]
            for c in range(tid, C, nt):
                d = pw * math.exp(x[r, c] - l) - b * (w[c] if has_w else one)
                if c == t:
                    d -= a
                dx[r, c] = d
    cross_entropy_backward.__name__ = f"cross_entropy_backward_{dtype.name}"
    return cross_entropy_backward


def _nll_forward(dtype):
    acc = dtype.type
    zero, one, nan = acc(0), acc(1), acc(np.nan)

    def nll_forward(x, x_off, row_st, col_st, C, target, w, has_w, ignore_index, loss):
        """x is a flat span; element (i, c) is x[x_off + i*row_st + c*col_st]."""
        for i in range(cuda.grid(1), loss.shape[0], cuda.gridsize(1)):
            t = target[i]
            if t == ignore_index:
                loss[i] = zero
            elif t < 0 or t >= C:
                loss[i] = nan
            else:
                loss[i] = -(w[t] if has_w else one) * x[x_off + i * row_st + t * col_st]
    nll_forward.__name__ = f"nll_forward_{dtype.name}"
    return nll_forward


def _nll_backward(dtype):
    acc = dtype.type
    zero, one, nan = acc(0), acc(1), acc(np.nan)

    def nll_backward(g, target, w, has_w, ignore_index, dx):
        M, C = dx.shape
        for e in range(cuda.grid(1), M * C, cuda.gridsize(1)):
            i = e // C
            c = e - i * C
            t = target[i]
            if t == ignore_index or (c != t and t >= 0 and t < C):
                dx[i, c] = zero
            elif c == t:
                dx[i, c] = -(w[t] if has_w else one) * g[i]
            else:
                dx[i, c] = nan
    nll_backward.__name__ = f"nll_backward_{dtype.name}"
    return nll_backward


def _bce_with_logits(dtype):
    acc = dtype.type
    zero, one = acc(0), acc(1)

    def bce_with_logits(out, n, shape, x, x_st, x_off, y, y_st, y_off, pw, pw_st, pw_off,
                        has_pw, sp, write_sp):
        """out (contiguous, flat) = (1-y)*x + (1 + (pw-1)*y) * softplus(-x); sp the same
        flat index's softplus(-x) when x has out's shape."""
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            rem = i
            px = x_off
            py = y_off
            pp = pw_off
            for d in range(len(shape) - 1, -1, -1):
                q = rem // shape[d]
                j = rem - q * shape[d]
                rem = q
                px += j * x_st[d]
                py += j * y_st[d]
                pp += j * pw_st[d]
            xv = x[px]
            yv = y[py]
            spv = math.log1p(math.exp(-abs(xv))) + max(-xv, zero)
            lw = one + (pw[pp] - one) * yv if has_pw else one
            out[i] = (one - yv) * xv + lw * spv
            if write_sp:
                sp[i] = spv
    bce_with_logits.__name__ = f"bce_with_logits_{dtype.name}"
    return bce_with_logits


def _softplus_neg(dtype):
    zero = dtype.type(0)

    def softplus_neg(sp, n, shape, x, x_st, x_off):
        for i in range(cuda.grid(1), n, cuda.gridsize(1)):
            rem = i
            px = x_off
            for d in range(len(shape) - 1, -1, -1):
                q = rem // shape[d]
                j = rem - q * shape[d]
                rem = q
                px += j * x_st[d]
            xv = x[px]
            sp[i] = math.log1p(math.exp(-abs(xv))) + max(-xv, zero)
    softplus_neg.__name__ = f"softplus_neg_{dtype.name}"
    return softplus_neg


_FACTORIES = {"cross_entropy_forward": _cross_entropy_forward,
              "cross_entropy_backward": _cross_entropy_backward,
              "nll_forward": _nll_forward, "nll_backward": _nll_backward,
              "bce_with_logits": _bce_with_logits, "softplus_neg": _softplus_neg}


def _signature(kind, dtype, ndim=2):
    t = NUMBA_FLOAT[dtype]
    v, m2 = t[::1], t[:, ::1]
    i64, flag, idx = nbtypes.int64, nbtypes.boolean, nbtypes.int64[::1]
    dims = nbtypes.UniTuple(i64, ndim)
    return {"cross_entropy_forward": (m2, idx, v, flag, i64, t, v, v),
            "cross_entropy_backward": (v, m2, idx, v, flag, i64, t, v, m2),
            "nll_forward": (v, i64, i64, i64, i64, idx, v, flag, i64, v),
            "nll_backward": (v, idx, v, flag, i64, m2),
            "bce_with_logits": (v, i64, dims, v, dims, i64, v, dims, i64, v, dims, i64, flag,
                                v, flag),
            "softplus_neg": (v, i64, dims, v, dims, i64)}[kind]


def kernel_specs():
    """Every kernel of this module as (label, fresh Python function, numba signature)."""
    return [(f"{kind} {dtype.name}", factory(dtype), _signature(kind, dtype))
            for kind, factory in _FACTORIES.items() for dtype in FLOAT_DTYPES]


_kernels = {}


def _kernel(kind, dtype):
    k = _kernels.get((kind, dtype))
    if k is None:
        k = _kernels[(kind, dtype)] = cuda.jit(_FACTORIES[kind](dtype))
    return k


# ------------------------------------------------------------------ host side
def _check_rows(x, target, op):
    if len(x.shape) != 2:
        raise ValueError(f"{op}: x must be 2-D (M, C), got shape {tuple(x.shape)}")
    if tuple(target.shape) != (x.shape[0],):
        raise ValueError(f"{op}: target must have shape ({x.shape[0]},) (one class index per "
                         f"row of x {tuple(x.shape)}), got {tuple(target.shape)}")
    if np.dtype(target.dtype).kind not in "iu":
        raise TypeError(f"{op}: target must hold integer class indices, got {target.dtype}")


def _weight(w, C, dtype, like, op):
    """(class weights as a contiguous (C,) array, are they given)."""
    if w is None:
        return like, False
    if tuple(w.shape) != (C,):
        raise ValueError(f"{op}: weight must have shape ({C},), got {tuple(w.shape)}")
    return table(w, dtype, like), True


def _per_row(a, rows, dtype, like, op, what):
    if a.size != rows:
        raise ValueError(f"{op}: {what} must have {rows} elements (one per row), got shape "
                         f"{tuple(a.shape)}")
    return table(a, dtype, like).reshape(rows)


@register("cross_entropy", "cuda")
def cross_entropy(x, target, w, ignore_index, smoothing):
    """x (M, C) logits, target (M,) int64 (validated), w (C,) or None.
    Returns per-row losses (M,) and log-sum-exps (M,)."""
    op = "cross_entropy"
    _check_rows(x, target, op)
    dtype = check_float(x, op)
    x = contiguous(x)
    rows, C = x.shape
    loss, lse = empty(rows, dtype, x), empty(rows, dtype, x)
    if rows == 0:
        return loss, lse
    target = table(target, np.int64, x)
    w_arr, has_w = _weight(w, C, dtype, loss, op)
    _kernel("cross_entropy_forward", dtype)[row_blocks(rows), row_threads(C), stream()](
        as_input(x), as_input(target), as_input(w_arr), has_w, int(ignore_index),
        dtype.type(smoothing), loss, lse)
    return loss, lse


@register("cross_entropy_backward", "cuda")
def cross_entropy_backward(g, x, target, w, ignore_index, smoothing, lse):
    op = "cross_entropy_backward"
    _check_rows(x, target, op)
    dtype = check_float(x, op)
    x = contiguous(x)
    rows, C = x.shape
    dx = empty((rows, C), dtype, x)
    if rows == 0:
        return dx
    g = _per_row(g, rows, dtype, x, op, "g")
    lse = _per_row(lse, rows, dtype, x, op, "lse")
    target = table(target, np.int64, x)
    w_arr, has_w = _weight(w, C, dtype, lse, op)
    _kernel("cross_entropy_backward", dtype)[row_blocks(rows), row_threads(C), stream()](
        as_input(g), as_input(x), as_input(target), as_input(w_arr), has_w, int(ignore_index),
        dtype.type(smoothing), as_input(lse), dx)
    return dx


@register("nll_loss", "cuda")
def nll_loss(x, target, w, ignore_index):
    """x (M, C) log-probabilities -> per-row -w[t] * x[t] (0 where ignored)."""
    op = "nll_loss"
    _check_rows(x, target, op)
    dtype = check_float(x, op)
    rows, C = x.shape
    loss = empty(rows, dtype, x)
    if rows == 0:
        return loss
    shape, strides, _ = layout.describe(x)
    span, off = layout.span(x, shape, strides, dtype)
    row_st, col_st = layout.element_strides(shape, strides, dtype, shape, "x")
    target = table(target, np.int64, loss)
    w_arr, has_w = _weight(w, C, dtype, loss, op)
    blocks, threads = launch_config(rows)
    _kernel("nll_forward", dtype)[blocks, threads, stream()](
        as_input(span), off, row_st, col_st, C, as_input(target), as_input(w_arr), has_w,
        int(ignore_index), loss)
    return loss


@register("nll_loss_backward", "cuda")
def nll_loss_backward(g, target, w, ignore_index, C):
    op = "nll_loss_backward"
    dtype = check_float(g, op, "g")
    M = target.shape[0] if len(target.shape) == 1 else -1
    if M < 0 or g.size != M:
        raise ValueError(f"nll_loss_backward: g and target must have one element per row, "
                         f"got g {tuple(g.shape)} and target {tuple(target.shape)}")
    if np.dtype(target.dtype).kind not in "iu":
        raise TypeError(f"{op}: target must hold integer class indices, got {target.dtype}")
    dx = empty((M, int(C)), dtype, g)
    if dx.size == 0:
        return dx
    g = table(g, dtype, dx).reshape(M)
    target = table(target, np.int64, dx)
    w_arr, has_w = _weight(w, C, dtype, g, op)
    blocks, threads = launch_config(M * C)
    _kernel("nll_backward", dtype)[blocks, threads, stream()](
        as_input(g), as_input(target), as_input(w_arr), has_w, int(ignore_index), dx)
    return dx


def _strided_operand(a, dtype, out_shape, what):
    shape, strides, dt = layout.describe(a)
    if dt != dtype:
        raise TypeError(f"bce_with_logits: {what} must have x's dtype {dtype}, got {dt}")
    view, off = layout.span(a, shape, strides, dt)
    return view, off, layout.element_strides(shape, strides, dt, out_shape, what)


def _layout(out_shape, operands):
    """Coalesced shape and per-operand strides; at least one dim for the kernels."""
    out_st = [int(np.prod(out_shape[d + 1:], dtype=np.int64)) for d in range(len(out_shape))]
    shape, strides = layout.coalesce(list(out_shape), [out_st] + [st for _, _, st in operands])
    if not shape:
        return (1,), [(0,)] * len(operands)
    return shape, strides[1:]


@register("bce_with_logits", "cuda")
def bce_with_logits(x, y, pos_weight):
    """Unweighted elementwise loss (1-y)*x + (1 + (pw-1)*y) * softplus(-x) over the
    broadcast shape of x, y and pos_weight, and softplus(-x) (x's shape)."""
    dtype = check_float(x, "bce_with_logits")
    arrays = [x, y] + ([] if pos_weight is None else [pos_weight])
    out_shape = tuple(np.broadcast_shapes(*(tuple(a.shape) for a in arrays)))
    loss = empty(out_shape, dtype, x)
    sp = empty(tuple(x.shape), dtype, x)
    n = math.prod(out_shape)
    if n == 0:
        return loss, sp
    ops = [_strided_operand(a, dtype, out_shape, what)
           for a, what in zip(arrays, ("x", "y", "pos_weight"))]
    if pos_weight is None:
        ops.append((ops[1][0], 0, [0] * len(out_shape)))      # never read
    shape, (x_st, y_st, pw_st) = _layout(out_shape, ops)
    write_sp = tuple(x.shape) == out_shape
    blocks, threads = launch_config(n)
    _kernel("bce_with_logits", dtype)[blocks, threads, stream()](
        loss.reshape(n), n, shape, as_input(ops[0][0]), x_st, ops[0][1], as_input(ops[1][0]),
        y_st, ops[1][1], as_input(ops[2][0]), pw_st, ops[2][1], pos_weight is not None,
        sp.reshape(-1), write_sp)
    if not write_sp and sp.size:      # x was broadcast: softplus over x's own elements
        xs = tuple(x.shape)
        op_x = _strided_operand(x, dtype, xs, "x")
        shape, (x_st,) = _layout(xs, [op_x])
        blocks, threads = launch_config(sp.size)
        _kernel("softplus_neg", dtype)[blocks, threads, stream()](
            sp.reshape(-1), sp.size, shape, as_input(op_x[0]), x_st, op_x[1])
    return loss, sp
