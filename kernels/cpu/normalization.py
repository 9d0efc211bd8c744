"""layer_norm, rms_norm, add_layer_norm and batch_norm kernels (numba),
forward and fused backward.

Statistics accumulate in float64 (two passes: mean, then squared deviations),
so float32 inputs with a large mean lose no precision; the forward saves mean
and rstd = 1/sqrt(var + eps) for the backward, which then needs one pass for
the two row (or channel) sums and one for dx.

* ``rms_norm``: y = x * rstd * w with rstd = 1/sqrt(mean(x^2) + eps) (no
  mean is subtracted, so one float64 pass gives the statistic); the backward
  needs one row sum, of g*w*xhat.
* ``add_layer_norm``: s = x + residual and layer_norm(s) in one pass over the
  rows, writing both (a pre-LN transformer keeps s as its residual stream).
  Its backward is layer_norm's with the gradient of s added into dx in the
  same kernel (``g_sum``), since both inputs of the sum get that one gradient.
* ``batch_norm_add_relu``: relu(batch_norm(x) + addend), the tail of a ResNet
  block, in one pass; its backward takes the relu mask from the output
  (y > 0) inline and gives the addend's gradient and batch_norm's backward
  of the masked gradient in batch_norm_backward's two passes.

layer_norm, rms_norm and add_layer_norm work on (rows, n) with normalized
dims flattened last; batch_norm on (N, C, S) with every dim after C flattened
into S.
"""
import math

import numpy as np
from numba import prange

from ..registry import register
from .twin import row_chunks, twin

# reassociation lets LLVM vectorize the sums (no 'nnan'/'ninf': NaN stays NaN)
JIT = dict(nogil=True, cache=True, error_model="numpy",
           fastmath={"nsz", "arcp", "contract", "reassoc"})


# ------------------------------------------------------------------ layer_norm
@twin(**JIT)
def _layer_norm_forward(x, w, b, eps, out, mean, rstd):
    rows, n = x.shape
    for i in prange(rows):
        s = 0.0
        for j in range(n):
            s += x[i, j]
        mu = s / n
        v = 0.0
        for j in range(n):
            d = x[i, j] - mu
            v += d * d
        r = 1.0 / math.sqrt(v / n + eps)
        mean[i] = mu
        rstd[i] = r
        mu_x, r_x = x.dtype.type(mu), x.dtype.type(r)   # apply in x's precision (SIMD width)
        for j in range(n):
            out[i, j] = (x[i, j] - mu_x) * r_x * w[j] + b[j]


@twin(**JIT)
def _add_layer_norm_forward(x, res, w, b, eps, out, s, mean, rstd):
    """s = x + res (rounded to x's dtype, as the unfused add), then layer_norm of s."""
    rows, n = x.shape
    for i in prange(rows):
        t = 0.0
        for j in range(n):
            v = x[i, j] + res[i, j]
            s[i, j] = v
            t += v
        mu = t / n
        v = 0.0
        for j in range(n):
            d = s[i, j] - mu
            v += d * d
        r = 1.0 / math.sqrt(v / n + eps)
        mean[i] = mu
        rstd[i] = r
        mu_x, r_x = x.dtype.type(mu), x.dtype.type(r)
        for j in range(n):
            out[i, j] = (s[i, j] - mu_x) * r_x * w[j] + b[j]


@twin(**JIT)
def _layer_norm_backward(g, x, mean, rstd, w, gs, has_gs, dx, dw_parts, db_parts):
    """dx = rstd * (g*w - mean(g*w) - xhat * mean(g*w*xhat)) (+ gs when has_gs: the
    gradient reaching x by another path, added while the row is still in cache);
    dw, db summed per chunk."""
    rows, n = x.shape
    chunks = dw_parts.shape[0]
    per = (rows + chunks - 1) // chunks
    for c in prange(chunks):
        dw = dw_parts[c]
        db = db_parts[c]
        for i in range(c * per, min(rows, (c + 1) * per)):
            mu, r = mean[i], rstd[i]
            a = 0.0
            bsum = 0.0
            for j in range(n):
                xhat = (x[i, j] - mu) * r
                gw = g[i, j] * w[j]
                a += gw
                bsum += gw * xhat
                dw[j] += g[i, j] * xhat
                db[j] += g[i, j]
            a /= n
            bsum /= n
            for j in range(n):
                xhat = (x[i, j] - mu) * r
                dx[i, j] = r * (g[i, j] * w[j] - a - xhat * bsum)
            if has_gs:
                for j in range(n):
                    dx[i, j] += gs[i, j]


@twin(**JIT)
def _rms_norm_forward(x, w, eps, out, rstd):
    rows, n = x.shape
    for i in prange(rows):
        q = 0.0
        for j in range(n):
            q += x[i, j] * x[i, j]
        r = 1.0 / math.sqrt(q / n + eps)
        rstd[i] = r
        r_x = x.dtype.type(r)   # apply in x's precision (SIMD width)
        for j in range(n):
            out[i, j] = x[i, j] * r_x * w[j]


@twin(**JIT)
def _rms_norm_backward(g, x, rstd, w, dx, dw_parts):
    """dx = rstd * (g*w - xhat * mean(g*w*xhat)); dw summed per chunk."""
    rows, n = x.shape
    chunks = dw_parts.shape[0]
    per = (rows + chunks - 1) // chunks
    for c in prange(chunks):
        dw = dw_parts[c]
        for i in range(c * per, min(rows, (c + 1) * per)):
            r = rstd[i]
            bsum = 0.0
            for j in range(n):
                xhat = x[i, j] * r
                bsum += g[i, j] * w[j] * xhat
                dw[j] += g[i, j] * xhat
            bsum /= n
            for j in range(n):
                dx[i, j] = r * (g[i, j] * w[j] - x[i, j] * r * bsum)


@register("layer_norm", "cpu")
def layer_norm(x, w, b, eps):
    """x: (rows, n); w, b: (n,) or None.  Returns out, mean (rows,), rstd (rows,)."""
    x = np.ascontiguousarray(x)
    rows, n = x.shape
    w = np.ones(n, x.dtype) if w is None else np.ascontiguousarray(w).reshape(n)
    b = np.zeros(n, x.dtype) if b is None else np.ascontiguousarray(b).reshape(n)
    out = np.empty_like(x)
    mean, rstd = np.empty(rows, x.dtype), np.empty(rows, x.dtype)
    _layer_norm_forward(x, w, b, float(eps), out, mean, rstd)
    return out, mean, rstd


@register("layer_norm_backward", "cpu")
def layer_norm_backward(g, x, mean, rstd, w):
    """Returns dx (rows, n), dw (n,), db (n,)."""
    return _layer_norm_dx_dw_db(g, None, x, mean, rstd, w)


def _layer_norm_dx_dw_db(g, g_sum, x, mean, rstd, w):
    g, x = np.ascontiguousarray(g), np.ascontiguousarray(x)
    rows, n = x.shape
    w = np.ones(n, x.dtype) if w is None else np.ascontiguousarray(w).reshape(n)
    dx = np.empty_like(x)
    has_gs = g_sum is not None
    gs = np.ascontiguousarray(g_sum, x.dtype) if has_gs else dx   # dx: never read
    chunks = row_chunks(rows)
    dw_parts, db_parts = np.zeros((chunks, n)), np.zeros((chunks, n))
    if rows:
        _layer_norm_backward(g, x, mean, rstd, w, gs, has_gs, dx, dw_parts, db_parts)
    return dx, dw_parts.sum(0).astype(x.dtype), db_parts.sum(0).astype(x.dtype)


# ------------------------------------------------------------------ add_layer_norm
@register("add_layer_norm", "cpu")
def add_layer_norm(x, res, w, b, eps):
    """x, res: (rows, n) of one dtype; w, b: (n,) or None.  Returns out, s = x + res,
    mean (rows,), rstd (rows,) of s."""
    x, res = np.ascontiguousarray(x), np.ascontiguousarray(res, x.dtype)
    rows, n = x.shape
    w = np.ones(n, x.dtype) if w is None else np.ascontiguousarray(w).reshape(n)
    b = np.zeros(n, x.dtype) if b is None else np.ascontiguousarray(b).reshape(n)
    out, s = np.empty_like(x), np.empty_like(x)
    mean, rstd = np.empty(rows, x.dtype), np.empty(rows, x.dtype)
    _add_layer_norm_forward(x, res, w, b, float(eps), out, s, mean, rstd)
    return out, s, mean, rstd


@register("add_layer_norm_backward", "cpu")
def add_layer_norm_backward(g, g_sum, s, mean, rstd, w):
    """g: gradient of out; g_sum: gradient of s, or None.  Returns ds (rows, n), the
    gradient of s from both outputs (that of x and of res), dw (n,), db (n,)."""
    return _layer_norm_dx_dw_db(g, g_sum, s, mean, rstd, w)


# ------------------------------------------------------------------ rms_norm
@register("rms_norm", "cpu")
def rms_norm(x, w, eps):
    """x: (rows, n); w: (n,) or None.  Returns out, rstd (rows,)."""
    x = np.ascontiguousarray(x)
    rows, n = x.shape
    w = np.ones(n, x.dtype) if w is None else np.ascontiguousarray(w).reshape(n)
    out = np.empty_like(x)
    rstd = np.empty(rows, x.dtype)
    _rms_norm_forward(x, w, float(eps), out, rstd)
    return out, rstd


@register("rms_norm_backward", "cpu")
def rms_norm_backward(g, x, rstd, w):
    """Returns dx (rows, n), dw (n,)."""
    g, x = np.ascontiguousarray(g), np.ascontiguousarray(x)
    rows, n = x.shape
    w = np.ones(n, x.dtype) if w is None else np.ascontiguousarray(w).reshape(n)
    dx = np.empty_like(x)
    chunks = row_chunks(rows)
    dw_parts = np.zeros((chunks, n))
    if rows:
        _rms_norm_backward(g, x, rstd, w, dx, dw_parts)
    return dx, dw_parts.sum(0).astype(x.dtype)


# ------------------------------------------------------------------ batch_norm
@twin(**JIT)
def _channel_stats(x, mean, var):
    """Per-channel mean and biased variance of x (N, C, S)."""
    N, C, S = x.shape
    m = N * S
    for c in prange(C):
        s = 0.0
        for i in range(N):
            for k in range(S):
                s += x[i, c, k]
        mu = s / m
        v = 0.0
        for i in range(N):
            for k in range(S):
                d = x[i, c, k] - mu
                v += d * d
        mean[c] = mu
        var[c] = v / m


@twin(**JIT)
def _channel_affine(x, scale, shift, out):
    """out = x * scale[c] + shift[c]."""
    N, C, S = x.shape
    for p in prange(N * C):
        i, c = p // C, p % C
        a, b = scale[c], shift[c]
        for k in range(S):
            out[i, c, k] = x[i, c, k] * a + b


@twin(**JIT)
def _batch_norm_backward(g, x, mean, rstd, w, training, dx, dw, db):
    N, C, S = x.shape
    m = N * S
    for c in prange(C):
        mu, r = mean[c], rstd[c]
        sg = 0.0
        sgx = 0.0
        for i in range(N):
            for k in range(S):
                sg += g[i, c, k]
                sgx += g[i, c, k] * (x[i, c, k] - mu)
        dw[c] = sgx * r
        db[c] = sg
        wr = w[c] * r
        if training:   # the batch statistics depend on x too
            a = sg / m
            bb = sgx * r / m
            for i in range(N):
                for k in range(S):
                    xhat = (x[i, c, k] - mu) * r
                    dx[i, c, k] = wr * (g[i, c, k] - a - xhat * bb)
        else:
            for i in range(N):
                for k in range(S):
                    dx[i, c, k] = wr * g[i, c, k]


@register("batch_norm_stats", "cpu")
def batch_norm_stats(x):
    """x: (N, C, S).  Returns per-channel mean and biased variance in x's dtype."""
    x = np.ascontiguousarray(x)
    C = x.shape[1]
    mean, var = np.empty(C, np.float64), np.empty(C, np.float64)
    _channel_stats(x, mean, var)
    return mean.astype(x.dtype), var.astype(x.dtype)


@register("batch_norm_apply", "cpu")
def batch_norm_apply(x, mean, rstd, w, b):
    """(x - mean) * rstd * w + b per channel of x (N, C, S); w, b may be None."""
    x = np.ascontiguousarray(x)
    scale = rstd.astype(np.float64) * (1.0 if w is None else w)
    shift = (0.0 if b is None else b) - mean * scale
    out = np.empty_like(x)
    _channel_affine(x, scale.astype(x.dtype), np.asarray(shift, x.dtype), out)
    return out


@register("batch_norm_backward", "cpu")
def batch_norm_backward(g, x, mean, rstd, w, training):
    """Returns dx (N, C, S), dw (C,), db (C,)."""
    g, x = np.ascontiguousarray(g), np.ascontiguousarray(x)
    C = x.shape[1]
    w = np.ones(C, x.dtype) if w is None else np.ascontiguousarray(w)
    dx = np.empty_like(x)
    dw, db = np.empty(C, np.float64), np.empty(C, np.float64)
    _batch_norm_backward(g, x, mean, rstd, w, bool(training), dx, dw, db)
    return dx, dw.astype(x.dtype), db.astype(x.dtype)


# ------------------------------------------------------------------ batch_norm_add_relu
# The apply kernel has no reduction: no 'reassoc', so LLVM cannot regroup
# (x * a + b) + addend as x * a + (b + addend) and the result stays that of
# batch_norm_apply, then add, then relu, op by op.
APPLY_JIT = dict(nogil=True, cache=True, error_model="numpy", fastmath={"nsz", "arcp", "contract"})


@twin(**APPLY_JIT)
def _channel_affine_add_relu(x, scale, shift, addend, has_addend, zero, out):
    """out = relu(x * scale[c] + shift[c] + addend) (addend only if has_addend)."""
    N, C, S = x.shape
    for p in prange(N * C):
        i, c = p // C, p % C
        a, b = scale[c], shift[c]
        if has_addend:
            for k in range(S):
                v = x[i, c, k] * a + b
                v = v + addend[i, c, k]
                out[i, c, k] = zero if v < zero else v      # relu: NaN and -0.0 pass
        else:
            for k in range(S):
                v = x[i, c, k] * a + b
                out[i, c, k] = zero if v < zero else v


@twin(**JIT)
def _batch_norm_add_relu_backward(g, y, x, mean, rstd, w, training, has_da, zero, dx, da, dw, db):
    """batch_norm's backward of gm = g where y > 0 (relu's threshold_backward),
    gm computed inline.  has_da: gm is also written to da (the addend's gradient)
    in the first pass and read back in the second; otherwise recomputed there."""
    N, C, S = x.shape
    m = N * S
    for c in prange(C):
        mu, r = mean[c], rstd[c]
        sg = 0.0
        sgx = 0.0
        if has_da:
            for i in range(N):
                for k in range(S):
                    gm = zero if y[i, c, k] <= zero else g[i, c, k]
                    da[i, c, k] = gm
                    sg += gm
                    sgx += gm * (x[i, c, k] - mu)
        else:
            for i in range(N):
                for k in range(S):
                    gm = zero if y[i, c, k] <= zero else g[i, c, k]
                    sg += gm
                    sgx += gm * (x[i, c, k] - mu)
        dw[c] = sgx * r
        db[c] = sg
        wr = w[c] * r
        if training:   # the batch statistics depend on x too
            a = sg / m
            bb = sgx * r / m
            if has_da:
                for i in range(N):
                    for k in range(S):
                        xhat = (x[i, c, k] - mu) * r
                        dx[i, c, k] = wr * (da[i, c, k] - a - xhat * bb)
            else:
                for i in range(N):
                    for k in range(S):
                        gm = zero if y[i, c, k] <= zero else g[i, c, k]
                        xhat = (x[i, c, k] - mu) * r
                        dx[i, c, k] = wr * (gm - a - xhat * bb)
        elif has_da:
            for i in range(N):
                for k in range(S):
                    dx[i, c, k] = wr * da[i, c, k]
        else:
            for i in range(N):
                for k in range(S):
                    gm = zero if y[i, c, k] <= zero else g[i, c, k]
                    dx[i, c, k] = wr * gm


@register("batch_norm_add_relu_apply", "cpu")
def batch_norm_add_relu_apply(x, addend, mean, rstd, w, b):
    """relu((x - mean) * rstd * w + b + addend) per channel of x (N, C, S) in one
    pass; addend (N, C, S) or None, w, b may be None.  The same arithmetic as
    batch_norm_apply, then the add, then relu."""
    x = np.ascontiguousarray(x)
    scale = rstd.astype(np.float64) * (1.0 if w is None else w)
    shift = (0.0 if b is None else b) - mean * scale
    has_addend = addend is not None
    if has_addend and tuple(addend.shape) != x.shape:
        raise ValueError(f"batch_norm_add_relu_apply: addend must have the shape of x "
                         f"{x.shape}, got {tuple(addend.shape)}")
    addend = np.ascontiguousarray(addend, x.dtype) if has_addend else x   # x: never read
    out = np.empty_like(x)
    _channel_affine_add_relu(x, scale.astype(x.dtype), np.asarray(shift, x.dtype), addend,
                             has_addend, x.dtype.type(0), out)
    return out


@register("batch_norm_add_relu_backward", "cpu")
def batch_norm_add_relu_backward(g, y, x, mean, rstd, w, training, addend_grad):
    """g: gradient of out = relu(batch_norm(x) + addend); y: out.  Returns dx (N, C, S),
    d_addend (N, C, S: g where y > 0; None unless addend_grad), dw (C,), db (C,)."""
    g, y, x = np.ascontiguousarray(g), np.ascontiguousarray(y), np.ascontiguousarray(x)
    C = x.shape[1]
    w = np.ones(C, x.dtype) if w is None else np.ascontiguousarray(w)
    dx = np.empty_like(x)
    da = np.empty_like(x) if addend_grad else dx      # dx: never written through da
    dw, db = np.empty(C, np.float64), np.empty(C, np.float64)
    _batch_norm_add_relu_backward(g, y, x, mean, rstd, w, bool(training), bool(addend_grad),
                                  x.dtype.type(0), dx, da, dw, db)
    return dx, da if addend_grad else None, dw.astype(x.dtype), db.astype(x.dtype)
